"""The measure stage's subcommands: ``measure`` (one shard on this machine), ``measure-plan``,
``merge-shards``, ``merge-devices`` and ``devices``."""

from __future__ import annotations

import argparse
import logging

from .. import layout, params
from ..io import atomic_write_text
from ..options import Add, load, load_settings, scale_arg, space_of, vocab_size, vocab_source
from ..settings.sections import MeasurePlanSettings, MeasureSettings
from ..space import read_archs

log = logging.getLogger("hwgptbench")


def cmd_measure(args: argparse.Namespace) -> None:
    """Measure latency, energy, memory and FLOPs of sampled archs on this machine."""
    from ..campaign.shard import device_label
    from ..meters.device import freeze_survivors
    from . import stage

    freeze_survivors()
    section = load_settings(args, MeasureSettings)
    space = space_of(load(args, ["spaces"]), args.scale)
    label = device_label(section.model_copy(update={"device": args.device or section.device}),
                         section.threads)
    index, count = stage.parse_shard(args.shard)
    out = args.out or layout.shard(args.scale, label, index, count)
    archs_path = args.archs or layout.archs(args.scale)
    table = stage.measure_shard(section, space, read_archs(archs_path), vocab_size(args), label,
                                (index, count), out)
    log.info("wrote %s: %d rows on %s", out, table.height, label)


def cmd_measure_plan(args: argparse.Namespace) -> None:
    """Print the groups and peak memory the measure jobs plan, per scale and device."""
    from ..campaign import plan

    settings = MeasurePlanSettings.of(params.load_typed([args.params, *args.overlay]))
    measure, cluster = settings.measure, settings.cluster
    devices = (plan.cluster_memory(cluster, measure.aliases) if cluster.devices
               else plan.this_machine(measure))
    if set(cluster.devices) - set(devices):
        log.warning("not planned, no cluster.devices memory_gb: %s",
                    ", ".join(sorted(set(cluster.devices) - set(devices))))
    vocab = plan.tokenizer_vocab_size(settings.tokenizer)
    if vocab is None:
        log.warning("nothing planned: data.tokenizer.file is not there, so the vocabulary "
                    "size is not known")
    plans = ([] if vocab is None else
             plan.plan_scales(list(plan.search_spaces(settings).values()), measure,
                              settings.n_archs + 2, vocab, devices))
    table = plan.format_table(plans)
    print(table)
    if args.out:
        atomic_write_text(args.out, table + "\n")
    for memory_plan in plans:  # after the table, whose marks they explain
        warning = memory_plan.over_budget_warning()
        if warning:
            log.warning("%s", warning)


def cmd_merge_shards(args: argparse.Namespace) -> None:
    """Merge the measurement shards of one device into its device table."""
    from .merge import merge_shards

    table = merge_shards(args.inputs, args.out)
    log.info("wrote %s: %d rows", args.out, table.height)


def cmd_merge_devices(args: argparse.Namespace) -> None:
    """Merge device tables into the table of every device of a scale."""
    from .merge import merge_devices

    table = merge_devices(args.inputs, args.out, getattr(args, "metrics_out", None))
    log.info("wrote %s: %d rows", args.out, table.height)


def cmd_merge(args: argparse.Namespace) -> None:
    """Merge measurement shards into a device table, or device tables into one table
    (renamed: merge-shards and merge-devices; this name goes in the next release)."""
    new = "merge-devices" if args.devices else "merge-shards"
    log.warning("merge-measurements is now %s; the old name goes in the next release", new)
    (cmd_merge_devices if args.devices else cmd_merge_shards)(args)


def cmd_devices(args: argparse.Namespace) -> None:
    """Print this machine's fingerprint, label and which metrics it can measure."""
    from ..campaign.shard import device_label
    from ..meters.device import DTYPES, default_device, dtype_unsupported_reason, fingerprint
    from ..meters.energy import open_energy_meter
    from ..meters.host import auto_label

    section = load_settings(args, MeasureSettings)
    if args.label:  # for scripts: the label this machine's tables are filed under
        print(device_label(section, section.threads))
        return
    device = default_device()
    identity = fingerprint(section.threads, device)
    print(f"label: {auto_label(identity)}  (measure.device: auto)")
    for key, value in identity.items():
        print(f"  {key}: {value}")
    print("metrics:")
    print("  latency: yes (" + ("CUDA events" if device.type == "cuda" else
                               f"perf_counter_ns, {section.threads} threads") + ")")
    with open_energy_meter(device) as meter:
        energy = f"yes ({meter.source})" if meter.available else f"no: {meter.reason}"
    print(f"  energy: {energy}")
    memory = "allocator statistics" if device.type == "cuda" else "allocator events"
    print(f"  memory: yes (tensor bytes, {memory})")
    for name, dtype in DTYPES.items():
        reason = dtype_unsupported_reason(dtype, device)
        print(f"  dtype {name}: {'yes' if reason is None else 'no: ' + reason}")


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("measure", cmd_measure)
    scale_arg(command)
    command.add_argument("--device", help="device label, or auto (default: measure.device)")
    command.add_argument("--shard", default="0/1", help="measure shard i of n (default: 0/1)")
    command.add_argument("--archs", help="archs table (default: results/{scale}/archs.parquet)")
    vocab_source(command)
    command.add_argument("--out", help="shard table (default: "
                                       "results/{scale}/.measure/{device}/shard-i-of-n.parquet)")
    command = add("measure-plan", cmd_measure_plan, params=False)
    command.add_argument("--params", default="params.yaml", help="default: %(default)s")
    command.add_argument("--overlay", action="extend", nargs="+", default=[],
                         help="params files merged over it as snakemake --configfile merges "
                              "them, e.g. params/paper.yaml")
    command.add_argument("--out", help="also write the table to this file")
    for name, func, what in (("merge-shards", cmd_merge_shards, "shards of one device"),
                             ("merge-devices", cmd_merge_devices, "device tables")):
        command = add(name, func)
        command.add_argument("--out", required=True, help="merged table (parquet)")
        if func is cmd_merge_devices:
            command.add_argument("--metrics-out", help="contention per device and condition "
                                                       "(JSON, for dvc metrics)")
        command.add_argument("inputs", nargs="+", help=f"{what} to merge")
    command = add("merge-measurements", cmd_merge)
    command.add_argument("--devices", action="store_true",
                         help="inputs are device tables (default: shards of one device)")
    command.add_argument("--out", required=True, help="merged table (parquet)")
    command.add_argument("inputs", nargs="+", help="tables to merge")
    command = add("devices", cmd_devices)
    command.add_argument("--label", action="store_true",
                         help="print only the label (measure.device, checked against the hardware)")
