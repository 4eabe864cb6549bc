# One-shot compression of a dense model, LLaMA-NAS style (docs/compress.md). Each rule reads
# only the compress entries it needs (results/.params/compress.{entry}.json).

COMPRESS = f"{RESULTS}/compress/{config['compress']['name']}"


rule compress_dense:
    """The dense model: trained here (compress.source: pretrain; resumes) or imported from a
    local Hugging Face LLaMA-family checkpoint (huggingface)."""
    input:
        params=compress_params("name", "source", "checkpoint", "allow_pickle_weights", "space",
                               "pretrain"),
        data=DATA_DIR,
    output:
        f"{COMPRESS}/dense.pt",
    params:
        files=params_flags,
        work_dir=f"{COMPRESS}/.dense",
    threads: workflow.cores
    resources:
        **gpu_resources(config["compress"]["pretrain"]["device"], 1),
    log:
        f"{RESULTS}/logs/compress/dense.log",
    shell:
        "hwgptbench compress-dense {params.files} --data {input.data} --out {output}"
        " --work-dir {params.work_dir} 2>&1 | tee {log}"


rule compress_finetune:
    """Importance order, import into the supernet of compress.space, one sandwich fine-tune
    (resumes)."""
    input:
        params=compress_params("name", "space", "importance", "finetune"),
        data=DATA_DIR,
        dense=rules.compress_dense.output[0],
    output:
        model=f"{COMPRESS}/supernet/supernet.pt",
        loss=f"{COMPRESS}/supernet/loss.parquet",
    params:
        files=params_flags,
        work_dir=f"{COMPRESS}/.finetune",
    threads: workflow.cores
    resources:
        **gpu_resources(config["compress"]["finetune"]["device"], 1),
    log:
        f"{RESULTS}/logs/compress/finetune.log",
    shell:
        "hwgptbench compress-finetune {params.files} --data {input.data} --dense {input.dense}"
        " --out $(dirname {output.model}) --work-dir {params.work_dir} 2>&1 | tee {log}"


rule compress_search:
    """Sub-networks searched (NSGA-II, surrogate-assisted iterative), evaluated on held-out
    data and timed on this machine."""
    input:
        params=compress_params("evaluate", "timing", "search"),
        data=DATA_DIR,
        supernet=rules.compress_finetune.output.model,
    output:
        runs=f"{COMPRESS}/search.parquet",
        subnets=f"{COMPRESS}/subnets.parquet",
    params:
        files=params_flags,
    threads: workflow.cores  # timings: alone on the machine
    log:
        f"{RESULTS}/logs/compress/search.log",
    shell:
        "hwgptbench compress-search {params.files} --data {input.data}"
        " --supernet {input.supernet} --runs-out {output.runs} --subnets-out {output.subnets}"
        " 2>&1 | tee {log}"


rule compress_table:
    """Dense vs found sub-networks vs quantized: size, throughput, perplexity, accuracy."""
    input:
        params=compress_params("evaluate", "timing", "search", "quantize", "table"),
        data=DATA_DIR,
        dense=rules.compress_dense.output[0],
        supernet=rules.compress_finetune.output.model,
        subnets=rules.compress_search.output.subnets,
    output:
        f"{COMPRESS}/compress.parquet",
    params:
        files=params_flags,
    threads: workflow.cores
    log:
        f"{RESULTS}/logs/compress/table.log",
    shell:
        "hwgptbench compress-table {params.files} --data {input.data} --dense {input.dense}"
        " --supernet {input.supernet} --subnets {input.subnets} --out {output} 2>&1 | tee {log}"


rule compress:
    """The compression figure and table (`snakemake compress`)."""
    input:
        table=rules.compress_table.output[0],
        subnets=rules.compress_search.output.subnets,
        runs=rules.compress_search.output.runs,
    output:
        figure=report(f"{COMPRESS}/figures/compress.png", caption="../report/compress.rst",
                      category="Compression"),
        table=report(f"{COMPRESS}/figures/table_compress.csv",
                     caption="../report/table_compress.rst", category="Compression"),
    log:
        f"{RESULTS}/logs/compress/figures.log",
    shell:
        "hwgptbench compress-figures --table {input.table} --subnets {input.subnets}"
        " --runs {input.runs} --out-dir $(dirname {output.figure}) 2>&1 | tee {log}"
