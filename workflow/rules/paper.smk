"""`snakemake paper` (`make paper`): the paper's multi-device figures and tables from the tables
shipped in the package, under results/paper/: the shipped tables' surrogates, the search at the
paper's budget against them (the search stage's commands with --source published), the
transfer on other projects' data where params name it, then every table and figure. No
training, measuring or network."""

from hwgptbench.figures.catalog import PAPER_SCALE_FIGURES, PAPER_SEARCH_FIGURES, PAPER_TABLES

PAPER = SETTINGS.paper
PAPER_RESULTS = layout.paper()
PAPER_SEARCH = PAPER.search
# the paper's search settings as the section file a search command reads (`search`)
PAPER_SEARCH_PARAMS = hwparams.write_sections({"search": config["paper"]["search"]},
                                              layout.paper_params())["search"]
EXTERNAL = PAPER.external
# its scales and search devices ship tables with the package, and paper.external names
# folders that are there: the Snakefile checks it (workflow_checks.check_workflow, as
# `hwgptbench validate` does)


rule paper_surrogates:
    """The surrogates of a scale's shipped tables, fitted once under results/paper/published/."""
    input:
        code=code("paper_surrogates"),
    output:
        layout.paper_surrogates("{paper_scale}"),
    wildcard_constraints:
        paper_scale="|".join(sorted({*PAPER.scales, PAPER.search_scale})),
    log:
        layout.log("paper", "surrogates-{paper_scale}"),
    shell:
        "hwgptbench paper-surrogates --scale {wildcards.paper_scale:q}"
        f" --results {PAPER_RESULTS} --out {{output:q}} 2>&1 | tee {{log:q}}"


PAPER_SEARCH_INPUTS = {
    "params": [PAPER_SEARCH_PARAMS, PARAMS["surrogate"]],
    "surrogates": layout.paper_surrogates(PAPER.search_scale),
}
PAPER_SEARCH_FLAGS = (f"--source published --scale {PAPER.search_scale}"
                      f" --results {PAPER_RESULTS}")


rule paper_search_reference:
    """Reference front of an objective set of the paper's search on a shipped device."""
    input:
        code=code("paper_search_reference"),
        **PAPER_SEARCH_INPUTS,
    output:
        directory(layout.paper_search_reference("{paper_objectives}", "{paper_device}")),
    wildcard_constraints:
        paper_objectives="|".join(PAPER_SEARCH.objective_sets),
        paper_device="|".join(PAPER_SEARCH.devices),
    params:
        files=params_flags,
    log:
        layout.log("paper", "search-{paper_objectives}-{paper_device}-reference"),
    shell:
        f"hwgptbench search-reference {PAPER_SEARCH_FLAGS} {{params.files:q}}"
        " --objectives {wildcards.paper_objectives:q} --device {wildcards.paper_device:q}"
        " --out {output:q} 2>&1 | tee {log:q}"


rule paper_search:
    """All seeds of one algorithm of the paper's search (one job, one core)."""
    input:
        code=code("paper_search"),
        **PAPER_SEARCH_INPUTS,
        reference=rules.paper_search_reference.output[0],
    output:
        directory(layout.paper_search_runs("{paper_objectives}", "{paper_device}",
                                           "{paper_algorithm}")),
    wildcard_constraints:
        paper_objectives="|".join(PAPER_SEARCH.objective_sets),
        paper_device="|".join(PAPER_SEARCH.devices),
        paper_algorithm="|".join(PAPER_SEARCH.algorithms),
    params:
        files=params_flags,
    threads: 1
    log:
        layout.log("paper", "search-{paper_objectives}-{paper_device}-{paper_algorithm}"),
    shell:
        f"hwgptbench search {PAPER_SEARCH_FLAGS} {{params.files:q}}"
        " --objectives {wildcards.paper_objectives:q} --device {wildcards.paper_device:q}"
        " --algorithm {wildcards.paper_algorithm:q} --reference {input.reference:q}"
        " --threads {threads} --out {output:q} 2>&1 | tee {log:q}"


PAPER_SEARCH_TABLES = ["runs", "reference", "front", "final", "summary", "attainment",
                       "friedman", "ranks", "pairwise", "eafdiff"]


rule paper_search_summary:
    """The paper search's final reference fronts, scored runs and rank tests."""
    input:
        code=code("paper_search_summary"),
        params=PAPER_SEARCH_PARAMS,
        references=expand(rules.paper_search_reference.output[0],
                          paper_objectives=PAPER_SEARCH.objectives,
                          paper_device=PAPER_SEARCH.devices),
        runs=expand(rules.paper_search.output[0], paper_objectives=PAPER_SEARCH.objectives,
                    paper_device=PAPER_SEARCH.devices,
                    paper_algorithm=PAPER_SEARCH.algorithms),
    output:
        tables=[layout.paper_search_table(name) for name in PAPER_SEARCH_TABLES],
        metrics=layout.paper_search_metrics(),
    params:
        files=params_flags,
        folder=lambda wildcards, output: str(Path(output.tables[0]).parent),
    log:
        layout.log("paper", "search_summary"),
    shell:
        "hwgptbench search-summary {params.files:q} --out-dir {params.folder:q}"
        " --metrics-out {output.metrics:q} {input.runs:q} --references {input.references:q}"
        " 2>&1 | tee {log:q}"


rule paper_external:
    """Few-shot transfer on HELP's and HAT's public latency data where paper.external names
    their folders; else a note that says it was skipped and how to add them."""
    input:
        code=code("paper_external"),
        params=PARAMS["paper"],
        data=[path for path in (EXTERNAL.help_fbnet, EXTERNAL.hat) if path],
    output:
        directory(layout.paper_external()),
    params:
        files=params_flags,
    log:
        layout.log("paper", "external"),
    shell:
        "hwgptbench transfer-external {params.files:q} --out-dir {output:q} 2>&1 | tee {log:q}"


rule paper_tables:
    """Every table and figure of the paper (results/paper/tables, results/paper/figures)."""
    input:
        code=code("paper_tables"),
        params=PARAMS["paper"],
        surrogates=expand(rules.paper_surrogates.output[0], paper_scale=PAPER.scales),
        search=rules.paper_search_summary.output.tables,
        external=rules.paper_external.output[0],
    output:
        tables=[paper_report(layout.paper_table(name).removesuffix(".md") + ".csv",
                             f"paper_table_{name}", "Tables") for name in PAPER_TABLES],
        markdown=[layout.paper_table(name) for name in [*PAPER_TABLES, "external"]],
        figures=[paper_report(layout.paper_figure(f"{scale}_{name}"), f"paper_{name}",
                              f"Figures of {scale}")
                 for scale in PAPER.scales for name in PAPER_SCALE_FIGURES],
        search_figures=[paper_report(layout.paper_figure(name), f"paper_{name}", "Search")
                        for name in PAPER_SEARCH_FIGURES],
    params:
        files=params_flags,
        search=lambda wildcards, input: str(Path(input.search[0]).parent),
    log:
        layout.log("paper", "tables"),
    shell:
        "hwgptbench paper-tables {params.files:q} --search {params.search:q}"
        " --external {input.external:q}/external.md 2>&1 | tee {log:q}"


rule paper_explorer:
    """The explorer page of the paper's scales from the shipped tables: one self-contained
    HTML file (docs/figures.md, "The explorer")."""
    input:
        code=code("paper_explorer"),
        surrogates=expand(rules.paper_surrogates.output[0], paper_scale=PAPER.scales),
    output:
        layout.paper_explorer(),
    params:
        scales=" ".join(f"--scale {scale}" for scale in PAPER.scales),
    log:
        layout.log("paper", "explorer"),
    shell:
        f"hwgptbench explore {{params.scales}} --results {PAPER_RESULTS} --out {{output:q}}"
        " 2>&1 | tee {log:q}"


rule paper:
    """The paper's figures and tables from the shipped tables (`make paper`)."""
    input:
        rules.paper_tables.output,
        rules.paper_explorer.output,
