rule runtime:
    """Time workloads (prefill, decode, train step) under runtime options, break the default
    conditions' time down by module, sweep serving batch sizes and run the data-parallel
    train step (DDP, ZeRO-1/2/3 under torchrun), on this machine (docs/runtime.md)."""
    wildcard_constraints:
        device=MEASURED,
    input:
        code=code("runtime"),
        params=lambda wc: [PARAMS["runtime"], PARAMS["measure"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        archs=rules.sample_archs.output[0],
    output:
        runtime=layout.runtime_table("{scale}", "{device}"),
        breakdown=layout.breakdown_table("{scale}", "{device}"),
        serving=layout.serving_table("{scale}", "{device}"),
        parallel=layout.parallel_table("{scale}", "{device}"),
    params:
        files=params_flags,
        vocab=vocab_flag,
    threads: workflow.cores  # alone on the machine: concurrent jobs would distort timings
    resources:
        **measure_resources(),  # on a cluster: the node of cluster.devices[{device}]
    log:
        layout.log("{scale}", "runtime-{device}"),
    shell:
        "hwgptbench runtime --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " --archs {input.archs:q} --device {wildcards.device:q} --out {output.runtime:q}"
        " --breakdown-out {output.breakdown:q} --serving-out {output.serving:q}"
        " --parallel-out {output.parallel:q} 2>&1 | tee {log:q}"


rule runtime_merged:
    """The runtime, breakdown, serving and parallel tables of every device of a scale, one
    table each."""
    input:
        code=code("runtime_merged"),
        runtime=lambda wc: runtime_tables(wc.scale),
        breakdown=lambda wc: beside_runtime_tables(layout.breakdown_table, wc.scale),
        serving=lambda wc: beside_runtime_tables(layout.serving_table, wc.scale),
        parallel=lambda wc: beside_runtime_tables(layout.parallel_table, wc.scale),
    output:
        runtime=layout.runtime("{scale}"),
        breakdown=layout.breakdown("{scale}"),
        serving=layout.serving("{scale}"),
        parallel=layout.parallel("{scale}"),
    params:
        # DVC outputs (results/{scale}/runtime, ...): made even when no device has a table
        dirs=lambda wc: [layout.runtime_tables(wc.scale), layout.breakdown_tables(wc.scale),
                         layout.serving_tables(wc.scale), layout.parallel_tables(wc.scale)],
    log:
        layout.log("{scale}", "runtime_merged"),
    shell:
        "mkdir -p {params.dirs:q} &&"
        " hwgptbench merge-runtime --out {output.runtime:q} --breakdown-out {output.breakdown:q}"
        " --serving-out {output.serving:q} --parallel-out {output.parallel:q}"
        " --runtime {input.runtime:q} --breakdown {input.breakdown:q} --serving {input.serving:q}"
        " --parallel {input.parallel:q} 2>&1 | tee {log:q}"
