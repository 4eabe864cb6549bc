rule runtime:
    """Time workloads (prefill, decode, train step) under runtime options, and break the
    default conditions' time down by module, on this machine (docs/runtime.md)."""
    wildcard_constraints:
        device=MEASURED,
    input:
        params=lambda wc: [PARAMS["runtime"], PARAMS["measure"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        archs=rules.sample_archs.output[0],
    output:
        runtime=layout.runtime_table("{scale}", "{device}"),
        breakdown=layout.breakdown_table("{scale}", "{device}"),
    params:
        files=params_flags,
        vocab=vocab_flag,
    threads: workflow.cores  # alone on the machine: concurrent jobs would distort timings
    resources:
        **measure_resources(),  # on a cluster: the node of cluster.devices[{device}]
    log:
        layout.log("{scale}", "runtime-{device}"),
    shell:
        "hwgptbench runtime --scale {wildcards.scale} {params.files} {params.vocab}"
        " --archs {input.archs} --device {wildcards.device} --out {output.runtime}"
        " --breakdown-out {output.breakdown} 2>&1 | tee {log}"


rule runtime_merged:
    """The runtime and breakdown tables of every device of a scale, one table each."""
    input:
        runtime=lambda wc: runtime_tables(wc.scale),
        breakdown=lambda wc: breakdown_tables(wc.scale),
    output:
        runtime=layout.runtime("{scale}"),
        breakdown=layout.breakdown("{scale}"),
    params:
        # DVC outputs (results/{scale}/runtime, breakdown): made even when no device has a table
        dirs=lambda wc: [layout.runtime_tables(wc.scale), layout.breakdown_tables(wc.scale)],
    log:
        layout.log("{scale}", "runtime_merged"),
    shell:
        "mkdir -p {params.dirs} &&"
        " hwgptbench merge-runtime --out {output.runtime} --breakdown-out {output.breakdown}"
        " --runtime {input.runtime} --breakdown {input.breakdown} 2>&1 | tee {log}"
