SEARCH = SETTINGS.search
SEARCH_DEVICES = resolve_devices(SEARCH.devices)
for scale in SCALES:
    missing = sorted(set(SEARCH_DEVICES) - set(device_labels(scale)))
    if missing:
        raise WorkflowError(
            f"search.devices: {missing} of scale {scale} have no measurement table: measure them "
            f"(workflow.devices) or publish them (devices/{scale}/); devices with a table: "
            f"{', '.join(device_labels(scale)) or 'none'}")


rule search_reference:
    """Scaling, reference point and reference Pareto front of an objective set on a device."""
    input:
        unpack(search_inputs),
        code=code("search_reference"),
    output:
        directory(layout.search_reference("{scale}", "{objectives}", "{device}")),
    params:
        files=params_flags,
        results=results_folder,
    log:
        layout.log("{scale}", "search-{objectives}-{device}-reference"),
    shell:
        "hwgptbench search-reference --scale {wildcards.scale:q} {params.files:q}"
        " --results {params.results:q} --objectives {wildcards.objectives:q}"
        " --device {wildcards.device:q} --out {output:q} 2>&1 | tee {log:q}"


rule search:
    """All seeds of one algorithm on an objective set and device (one job: a small DAG)."""
    input:
        unpack(search_inputs),
        code=code("search"),
        reference=rules.search_reference.output[0],
    output:
        directory(layout.search_runs("{scale}", "{objectives}", "{device}", "{algorithm}")),
    params:
        files=params_flags,
        results=results_folder,
    threads: 1
    log:
        layout.log("{scale}", "search-{objectives}-{device}-{algorithm}"),
    shell:
        "hwgptbench search --scale {wildcards.scale:q} {params.files:q}"
        " --results {params.results:q}"
        " --objectives {wildcards.objectives:q} --device {wildcards.device:q}"
        " --algorithm {wildcards.algorithm:q} --reference {input.reference:q}"
        " --threads {threads} --out {output:q} 2>&1 | tee {log:q}"


rule search_summary:
    """The final reference fronts (each reference united with every run's archive), the runs
    scored against them, final hypervolumes, per-algorithm summary, attainment surfaces, rank
    tests and the EAF difference of the best two algorithms."""
    input:
        code=code("search_summary"),
        params=PARAMS["search"],
        references=lambda wc: expand(rules.search_reference.output[0], scale=wc.scale,
                                     objectives=SEARCH.objectives, device=SEARCH_DEVICES),
        runs=lambda wc: expand(rules.search.output[0], scale=wc.scale,
                               objectives=SEARCH.objectives, device=SEARCH_DEVICES,
                               algorithm=SEARCH.algorithms),
    output:
        runs=layout.search_table("{scale}", "runs"),
        reference=layout.search_table("{scale}", "reference"),
        front=layout.search_table("{scale}", "front"),
        final=layout.search_table("{scale}", "final"),
        summary=layout.search_table("{scale}", "summary"),
        attainment=layout.search_table("{scale}", "attainment"),
        friedman=layout.search_table("{scale}", "friedman"),
        ranks=layout.search_table("{scale}", "ranks"),
        pairwise=layout.search_table("{scale}", "pairwise"),
        eafdiff=layout.search_table("{scale}", "eafdiff"),
        metrics=layout.search_metrics("{scale}"),
    params:
        files=params_flags,
    log:
        layout.log("{scale}", "search_summary"),
    shell:
        'hwgptbench search-summary {params.files:q} --out-dir "$(dirname {output.summary:q})"'
        " --metrics-out {output.metrics:q} {input.runs:q} --references {input.references:q}"
        " 2>&1 | tee {log:q}"
