rule data:
    """Train the tokenizer on the corpus and write train/val token shards."""
    input:
        params=PARAMS["data"],
        corpus=corpus_files(config["data"]["corpus"]),
    output:
        directory(DATA_DIR),
    params:
        files=params_flags,
    log:
        layout.log("data"),
    shell:
        "hwgptbench data {params.files} --out {output} 2>&1 | tee {log}"
