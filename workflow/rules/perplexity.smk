if IMPORTED:

    rule perplexity:
        """HW-GPT-Bench's published perplexities of a scale: `dvc import` of its files (each
        .dvc pointer pins the repository and the commit; files already there are kept), then
        their conversion to the perplexity table and an import report."""
        input:
            code=code("perplexity"),
            params=lambda wc: [PARAMS["perplexity"], PARAMS[f"spaces.{wc.scale}"]],
        output:
            table=layout.perplexity("{scale}"),
            report=layout.import_report("{scale}"),
        params:
            files=params_flags,
            source=(["--source-url", HWGPTBENCH.source_url] if HWGPTBENCH.source_url
                    else []),
            url=HWGPTBENCH.url,
            rev=HWGPTBENCH.rev,
            imported=HWGPTBENCH.files,
            vocab_size=HWGPTBENCH.vocab_size,
        resources:
            dvc=1,  # one `dvc import` at a time in the project (`--resources dvc=1`)
        log:
            layout.log("{scale}", "perplexity"),
        shell:
            "(hwgptbench fetch-hwgptbench --scale {wildcards.scale:q} --url {params.url:q}"
            " --rev {params.rev:q} --out {params.imported:q} &&"
            " hwgptbench import-perplexity --scale {wildcards.scale:q} {params.files:q}"
            " --files {params.imported:q} --rev {params.rev:q} {params.source:q}"
            " --vocab-size {params.vocab_size:q} --out {output.table:q}"
            " --report {output.report:q}) 2>&1 | tee {log:q}"

else:

    rule perplexity:
        """Validation perplexity of the sampled archs with inherited supernet weights."""
        input:
            code=code("perplexity"),
            params=PARAMS["perplexity"],
            data=DATA_DIR,
            supernet=rules.supernet.output.model,
            snapshots=rules.supernet.output.snapshots,  # found by the command beside supernet.pt
            archs=rules.sample_archs.output[0],
        output:
            layout.perplexity("{scale}"),
        params:
            files=params_flags,
        threads: workflow.cores  # torch uses every core
        resources:
            **gpu_resources(SETTINGS.perplexity.device, 1),
        log:
            layout.log("{scale}", "perplexity"),
        shell:
            "hwgptbench perplexity --scale {wildcards.scale:q} {params.files:q}"
            " --data {input.data:q} --supernet {input.supernet:q} --archs {input.archs:q}"
            " --out {output:q} 2>&1 | tee {log:q}"
