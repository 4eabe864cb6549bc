"""The subcommands that operate the pipeline itself: ``publish-device`` and ``pull`` results
through the DVC remote, ``unlock-stale`` after an interrupted run, ``dvc-deps`` to write
dvc.yaml's code deps, ``status`` to say what is current."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import Add, load_settings, scale_and_results
from ..settings.sections import MeasureSettings


def cmd_publish_device(args: argparse.Namespace) -> None:
    """Publish a device's measurement table (devices/{scale}/{label}.parquet) to the DVC remote."""
    from .. import layout
    from .remote import publish_device

    layout.check_label(args.scale, "--scale", layout.SCALE_NAME)
    if args.device is not None:
        label = layout.check_label(args.device, "--device")
    else:
        from ..campaign.shard import device_label  # torch: only to derive this machine's label

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


def cmd_dvc_deps(args: argparse.Namespace) -> None:
    """Write the code deps of dvc.yaml's and paper/dvc.yaml's stages from the code each stage
    runs (its Snakemake jobs' imports); --check: only name the stages whose deps differ."""
    from ..errors import UserError
    from .dvc_deps import main

    found = main(args.check)
    if args.check and found:
        raise UserError("\n".join(found))


def cmd_status(args: argparse.Namespace) -> None:
    """Say, a line per pipeline, whether its results are current, which stages are not, or that
    it is not built yet (paper/dvc.yaml until `make paper`)."""
    from .status import main

    for line in main(Path.cwd()):
        print(line)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
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
    command = add("dvc-deps", cmd_dvc_deps, params=False)
    command.add_argument("--check", action="store_true",
                         help="write nothing; fail naming each stage whose code deps differ")
    add("status", cmd_status, params=False)
