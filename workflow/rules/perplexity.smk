rule perplexity:
    """Validation perplexity of the sampled archs with inherited supernet weights."""
    input:
        params=PARAMS["perplexity"],
        data=DATA_DIR,
        supernet=rules.supernet.output.model,
        snapshots=rules.supernet.output.snapshots,  # found by the command beside supernet.pt
        archs=rules.sample_archs.output[0],
    output:
        f"{RESULTS}/{{scale}}/perplexity.parquet",
    params:
        files=params_flags,
    threads: workflow.cores  # torch uses every core
    resources:
        **gpu_resources(config["perplexity"]["device"], 1),
    log:
        f"{RESULTS}/logs/{{scale}}/perplexity.log",
    shell:
        "hwgptbench perplexity --scale {wildcards.scale} {params.files} --data {input.data}"
        " --supernet {input.supernet} --archs {input.archs} --out {output} 2>&1 | tee {log}"
