rule surrogates_perplexity:
    """Fit and cross-validate the perplexity surrogates of a scale."""
    input:
        code=code("surrogates_perplexity"),
        params=lambda wc: [PARAMS["surrogate"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        perplexity=rules.perplexity.output[0],
    output:
        directory(layout.perplexity_surrogates("{scale}")),
    params:
        files=params_flags,
        vocab=vocab_flag,
    threads: workflow.cores
    log:
        layout.log("{scale}", "surrogates_perplexity"),
    shell:
        "hwgptbench fit-surrogates --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " --perplexity {input.perplexity:q} --out {output:q} 2>&1 | tee {log:q}"


rule surrogates_device:
    """Fit and cross-validate the hardware surrogates of one device of a scale."""
    input:
        code=code("surrogates_device"),
        params=lambda wc: [PARAMS["surrogate"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        measurements=lambda wc: device_table(wc.scale, wc.device),
        runtime=lambda wc: runtime_tables(wc.scale, wc.device),
    output:
        directory(layout.device_surrogates("{scale}", "{device}")),
    params:
        files=params_flags,
        vocab=vocab_flag,
    threads: workflow.cores
    log:
        layout.log("{scale}", "surrogates-{device}"),
    shell:
        "hwgptbench fit-surrogates --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " --measurements {input.measurements:q} --runtime {input.runtime:q} --out {output:q}"
        " 2>&1 | tee {log:q}"


rule surrogate_quality:
    """The quality table of all surrogates of a scale, its DVC metrics file, and the merged
    out-of-fold predictions behind it."""
    input:
        code=code("surrogate_quality"),
        perplexity=rules.surrogates_perplexity.output[0],
        devices=lambda wc: [layout.device_surrogates(wc.scale, device)
                            for device in device_labels(wc.scale)],
    output:
        table=layout.quality("{scale}"),
        predictions=layout.predictions("{scale}"),
        metrics=layout.surrogate_metrics("{scale}"),
    params:
        tables=lambda wc, input: [f"{d}/quality.parquet"
                                  for d in [input.perplexity, *input.devices]],
    log:
        layout.log("{scale}", "surrogate_quality"),
    shell:
        "hwgptbench merge-quality --scale {wildcards.scale:q} --out {output.table:q}"
        " --metrics-out {output.metrics:q} {params.tables:q} 2>&1 | tee {log:q}"
