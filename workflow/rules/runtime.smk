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
        runtime=f"{RESULTS}/{{scale}}/runtime/{{device}}.parquet",
        breakdown=f"{RESULTS}/{{scale}}/breakdown/{{device}}.parquet",
    params:
        files=params_flags,
        vocab=vocab_flag,
    threads: workflow.cores  # alone on the machine: concurrent jobs would distort timings
    resources:
        **measure_resources(),  # on a cluster: the node of cluster.devices[{device}]
    log:
        f"{RESULTS}/logs/{{scale}}/runtime-{{device}}.log",
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
        runtime=f"{RESULTS}/{{scale}}/runtime.parquet",
        breakdown=f"{RESULTS}/{{scale}}/breakdown.parquet",
    params:
        # DVC outputs (results/{scale}/runtime, breakdown): made even when no device has a table
        dirs=lambda wc: [f"{RESULTS}/{wc.scale}/runtime", f"{RESULTS}/{wc.scale}/breakdown"],
    log:
        f"{RESULTS}/logs/{{scale}}/runtime_merged.log",
    shell:
        "mkdir -p {params.dirs} &&"
        " hwgptbench merge-runtime --out {output.runtime} --breakdown-out {output.breakdown}"
        " --runtime {input.runtime} --breakdown {input.breakdown} 2>&1 | tee {log}"
