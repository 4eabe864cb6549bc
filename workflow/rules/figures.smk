from hwgptbench.figures.catalog import FIGURES, TABLES

# imported perplexities come without a supernet, so without its training-loss figure
SCALE_FIGURES = [name for name in FIGURES if not (IMPORTED and name == "supernet_loss")]
PLOTS = ["hypervolume", "surrogate_predictions", *([] if IMPORTED else ["supernet_loss"])]


rule figures_of_scale:
    """Every figure, table and DVC plot file of a scale, from result tables only (no
    training, measuring or fitting: after `dvc pull` this is the only job)."""
    input:
        code=code("figures_of_scale"),
        perplexity=rules.perplexity.output[0],
        measurements=rules.measurements.output[0],
        runtime=rules.runtime_merged.output.runtime,
        breakdown=rules.runtime_merged.output.breakdown,
        serving=rules.runtime_merged.output.serving,
        parallel=rules.runtime_merged.output.parallel,
        quality=rules.surrogate_quality.output.table,
        predictions=rules.surrogate_quality.output.predictions,
        transfer=rules.transfer.output.quality,
        transfer_summary=rules.transfer.output.summary,
        **({} if IMPORTED else {"loss": rules.supernet.output.loss}),
        final=rules.search_summary.output.final,
        attainment=rules.search_summary.output.attainment,
        runs=rules.search_summary.output.runs,
        reference=rules.search_summary.output.reference,
        friedman=rules.search_summary.output.friedman,
        ranks=rules.search_summary.output.ranks,
        pairwise=rules.search_summary.output.pairwise,
        eafdiff=rules.search_summary.output.eafdiff,
    output:
        **{f"figure_{name}": figure_output(name) for name in SCALE_FIGURES},
        **{f"table_{name}": table_output(name) for name in TABLES},
        plots=[layout.plot("{scale}", name) for name in PLOTS],
    params:
        results=results_folder,
    log:
        layout.log("{scale}", "figures"),
    shell:
        "hwgptbench figures --scale {wildcards.scale:q} --results {params.results:q}"
        " 2>&1 | tee {log:q}"


rule figures:
    """The figures and tables of every configured scale (`snakemake figures`)."""
    input:
        expand(rules.figures_of_scale.output, scale=SCALES),
