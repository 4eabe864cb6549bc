# One-shot compression of a dense model, LLaMA-NAS style (docs/compress.md). Each rule reads
# only the compress entries it needs (results/.params/compress.{entry}.json).

COMPRESS = SETTINGS.compress.name  # its results: layout.compress(COMPRESS)


rule compress_dense:
    """The dense model: trained here (compress.source: pretrain; resumes) or imported from a
    local Hugging Face LLaMA-family checkpoint (huggingface)."""
    input:
        code=code("compress_dense"),
        params=compress_params("name", "source", "checkpoint", "allow_pickle_weights", "space",
                               "pretrain"),
        data=DATA_DIR,
    output:
        layout.dense(COMPRESS),
    params:
        files=params_flags,
        work_dir=layout.compress_work(COMPRESS, "dense"),
    threads: workflow.cores
    resources:
        **gpu_resources(SETTINGS.compress.pretrain.device, 1),
    log:
        layout.log("compress", "dense"),
    shell:
        "hwgptbench compress-dense {params.files:q} --data {input.data:q} --out {output:q}"
        " --work-dir {params.work_dir:q} 2>&1 | tee {log:q}"


rule compress_finetune:
    """Importance order, import into the supernet of compress.space, one sandwich fine-tune
    (resumes)."""
    input:
        code=code("compress_finetune"),
        params=compress_params("name", "space", "importance", "finetune"),
        data=DATA_DIR,
        dense=rules.compress_dense.output[0],
    output:
        model=layout.compress_supernet(COMPRESS),
        loss=layout.compress_loss(COMPRESS),
    params:
        files=params_flags,
        work_dir=layout.compress_work(COMPRESS, "finetune"),
    threads: workflow.cores
    resources:
        **gpu_resources(SETTINGS.compress.finetune.device, 1),
    log:
        layout.log("compress", "finetune"),
    shell:
        "hwgptbench compress-finetune {params.files:q} --data {input.data:q}"
        " --dense {input.dense:q}"
        ' --out "$(dirname {output.model:q})" --work-dir {params.work_dir:q} 2>&1 | tee {log:q}'


rule compress_search:
    """Sub-networks searched (NSGA-II, surrogate-assisted iterative), evaluated on held-out
    data and timed on this machine."""
    input:
        code=code("compress_search"),
        params=compress_params("evaluate", "timing", "search"),
        data=DATA_DIR,
        supernet=rules.compress_finetune.output.model,
    output:
        runs=layout.compress_result(COMPRESS, "search"),
        subnets=layout.compress_result(COMPRESS, "subnets"),
    params:
        files=params_flags,
    threads: workflow.cores  # timings: alone on the machine
    log:
        layout.log("compress", "search"),
    shell:
        "hwgptbench compress-search {params.files:q} --data {input.data:q}"
        " --supernet {input.supernet:q} --runs-out {output.runs:q} --subnets-out {output.subnets:q}"
        " 2>&1 | tee {log:q}"


rule compress_table:
    """Dense vs found sub-networks vs quantized vs pruning baselines at matched size: size,
    throughput, perplexity, accuracy, against the fine-tuned largest sub-network."""
    input:
        code=code("compress_table"),
        params=compress_params("evaluate", "timing", "search", "quantize", "table", "importance",
                               "finetune"),
        data=DATA_DIR,
        dense=rules.compress_dense.output[0],
        supernet=rules.compress_finetune.output.model,
        subnets=rules.compress_search.output.subnets,
    output:
        layout.compress_result(COMPRESS, "compress"),
    params:
        files=params_flags,
    threads: workflow.cores
    log:
        layout.log("compress", "table"),
    shell:
        "hwgptbench compress-table {params.files:q} --data {input.data:q} --dense {input.dense:q}"
        " --supernet {input.supernet:q} --subnets {input.subnets:q} --out {output:q}"
        " 2>&1 | tee {log:q}"


rule compress_seed:
    """Another fine-tune seed of the comparison (compress.seeds > 1): fine-tune, search and
    table again with the fine-tune's and search's seeds offset by the index (resumes)."""
    input:
        code=code("compress_seed"),
        params=compress_params("name", "space", "importance", "finetune", "evaluate", "timing",
                               "search", "quantize", "table", "seeds"),
        data=DATA_DIR,
        dense=rules.compress_dense.output[0],
    output:
        layout.compress_seed(COMPRESS, "{index}"),
    params:
        files=params_flags,
        work_dir=lambda wildcards: layout.compress_seed_work(COMPRESS, wildcards.index),
    threads: workflow.cores  # timings: alone on the machine
    resources:
        **gpu_resources(SETTINGS.compress.finetune.device, 1),
    log:
        layout.log("compress", "seed-{index}"),
    shell:
        "hwgptbench compress-seed {params.files:q} --seed-index {wildcards.index:q}"
        " --data {input.data:q} --dense {input.dense:q} --out {output:q}"
        " --work-dir {params.work_dir:q} 2>&1 | tee {log:q}"


rule compress_finetune_methods:
    """Full fine-tuning vs LoRA of the dense model, timed on this machine: trainable
    parameters, step time, peak memory (docs/runtime.md)."""
    input:
        code=code("compress_finetune_methods"),
        params=compress_params("timing", "finetune_methods"),
        dense=rules.compress_dense.output[0],
    output:
        layout.compress_result(COMPRESS, "finetune_methods"),
    params:
        files=params_flags,
    threads: workflow.cores  # timings: alone on the machine
    resources:
        **gpu_resources(SETTINGS.compress.finetune_methods.device, 1),
    log:
        layout.log("compress", "finetune_methods"),
    shell:
        "hwgptbench compress-finetune-methods {params.files:q} --dense {input.dense:q}"
        " --out {output:q} 2>&1 | tee {log:q}"


rule compress:
    """The compression figure and table, the search's edge over the baselines (over every
    fine-tune seed), and the fine-tuning methods' costs (`snakemake compress`)."""
    input:
        code=code("compress"),
        finetune_methods=rules.compress_finetune_methods.output[0],
        table=rules.compress_table.output[0],
        subnets=rules.compress_search.output.subnets,
        runs=rules.compress_search.output.runs,
        seeds=[layout.compress_seed(COMPRESS, str(i))
               for i in range(1, SETTINGS.compress.seeds)],
    output:
        figure=report(f"{layout.compress_figures(COMPRESS)}/compress.png", caption="../report/compress.rst",
                      category="Compression"),
        table=report(f"{layout.compress_figures(COMPRESS)}/table_compress.csv",
                     caption="../report/table_compress.rst", category="Compression"),
        edge=report(f"{layout.compress_figures(COMPRESS)}/table_compress_baselines.csv",
                    caption="../report/table_compress_baselines.rst", category="Compression"),
    log:
        layout.log("compress", "figures"),
    shell:
        "hwgptbench compress-figures --table {input.table:q} --subnets {input.subnets:q}"
        " --runs {input.runs:q} --seed-tables {input.seeds:q}"
        ' --out-dir "$(dirname {output.figure:q})"'
        " 2>&1 | tee {log:q}"
