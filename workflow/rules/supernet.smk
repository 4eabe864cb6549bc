rule supernet:
    """Train the weight-sharing supernet of a scale with the sandwich rule (resumes from
    results/{scale}/.train/ when killed)."""
    input:
        code=code("supernet"),
        params=lambda wc: [PARAMS["supernet"], PARAMS[f"spaces.{wc.scale}"]],
        data=DATA_DIR,
    output:
        model=layout.supernet("{scale}"),
        loss=layout.loss_table("{scale}"),
        # the supernet after each of supernet.snapshots steps: the fidelities of perplexity
        snapshots=expand(layout.snapshot("{scale}", "{step}"),
                         step=SETTINGS.supernet.snapshots, allow_missing=True),
    params:
        files=params_flags,
        # supernet.processes > 1: one process per GPU under torchrun (batch_size is global)
        launcher=(["torchrun", "--standalone", "--nproc_per_node",
                   str(SETTINGS.supernet.processes), "-m", "hwgptbench.cli"]
                  if SETTINGS.supernet.processes > 1 else ["hwgptbench"]),
        work_dir=lambda wc: layout.train_work(wc.scale),
    threads: workflow.cores  # torch uses every core
    resources:
        **gpu_resources(SETTINGS.supernet.device, SETTINGS.supernet.processes),
    log:
        layout.log("{scale}", "supernet"),
    shell:
        "{params.launcher:q} train --scale {wildcards.scale:q} {params.files:q}"
        " --data {input.data:q}"
        ' --out "$(dirname {output.model:q})" --work-dir {params.work_dir:q}'
        " 2>&1 | tee {log:q}"


rule sample_archs:
    """Sample the architectures of a scale that are evaluated and measured (from the space, or
    from the imported perplexity table with perplexity.source hwgptbench)."""
    input:
        code=code("sample_archs"),
        params=lambda wc: [PARAMS["sample"], PARAMS[f"spaces.{wc.scale}"]],
        **DATA_INPUT,
        **({"table": layout.perplexity("{scale}")} if IMPORTED else {}),
    output:
        layout.archs("{scale}"),
    params:
        files=params_flags,
        vocab=vocab_flag,
        among=lambda wc, input: ["--from-table", input.table] if IMPORTED else [],
    log:
        layout.log("{scale}", "sample_archs"),
    shell:
        "hwgptbench sample --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " {params.among:q} --out {output:q} 2>&1 | tee {log:q}"
