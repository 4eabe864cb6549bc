# The compression's found archs written as runnable model files (docs/export.md): pt2, ONNX and
# Hugging Face where the arch fits, each checked for equal logits.


rule compress_export:
    """The Pareto sub-networks of export.pareto (and export.archs) of the compression's
    fine-tuned supernet, one folder each, with an index table."""
    input:
        code=code("compress_export"),
        params=[PARAMS["export"], *compress_params("name", "timing")],
        data=DATA_DIR,
        supernet=rules.compress_finetune.output.model,
        subnets=rules.compress_search.output.subnets,
    output:
        directory(layout.compress_export(COMPRESS)),
    params:
        files=params_flags,
    threads: workflow.cores  # the ONNX Runtime vs eager timings: alone on the machine
    log:
        layout.log("compress", "export"),
    shell:
        "hwgptbench export-pareto {params.files:q} --data {input.data:q}"
        " --supernet {input.supernet:q} --subnets {input.subnets:q} --out {output:q}"
        " 2>&1 | tee {log:q}"
