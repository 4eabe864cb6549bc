rule data:
    """Train the tokenizer on the corpus and write train/val token shards."""
    input:
        code=code("data"),
        params=PARAMS["data"],
        corpus=corpus_files(SETTINGS.data.corpus),
    output:
        directory(DATA_DIR),
    params:
        files=params_flags,
    log:
        layout.log("data"),
    shell:
        "hwgptbench data {params.files:q} --out {output:q} 2>&1 | tee {log:q}"
