"""The subcommands of no single stage: ``query`` the benchmark, ``publish-device`` and
``pull`` results through the DVC remote, ``unlock-stale`` after an interrupted run,
``ship-tables`` into the package's shipped set, ``dvc-deps`` to write dvc.yaml's code deps."""

from __future__ import annotations

import argparse
import logging
import subprocess
from pathlib import Path

import polars as pl

from .options import Add, load, load_settings, scale_and_results, space_of
from .outputs import TABLE_SUFFIXES, check_output_file, write_table
from .settings.sections import MeasureSettings
from .space import Arch, InvalidArchError

log = logging.getLogger("hwgptbench")


def cmd_query(args: argparse.Namespace) -> None:
    """Predicted (or measured) metrics of archs on a device."""
    from .api import Benchmark, QueryError

    if args.out:
        check_output_file(args.out, "query", TABLE_SUFFIXES)
    ids = [Arch.from_id(arch_id).id for arch_id in args.arch or []]
    if args.archs_file:
        ids += archs_of_file(Path(args.archs_file))
    if not ids:
        raise QueryError("give archs with --arch ID (repeatable) or --archs-file FILE")
    bench = Benchmark.load(args.scale, args.results, family=args.family, source=args.source)
    table = bench.query(ids, args.metric, device=args.device, condition=args.condition,
                        mode=args.mode, return_interval=args.interval,
                        fidelity=args.fidelity)
    if args.mode == "surrogate":
        for row in bench.used().iter_rows(named=True):
            log.info("%s on %s, %s: %s surrogate", row["metric"], row["device"],
                     row["condition"], row["family"])
    if args.out:
        out = write_table(table, args.out, "query")
        log.info("wrote %s: %d rows", out, table.height)
    else:
        with pl.Config(tbl_rows=len(table), fmt_str_lengths=60, tbl_width_chars=160):
            print(table)


def archs_of_file(path: Path) -> list[str]:
    """The arch ids of a text file, one a line (blank lines skipped); a line that is no arch
    id is refused naming the file and the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InvalidArchError(f"--archs-file {path}: not a UTF-8 text file of arch ids, one "
                               "a line") from None
    ids = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                ids.append(Arch.from_id(line.strip()).id)
            except InvalidArchError as err:
                raise InvalidArchError(f"--archs-file {path}, line {number}: {err} (the file "
                                       "holds arch ids, one a line, no header)") from None
    return ids


def cmd_publish_device(args: argparse.Namespace) -> None:
    """Publish a device's measurement table (devices/{scale}/{label}.parquet) to the DVC remote."""
    from . import layout
    from .remote import publish_device

    layout.check_label(args.scale, "--scale", layout.SCALE_NAME)
    if args.device is not None:
        label = layout.check_label(args.device, "--device")
    else:
        from .campaign.shard import device_label  # torch: only to derive this machine's label

        section = load_settings(args, MeasureSettings)
        label = device_label(section, section.threads)
    pointer = publish_device(args.scale, label, args.results, push=not args.no_push,
                             remote=args.remote)
    print(f"published {label}; commit the pointer: git add {pointer} {pointer.parent}/.gitignore "
          f"&& git commit -m 'Measurements of {label}'")


def cmd_pull(args: argparse.Namespace) -> None:
    """Fetch results from the DVC remote; mark those that are current up to date for Snakemake."""
    from .remote import pull

    pull(args.targets, remote=args.remote, endpoint_url=args.endpoint_url)


def cmd_unlock_stale(args: argparse.Namespace) -> None:
    """Remove the Snakemake and DVC locks of an interrupted run, when none still runs here."""
    from .locks import clear_stale_locks

    clear_stale_locks(Path(args.project))


def head_commit() -> str | None:
    """The commit checked out in the working directory's git repository, if any."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def cmd_ship(args: argparse.Namespace) -> None:
    """Ship a scale's perplexity table and device tables with the package
    (src/hwgptbench/published/), checksummed in its manifest."""
    from .published import FOLDER, ship

    config = load(args, ["spaces", "perplexity"])
    vocab = args.vocab_size or config["perplexity"]["hwgptbench"]["vocab_size"]
    record = ship(args.scale, space_of(config, args.scale), vocab, args.perplexity,
                  args.device or [], args.folder or FOLDER, args.replace_devices,
                  ", ".join(args.measured_by) if args.measured_by else head_commit())
    devices = ", ".join(f"{k} ({v['rows']} rows)" for k, v in record["devices"].items())
    log.info("shipped %s: perplexity %d rows; devices: %s", args.scale,
             record["perplexity"]["rows"], devices or "none")


def cmd_dvc_deps(args: argparse.Namespace) -> None:
    """Write the code deps of dvc.yaml's and paper/dvc.yaml's stages from the code each stage
    runs (its Snakemake jobs' imports); --check: only name the stages whose deps differ."""
    from .errors import UserError
    from .pipeline.dvc_deps import main

    found = main(args.check)
    if args.check and found:
        raise UserError("\n".join(found))


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("query", cmd_query, params=False)
    scale_and_results(command)
    command.add_argument("--device", help="device label (see the quality table; default: the "
                                          "only device)")
    command.add_argument("--metric", action="append", required=True,
                         help="metric, repeatable: perplexity, latency_ms, energy_mj, ...")
    command.add_argument("--condition", help="condition id, e.g. b1-t128-fp32-eager (default: "
                                             "the first the measure params define)")
    command.add_argument("--arch", action="append", help="arch id, repeatable")
    command.add_argument("--archs-file", help="file of arch ids, one per line")
    command.add_argument("--mode", choices=["surrogate", "measured", "auto"],
                         default="surrogate", help="surrogate: predicted; measured: the "
                         "measured (or published) value, null where none; auto: measured "
                         "where there is one, else predicted (default: %(default)s)")
    command.add_argument("--source", choices=["auto", "results", "published"], default="auto",
                         help="results: the run's results; published: the tables shipped with "
                              "the package; auto: both for a shipped scale (its shipped devices "
                              "and those measured or adapted here; here wins for a label in "
                              "both), else the results (default: %(default)s)")
    command.add_argument("--interval", action="store_true", help="add the surrogate's interval")
    command.add_argument("--fidelity", type=int, help="perplexity of the supernet after this "
                                                      "many training steps (default: fully "
                                                      "trained)")
    command.add_argument("--family", default="best",
                         help="surrogate family: best (per metric, device and condition, the "
                              "one its quality table selected) or lightgbm, mlp_ensemble, blend")
    command.add_argument("--out", help="write .parquet or .csv instead of printing")
    command = add("publish-device", cmd_publish_device)
    scale_and_results(command)
    command.add_argument("--device", help="device label (default: this machine's, from the "
                                          "measure params)")
    command.add_argument("--no-push", action="store_true", help="dvc add only, push later")
    command.add_argument("--remote", help="DVC remote name (default: the configured default)")
    command = add("pull", cmd_pull, params=False)
    command.add_argument("targets", nargs="*", help="stages to pull (default: all)")
    command.add_argument("--remote", help="a configured DVC remote's name, or the URL of a "
                                          "published one (s3://BUCKET/PATH, https://HOST/PATH), "
                                          "pulled read-only through .dvc/config.local (default: "
                                          "the default remote)")
    command.add_argument("--endpoint-url", help="endpoint of the S3-compatible store of an "
                                                "s3:// --remote (default: $AWS_ENDPOINT_URL_S3, "
                                                "$AWS_ENDPOINT_URL)")
    command = add("unlock-stale", cmd_unlock_stale, params=False)
    command.add_argument("--project", default=".", help="project folder (default: .)")
    command = add("ship-tables", cmd_ship)
    command.add_argument("--scale", required=True, help="search space of the tables")
    command.add_argument("--perplexity", help="perplexity table to ship, as hwgptbench "
                                              "import-perplexity writes it (default: keep "
                                              "the shipped one)")
    command.add_argument("--device", action="append", help="device table to ship, as the "
                                                           "measure stage writes it "
                                                           "(results/{scale}/measure/{label}"
                                                           ".parquet); repeatable")
    command.add_argument("--replace-devices", action="store_true",
                         help="drop the shipped devices not given with --device")
    command.add_argument("--vocab-size", type=int, help="vocabulary of the networks (default: "
                                                        "perplexity.hwgptbench.vocab_size)")
    command.add_argument("--folder", help="the shipped tables' folder (default: the package's)")
    command.add_argument("--measured-by", action="append",
                         help="commit of the code that measured the device tables; repeat it "
                              "for a table measured in several campaigns (default: the "
                              "checked-out commit)")
    command = add("dvc-deps", cmd_dvc_deps, params=False)
    command.add_argument("--check", action="store_true",
                         help="write nothing; fail naming each stage whose code deps differ")
