rule transfer:
    """Leave-one-target-out quality of few-shot transfer of the hardware surrogates of a scale:
    every measured (device, condition) held out in turn, adapted from k of its archs."""
    input:
        params=lambda wc: [PARAMS["transfer"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        measurements=rules.measurements.output[0],
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
