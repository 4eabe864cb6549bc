"""GPU campaign: HW-GPT-Bench's ``s``, ``m`` and ``l`` archs measured on one CUDA GPU within
a lent machine's minutes: latency (CUDA events), NVML energy and peak memory, bf16, at b1-t128
and b8-t1024, eager and as a CUDA graph.

Three steps, two machines:

    # here: the archs to measure, drawn from the shipped perplexity tables (needs polars)
    python benchmarks/gpu_campaign.py archs --out .gpu/archs.json
    # on the GPU machine (torch and numpy only): rows as JSON lines, one file per phase
    PYTHONPATH=src python benchmarks/gpu_campaign.py measure --archs .gpu/archs.json \\
        --out "$OUT" --seconds 420
    # a second call on the same loan skips the archs of the first call's rows
    PYTHONPATH=src python benchmarks/gpu_campaign.py measure --archs .gpu/archs.json \\
        --out "$OUT" --seconds 290 --done .gpu/loan1
    # here: the rows as device tables (results/{scale}/measure/{label}.parquet), the second
    # campaign's repeatability printed and written to {out}/repeatability.json
    python benchmarks/gpu_campaign.py tables --rows .gpu/loan1 .gpu/loan2 --out results

A later session completes the shipped tables: the same draw without the archs the device's
shipped table holds (``archs --exclude-shipped cuda-nvidia-h100-80gb-hbm3``), measured as
above, then ``tables --rows .gpu/loan3 --out results --with-shipped`` adds the new rows to
the shipped ones, and ``hwgptbench ship-tables`` ships the result.

Each arch's model is built once in bf16 and measured under every condition with the measure
stage's own :func:`~hwgptbench.meters.runner.measure_arch`. Energy is read at one condition
(``ENERGY_CONDITION``, the compute-bound one) over a window aligned to the NVML counter's steps;
the other conditions' rows say so in ``energy_reason``. The phases (s, m, l, then a second
campaign of the first 100 ``s`` archs) share the time given, each ending at its deadline with
the archs measured by then; the archs of a phase are in random order, so a phase cut short is
still a uniform sample. An error in one (arch, condition) is written as a row with status
``error`` and the campaign goes on.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

try:
    import hwgptbench  # noqa: F401
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hwgptbench.meters.condition import Condition
from hwgptbench.meters.device import default_device, fingerprint
from hwgptbench.meters.energy import EnergyMeter, calibrate, open_energy_meter
from hwgptbench.meters.host import auto_label
from hwgptbench.meters.runner import Settings, build_model, measure_arch
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.versions import library_versions

log = logging.getLogger("gpu_campaign")

COUNTS = {"s": 500, "m": 200, "l": 100}
REPEAT = 100  # s archs measured again at the end: the repeatability campaign
CONDITIONS = [Condition(1, 128, "bf16", "eager"), Condition(1, 128, "bf16", "cuda_graph"),
              Condition(8, 1024, "bf16", "cuda_graph"), Condition(8, 1024, "bf16", "eager")]
DTYPE = torch.bfloat16  # every condition's
# energy is read at one condition, the compute-bound one; eager where the graph failed
ENERGY_CONDITION, ENERGY_FALLBACK = CONDITIONS[2], CONDITIONS[3]
# the share of --seconds each phase may use, cumulative deadlines in this order
PHASES = (("s", 0.45), ("m", 0.25), ("l", 0.22), ("s-repeat", 0.08))
SETTINGS = Settings(threads=1, warmup=2, min_repeats=8, max_repeats=40, target_rel_ci=0.01,
                    max_seconds=0.06, energy_seconds=0.15, memory=True, seed=0,
                    estimator="median")


def draw_archs(out: Path, seed: int = 0, exclude_shipped: str | None = None) -> dict[str, Any]:
    """COUNTS archs of each scale from its shipped perplexity table (the largest and smallest
    of the space first when the table has them), with the space and vocabulary; without the
    archs that the shipped table of device ``exclude_shipped`` already holds (a later loan
    completes the same draw)."""
    from hwgptbench import published

    doc: dict[str, Any] = {"seed": seed, "scales": {}}
    for scale, count in COUNTS.items():
        space = published.space(scale)
        ids = sorted(published.perplexity_table(scale)["arch_id"].unique().to_list())
        ends = [a.id for a in (space.largest(), space.smallest()) if a.id in ids]
        rng = torch.Generator().manual_seed(seed)
        rest = [ids[i] for i in torch.randperm(len(ids), generator=rng).tolist()
                if ids[i] not in ends]
        drawn = (ends + rest)[:count]
        shipped = published.device_tables(scale).get(exclude_shipped or "")
        if shipped is not None:
            done = set(shipped["arch_id"].to_list())
            drawn = [a for a in drawn if a not in done]
        doc["scales"][scale] = {"space": space.to_dict(), "vocab_size": published.vocab_size(scale),
                                "archs": drawn}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def _error_row(arch: Arch, condition: Condition, error: BaseException) -> dict[str, Any]:
    reason = "".join(traceback.format_exception_only(error)).strip().splitlines()[-1]
    return {"arch_id": arch.id, **condition.as_dict(), "status": "error", "reason": reason}


def measure_phase(space: SearchSpace, vocab: int, archs: list[Arch], deadline: float,
                  device: torch.device, meter: EnergyMeter, out: Any, extra: dict[str, Any]
                  ) -> int:
    """Rows of archs under every condition, one JSON line each, until deadline; the archs
    measured."""
    skipped = EnergyMeter(meter.source, f"energy read at {ENERGY_CONDITION.id} only in this "
                                        "campaign (windows aligned to the counter's steps)")
    fallback = EnergyMeter(meter.source, f"energy read at {ENERGY_CONDITION.id} for this arch")
    done = 0
    for arch in archs:
        if time.perf_counter() > deadline:
            break
        try:
            model = build_model(space, arch, vocab, SETTINGS.seed, device, DTYPE)
        except Exception as err:  # noqa: BLE001 - recorded on the rows, the campaign goes on
            model, failed = None, err
        energy_read = False
        for condition in CONDITIONS:
            if condition.launch == "cuda_graph" and device.type != "cuda":
                continue
            if condition == ENERGY_CONDITION:
                reads = meter
            elif condition == ENERGY_FALLBACK:
                reads = fallback if energy_read else meter
            else:
                reads = skipped
            if model is None:
                row = _error_row(arch, condition, failed)
            else:
                try:
                    row = measure_arch(space, arch, vocab, condition, device, reads, SETTINGS,
                                       model=model)
                    energy_read |= reads is meter and row.get("energy_mj") is not None
                except Exception as err:  # noqa: BLE001 - as above
                    log.warning("%s %s: %s", arch.id, condition.id, err)
                    row = _error_row(arch, condition, err)
            out.write(json.dumps({**row, **extra}) + "\n")
        out.flush()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        done += 1
    return done


def measure(archs_file: Path, out: Path, seconds: float, device: torch.device | None = None,
            done: list[Path] | None = None) -> dict[str, Any]:
    """Every phase on this machine's GPU (or on ``device``: a dry run on the CPU measures its
    eager conditions), skipping the archs measured in the ``done`` folders' rows; rows to
    ``{out}/rows_{phase}.jsonl``, what was measured to ``{out}/campaign.json``."""
    doc = remaining(json.loads(archs_file.read_text()), done or [])
    device = default_device() if device is None else torch.device(device)
    identity = fingerprint(SETTINGS.threads, device)
    label = auto_label(identity)
    base = {"device": label, "latency_interleaved": False, "latency_group": 0,
            **identity, **library_versions()}
    summary: dict[str, Any] = {"label": label, "identity": identity, "phases": {},
                               "settings": {k: getattr(SETTINGS, k) for k in (
                                   "warmup", "min_repeats", "max_repeats", "target_rel_ci",
                                   "max_seconds", "energy_seconds")}}
    start = time.perf_counter()
    with open_energy_meter(device) as meter:
        summary["energy"] = {"source": meter.source, "reason": meter.reason}
        calibrate(meter)  # idle power (every row's energy_idle_w) and the counter's period
        summary["energy"] |= {"counter_period_s": meter.period_s, "idle_power_w": meter.idle_w}
        base["energy_idle_w"] = meter.idle_w
        log.info("energy meter: %s", summary["energy"])
        share = 0.0
        for phase, fraction in PHASES:
            share += fraction
            scale = phase.split("-")[0]
            entry = doc["scales"][scale]
            space = SearchSpace.from_dict(scale, entry["space"])
            ids = entry["archs"][:REPEAT] if phase.endswith("repeat") else entry["archs"]
            t0 = time.perf_counter()
            with open(out / f"rows_{phase}.jsonl", "w") as rows:
                done = measure_phase(space, entry["vocab_size"], [Arch.from_id(i) for i in ids],
                                     start + share * seconds, device, meter, rows,
                                     {**base, "scale": scale,
                                      "campaign": 2 if phase.endswith("repeat") else 1})
            summary["phases"][phase] = {"archs": done, "of": len(ids),
                                        "seconds": round(time.perf_counter() - t0, 1)}
            log.info("%s: %d of %d archs in %.0f s", phase, done, len(ids),
                     time.perf_counter() - t0)
            (out / "campaign.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _read_rows(folders: list[Path], phase: str) -> list[dict[str, Any]]:
    """The rows of a phase from every loan's folder."""
    paths = [folder / f"rows_{phase}.jsonl" for folder in folders]
    return [json.loads(line) for path in paths if path.is_file()
            for line in path.read_text().splitlines()]


def remaining(doc: dict[str, Any], done: list[Path]) -> dict[str, Any]:
    """The archs document without the archs that earlier loans' rows measured (their order
    kept), for a campaign that resumes on another loan."""
    doc = json.loads(json.dumps(doc))
    for scale, entry in doc["scales"].items():
        measured = {row["arch_id"] for row in _read_rows(done, scale)}
        entry["archs"] = [a for a in entry["archs"] if a not in measured]
    return doc


def tables(rows_dirs: list[Path], out: Path, with_shipped: bool = False) -> dict[str, Any]:
    """Device tables of the campaign's first rows (from every loan's folder), per scale, with
    the rows of the device's shipped table where ``with_shipped`` (a later loan adds to it);
    the repeatability of the second campaign against the first (share within ±2% and Kendall
    τ, per condition)."""
    import polars as pl

    from hwgptbench import published
    from hwgptbench.io import write_parquet
    from hwgptbench.metrics import KEY, measurement_frame
    from hwgptbench.repeatability import agreement

    report: dict[str, Any] = {}
    for scale in COUNTS:
        rows = [r for r in _read_rows(rows_dirs, scale) if r.pop("campaign", 1) == 1]
        if not rows:
            continue
        table = measurement_frame(rows)
        label = table["device"][0]
        shipped = published.device_tables(scale).get(label) if with_shipped else None
        if shipped is not None:
            table = pl.concat([shipped, table], how="diagonal_relaxed")
        table = table.sort(KEY)
        write_parquet(table, out / scale / "measure" / f"{label}.parquet")
        report[scale] = {"archs": table["arch_id"].n_unique(), "rows": table.height,
                         "ok": int((table["status"] == "ok").sum())}
    first = pl.DataFrame(_read_rows(rows_dirs, "s"), infer_schema_length=None)
    second = pl.DataFrame(_read_rows(rows_dirs, "s-repeat"), infer_schema_length=None)
    if first.height and second.height:
        joined = first.join(second, on=["arch_id", "batch_size", "seq_len", "launch"],
                            suffix="_2").filter(pl.col("status") == "ok",
                                                pl.col("status_2") == "ok")
        for (b, t, launch), part in joined.group_by("batch_size", "seq_len", "launch"):
            report[f"repeat b{b}-t{t}-{launch}"] = agreement(part["latency_ms"].to_numpy(),
                                                             part["latency_ms_2"].to_numpy())
    out.mkdir(parents=True, exist_ok=True)
    (out / "repeatability.json").write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    draw = sub.add_parser("archs", help="draw the archs from the shipped perplexity tables")
    draw.add_argument("--out", type=Path, required=True)
    draw.add_argument("--exclude-shipped", metavar="LABEL",
                      help="leave out the archs the shipped table of this device holds")
    run = sub.add_parser("measure", help="measure them on this machine's GPU")
    run.add_argument("--archs", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--seconds", type=float, default=460.0)
    run.add_argument("--device", default=None, help="default: the GPU (cpu: a dry run)")
    run.add_argument("--done", type=Path, nargs="*", default=[],
                     help="earlier loans' output folders: their archs are not measured again")
    convert = sub.add_parser("tables", help="device tables from the rows")
    convert.add_argument("--rows", type=Path, nargs="+", required=True,
                         help="the output folder of each loan")
    convert.add_argument("--out", type=Path, required=True)
    convert.add_argument("--with-shipped", action="store_true",
                         help="add the rows to the device's shipped table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.step == "archs":
        doc = draw_archs(args.out, exclude_shipped=args.exclude_shipped)
        print({s: len(e["archs"]) for s, e in doc["scales"].items()})
    elif args.step == "measure":
        args.out.mkdir(parents=True, exist_ok=True)
        print(json.dumps(measure(args.archs, args.out, args.seconds, args.device,
                                 args.done)["phases"]))
    else:
        print(json.dumps(tables(args.rows, args.out, args.with_shipped), indent=1))


if __name__ == "__main__":
    main()
