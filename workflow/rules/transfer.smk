# The package's manifest of shipped tables: the command reads it for every scale, and where the
# scale ships tables of two devices or more, it also evaluates transfer across those devices.
SHIPPED_MANIFEST = Path(layout.__file__).parent / "published" / "manifest.json"


rule transfer:
    """Leave-one-target-out quality of few-shot transfer of the hardware surrogates of a scale:
    every measured (device, condition) held out in turn, adapted from k of its archs; where
    the package ships the scale's tables of two devices or more, also across those devices."""
    input:
        code=code("transfer"),
        params=lambda wc: [PARAMS["transfer"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        measurements=rules.measurements.output[0],
        shipped=[str(SHIPPED_MANIFEST)] if SHIPPED_MANIFEST.exists() else [],
    output:
        quality=layout.transfer_quality("{scale}"),
        summary=layout.transfer_summary("{scale}"),
    params:
        files=params_flags,
        vocab=vocab_flag,
    log:
        layout.log("{scale}", "transfer"),
    shell:
        "hwgptbench transfer --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " --measurements {input.measurements:q} --out {output.quality:q}"
        " --summary-out {output.summary:q} 2>&1 | tee {log:q}"
