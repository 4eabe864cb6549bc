"""The paper's search budget on `s` from the shipped tables: every algorithm of
params/hwgptbench.yaml x its seeds x its budget x its objective sets, timed per algorithm,
then the summary tables and statistics of `hwgptbench search-summary` and the search figures.

    python benchmarks/paper_budget.py reference --out results-paper     # 10^5 + 10^6 per set
    python benchmarks/paper_budget.py runs --out results-paper --jobs 2
    python benchmarks/paper_budget.py summary --out results-paper

The same functions as the search stage (`moo/reference.py`, `moo/runner.py`,
`search/front.py`, `moo/summary.py`, `moo/compare.py`), on `Benchmark.load("s",
source="published")` (the shipped perplexities and the shipped CPU table), so that it runs from
a fresh clone. `runs` runs one job per (objective set, algorithm), all seeds in it (as the
workflow's `search` rule does), `--jobs` at a time, each on one torch thread, and writes
`timing.json`: wall and CPU seconds of each job and of the whole step. `summary` writes
`search/*.parquet` and the search figures under `--out`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

SCALE = "s"


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from hwgptbench import params

    return params.load_overlaid(args.params, args.overlay)["search"]


def _problem(objectives: str, config: dict[str, Any]):  # noqa: ANN202
    from hwgptbench import Benchmark
    from hwgptbench.moo.problem import make_problem

    bench = Benchmark.load(SCALE, source="published")
    device = bench.devices[0]  # the shipped CPU table
    return make_problem(bench, config["objective_sets"][objectives], device, None), device


def reference(args: argparse.Namespace) -> None:
    from hwgptbench.moo.reference import compute_reference, save_reference

    config = _config(args)
    for objectives in config["objectives"]:
        problem, device = _problem(objectives, config)
        start = time.perf_counter()
        ref, front = compute_reference(problem, config["reference_archs"],
                                       config["reference_seed"])
        save_reference(ref, front, Path(args.out) / "reference" / objectives)
        print(f"{objectives} on {device}: {time.perf_counter() - start:.1f} s, "
              f"{int(front['on_front'].sum())} front archs", flush=True)


def _job(out: str, objectives: str, algorithm: str, config: dict[str, Any]) -> dict[str, Any]:
    import torch
    from threadpoolctl import threadpool_limits

    from hwgptbench.moo.algorithms import get_algorithm, options_of
    from hwgptbench.moo.reference import load_reference
    from hwgptbench.moo.runner import run_seeds

    torch.set_num_threads(1)
    problem, device = _problem(objectives, config)
    get_algorithm(algorithm)  # its library imported before timing
    wall, cpu = time.perf_counter(), time.process_time()
    with threadpool_limits(1):  # as the search rule's job: BLAS and OpenMP on one thread too
        run_seeds(problem, load_reference(Path(out) / "reference" / objectives), algorithm,
                  config["budget"], range(config["seeds"]),
                  options_of(algorithm, config["options"]),
                  Path(out) / "runs" / objectives / algorithm,
                  {"objectives": objectives, "device": device})
    return {"objectives": objectives, "algorithm": algorithm,
            "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def runs(args: argparse.Namespace) -> None:
    config = _config(args)
    if args.seeds is not None:
        config["seeds"] = args.seeds
    jobs = [(objectives, algorithm) for algorithm in (args.algorithms or config["algorithms"])
            for objectives in (args.objectives or config["objectives"])]
    # the longest (BO) first, so that the pool's two workers end together
    jobs.sort(key=lambda j: j[1] not in ("rsbo", "ehvi", "lsbo"))
    wall, cpu = time.perf_counter(), os.times()
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(_job, args.out, o, a, config) for o, a in jobs]
        done = []
        for future in futures:
            done.append(future.result())
            print(json.dumps({k: round(v, 1) if isinstance(v, float) else v
                              for k, v in done[-1].items()}), flush=True)
    end = os.times()
    timing = {"jobs": done, "workers": args.jobs, "wall_s": time.perf_counter() - wall,
              "cpu_s": (end.children_user + end.children_system)
              - (cpu.children_user + cpu.children_system),
              "budget": config["budget"], "seeds": config["seeds"]}
    parts = [*(args.objectives or []), *(args.algorithms or [])]
    name = f"timing-{'-'.join(parts)}.json" if parts else "timing.json"
    Path(args.out, name).write_text(json.dumps(timing, indent=2))
    print(f"all {len(jobs)} jobs: {timing['wall_s']:.1f} s wall on {args.jobs} workers, "
          f"{timing['cpu_s']:.1f} CPU s")


def summary(args: argparse.Namespace) -> None:
    import polars as pl

    from hwgptbench.moo import compare
    from hwgptbench.moo import summary as moo_summary
    from hwgptbench.moo.reference import load_front, load_reference
    from hwgptbench.search.front import final_fronts

    config = _config(args)
    out = Path(args.out)
    folders = [out / "runs" / o / a for o in config["objectives"] for a in config["algorithms"]]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        print("not run (left out of the summary):", ", ".join(missing))
    folders = [f for f in folders if f.is_dir()]
    references = [(load_reference(out / "reference" / o), load_front(out / "reference" / o))
                  for o in config["objectives"] if (out / "reference" / o).is_dir()]
    scored, stages, _ = final_fronts(moo_summary.read_runs(folders), references,
                                     config["objective_sets"])
    final = moo_summary.final_runs(scored)
    tables = {"runs": scored, "reference": stages, "final": final,
              "summary": moo_summary.summarize(final),
              "attainment": moo_summary.attainment(scored, config["objective_sets"]),
              **compare.comparison_tables(scored, final, config["objective_sets"])}
    (out / "search").mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.write_parquet(out / "search" / f"{name}.parquet")
    with pl.Config(tbl_rows=100, tbl_width_chars=200, float_precision=4):
        print(stages.drop("metrics", "ideal", "nadir"))
        print(tables["summary"])
        print(tables["friedman"])
        print(tables["pairwise"])
    print("min hv_regret over every evaluation of every run:", scored["hv_regret"].min())
    from hwgptbench.figures import search as figures

    folder = out / "figures"
    figures.hypervolume_curves(scored, folder / "hypervolume")
    figures.hypervolume_time(scored, folder / "hypervolume_time")
    figures.critical_difference(tables["friedman"], tables["ranks"],
                                folder / "critical_difference")
    figures.eaf_difference(tables["eafdiff"], folder / "eaf_difference")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["reference", "runs", "summary"])
    parser.add_argument("--out", default="results-paper")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--overlay", nargs="*", default=["params/hwgptbench.yaml"])
    parser.add_argument("--jobs", type=int, default=2, help="jobs at a time (runs)")
    parser.add_argument("--objectives", nargs="*", default=None,
                        help="runs: these objective sets only (default: the params')")
    parser.add_argument("--algorithms", nargs="*", default=None,
                        help="runs: these algorithms only (default: the params')")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs: seeds 0 .. N-1 (default: the params' search.seeds)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    {"reference": reference, "runs": runs, "summary": summary}[args.step](args)


if __name__ == "__main__":
    main()
