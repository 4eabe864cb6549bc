"""Move results between checkouts with DVC so that Snakemake sees them as DVC does.

After ``dvc pull`` a fresh clone has the right bytes but neither Snakemake's metadata nor a
meaningful mtime order, so Snakemake would rerun everything. ``snakemake --touch`` fixes
that, but it would also bless results that no longer match params.yaml or the code. So only
the stages that ``dvc status`` (content hashes against dvc.lock) finds current, together with
everything they are built from, are touched; the stale ones are named.

A device's measurement table is published on its own (``devices/{scale}/{label}.parquet``,
one DVC pointer file per device), so machines measuring at the same time never conflict.

The committed ``.dvc/config`` names a remote (``local``, a folder beside the clone) but makes
none the default: a pull names its remote (``--remote``), or a clone sets its own default. A
published remote is pulled read-only by its URL (``s3://...``, ``http(s)://...``):
:func:`add_url_remote` writes it to ``.dvc/config.local`` only, with ``verify = true``, and
never as the default, so no ``dvc push`` goes there. Without any usable remote,
:class:`NoRemoteError` says what works without one and how to get the rest.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .. import layout
from ..errors import UserError
from ..io import parse_yaml, read_parquet
from ..outputs import atomic_path

log = logging.getLogger(__name__)


# The mtime given to outputs of stale stages: 1 s after the epoch (Snakemake takes an mtime of
# 0 for "unknown" and then never finds the output older than its inputs).
OLDEST = 1


# What builds each pipeline's results (a pipeline not named here: dvc repro FILE)
BUILD = {"dvc.yaml": "make run", "paper/dvc.yaml": "make paper"}

# The name under which `hwgptbench pull --remote URL` configures a URL (.dvc/config.local)
URL_REMOTE = "public"
# The URL schemes `hwgptbench pull --remote URL` configures: S3 (and S3-compatible) and HTTP
URL_SCHEMES = ("s3", "http", "https")
# Where the endpoint of an S3-compatible store is read from when --endpoint-url is not given
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# Environment variables that give the AWS credential chain credentials (then requests are
# signed; without any, and without a shared credentials file, an s3:// URL is read unsigned)
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                        "AWS_CONTAINER_CREDENTIALS_FULL_URI")

# What a clone has without any remote, and how to get the rest: the end of NoRemoteError
WITHOUT_REMOTE = """\
Without a remote, the tables that ship with the package (src/hwgptbench/published/:
HW-GPT-Bench's perplexity tables of the s, m and l spaces, and a measured device table of the
s space) are queryable right after the install, e.g.
  hwgptbench query --scale s --metric perplexity --arch ID
To get the rest (supernets, surrogates, the full result trees):
  make pull REMOTE=https://HOST/PATH  a published remote, pulled read-only; or s3://BUCKET/PATH
                                      (ENDPOINT=https://... for an S3-compatible store)
  make pull REMOTE=NAME               a remote configured above (docs/remotes.md)
  make run                            compute the tiny default on this machine
  make hwgptbench                     HW-GPT-Bench's s space: its perplexities, measured here"""


class StaleResultsError(UserError, RuntimeError):
    """Pulled results do not match the current params or code."""


class RemoteError(UserError, ValueError):
    """A DVC remote that cannot be used as given: the message names it and the fix."""


class NoRemoteError(RemoteError):
    """No remote to pull from: none given nor the default, or the one named is not there."""


class PullFailedError(UserError, RuntimeError):
    """``dvc pull`` from a remote failed (DVC's own message is printed above it)."""


class NothingToPullError(UserError, RuntimeError):
    """No lock file nor pointer file here records any result to pull."""


def _tool(name: str) -> str:
    """Path of a console script installed beside this interpreter, else the bare name."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _run(args: list[str], capture: bool = False) -> str:
    log.info("$ %s", " ".join(args))
    result = subprocess.run(args, check=True, text=True,
                            stdout=subprocess.PIPE if capture else None)
    return result.stdout if capture else ""


@dataclass(frozen=True)
class Remote:
    """A configured DVC remote: its URL (a local path resolved absolute), the config file that
    sets it, its other options, and every config file that sets any of them."""

    name: str
    url: str
    origin: str
    options: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    @property
    def verifies(self) -> bool:
        """Whether DVC hashes every object pulled from it (``verify = true``)."""
        return self.options.get("verify", "false").lower() == "true"

    @property
    def local_path(self) -> Path | None:
        """The folder of a local directory remote; None for a URL."""
        return None if "://" in self.url else Path(self.url)


@dataclass(frozen=True)
class RemoteSettings:
    """The remotes DVC sees here (system, global, project and local config merged)."""

    remotes: dict[str, Remote]
    default: str | None

    def describe(self) -> str:
        """One line per remote: name, URL, where it is set, and what stops a pull from it."""
        if not self.remotes:
            return "  none"
        lines = []
        for remote in self.remotes.values():
            notes = [f"set in {remote.origin}"]
            if remote.name == self.default:
                notes.append("the default")
            if remote.local_path is not None and not remote.local_path.is_dir():
                notes.append("no such folder on this machine")
            if not remote.verifies:
                notes.append("verify is not true")
            lines.append(f"  {remote.name}: {remote.url} ({', '.join(notes)})")
        return "\n".join(lines)


def parse_config_list(text: str) -> RemoteSettings:
    """The remotes and the default in the output of ``dvc config --list --show-origin``
    (``ORIGIN<TAB>KEY=VALUE`` lines, in the order the levels shadow each other)."""
    urls: dict[str, tuple[str, str]] = {}
    options: dict[str, dict[str, str]] = {}
    files: dict[str, dict[str, None]] = {}
    default: str | None = None
    for line in text.splitlines():
        origin, _, setting = line.partition("\t")
        key, _, value = setting.partition("=")
        if key == "core.remote":
            default = value or None
        elif key.startswith("remote.") and key.count(".") >= 2:
            name, option = key.removeprefix("remote.").rsplit(".", 1)
            files.setdefault(name, {})[origin] = None
            if option == "url":
                urls[name] = (value, origin)
            else:
                options.setdefault(name, {})[option] = value
    remotes = {name: Remote(name, url, origin, options.get(name, {}), tuple(files[name]))
               for name, (url, origin) in urls.items()}
    return RemoteSettings(remotes, default)


def configured_remotes() -> RemoteSettings:
    """The remotes configured for the DVC project in the working directory."""
    args = [_tool("dvc"), "config", "--list", "--show-origin"]
    log.debug("$ %s", " ".join(args))
    result = subprocess.run(args, text=True, capture_output=True)
    if result.returncode != 0:
        raise RemoteError(f"cannot read the DVC config here ({result.stderr.strip()}): run the "
                          "command in the project's root (the folder with .dvc/)")
    return parse_config_list(result.stdout)


def url_scheme(value: str) -> str | None:
    """The scheme of ``value`` when it is a URL (``s3``, ``https``, ...), else None (a name)."""
    return urlsplit(value).scheme.lower() if "://" in value else None


def aws_credentials_set(environ: Mapping[str, str] | None = None, home: Path | None = None
                        ) -> bool:
    """Whether AWS credentials are configured: one of :data:`CREDENTIAL_VARIABLES`, or a shared
    credentials file (``AWS_SHARED_CREDENTIALS_FILE``, default ``~/.aws/credentials``)."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in CREDENTIAL_VARIABLES):
        return True
    shared = environ.get("AWS_SHARED_CREDENTIALS_FILE")
    return Path(shared).is_file() if shared else (
        (home or Path.home()) / ".aws" / "credentials").is_file()


def url_remote_options(url: str, endpoint_url: str | None = None,
                       environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options (besides the URL) of the read-only remote of ``url``: ``verify = true``;
    for ``s3://``, the endpoint (``endpoint_url``, else :data:`ENDPOINT_VARIABLES`) and, when
    no AWS credentials are set, unsigned requests (``allow_anonymous_login``)."""
    environ = os.environ if environ is None else environ
    scheme = url_scheme(url)
    if scheme not in URL_SCHEMES:
        raise RemoteError(
            f"--remote {url}: pull configures s3://, http:// and https:// URLs only; add any "
            "other store by name (dvc remote add --local NAME URL; dvc remote modify --local "
            "NAME verify true) and pass --remote NAME (docs/remotes.md)")
    if not urlsplit(url).netloc:
        raise RemoteError(f"--remote {url}: the URL names no bucket or host; expected "
                          "s3://BUCKET/PATH or https://HOST/PATH")
    options = {"verify": "true"}
    if scheme != "s3":
        if endpoint_url:
            raise RemoteError(f"--endpoint-url {endpoint_url}: an endpoint applies to an "
                              f"s3:// URL only, not to {url}; drop it")
        return options
    endpoint = endpoint_url or next(
        (environ[name] for name in ENDPOINT_VARIABLES if environ.get(name)), None)
    if endpoint:
        if url_scheme(endpoint) not in ("http", "https"):
            raise RemoteError(f"--endpoint-url {endpoint}: expected http(s)://HOST[:PORT] of "
                              "the S3-compatible store")
        options["endpointurl"] = endpoint
    if not aws_credentials_set(environ):
        options["allow_anonymous_login"] = "true"
    return options


def add_url_remote(url: str, endpoint_url: str | None = None, name: str = URL_REMOTE,
                   environ: Mapping[str, str] | None = None) -> str:
    """Configure ``url`` as the remote ``name`` in ``.dvc/config.local`` (never in the
    committed ``.dvc/config``, never as the default: it is pulled from by name only) with the
    options of :func:`url_remote_options`; an earlier URL under that name is replaced.
    Returns the name."""
    options = url_remote_options(url, endpoint_url, environ)
    if url_scheme(url) == "s3" and importlib.util.find_spec("dvc_s3") is None:
        raise RemoteError(f"--remote {url}: DVC's S3 support is not installed; "
                          "pip install -e '.[s3]' (dvc-s3)")
    existing = configured_remotes().remotes.get(name)
    shared = [file for file in (existing.files if existing else ())
              if Path(file).name != "config.local"]
    if shared:
        raise RemoteError(
            f"--remote {url}: a remote named {name!r} is already set in {', '.join(shared)}; "
            f"pull from it with --remote {name}, or rename it there (dvc remote rename {name} "
            "NEW)")
    if existing is not None and existing.url != url:
        log.info("remote %r: %s replaces %s in .dvc/config.local", name, url, existing.url)
    dvc = _tool("dvc")
    _run([dvc, "remote", "add", "--local", "--force", name, url])
    for option, value in options.items():
        _run([dvc, "remote", "modify", "--local", name, option, value])
    log.info("remote %r: %s, read-only, in .dvc/config.local (%s)", name, url,
             ", ".join(f"{k} = {v}" for k, v in options.items()))
    return name


def remote_to_pull(remote: str | None = None, endpoint_url: str | None = None) -> str:
    """The name of the remote to pull from: ``remote`` itself when it names a configured one,
    the remote :func:`add_url_remote` configures when it is a URL, else the default remote.
    :class:`NoRemoteError` when there is none, or its folder is not on this machine."""
    if remote is not None and url_scheme(remote) is not None:
        return add_url_remote(remote, endpoint_url)
    if endpoint_url:
        raise RemoteError(
            f"--endpoint-url {endpoint_url}: an endpoint goes with an s3:// URL as --remote; "
            f"for a configured remote set it there (dvc remote modify --local NAME endpointurl "
            f"{endpoint_url})")
    settings = configured_remotes()
    name = remote or settings.default
    if name is None:
        problem = "none is given (--remote, make pull REMOTE=...) and none is the default"
    elif name not in settings.remotes:
        problem = f"no remote named {name!r} is configured"
    else:
        chosen = settings.remotes[name]
        if chosen.local_path is not None and not chosen.local_path.is_dir():
            problem = (f"remote {name!r} is the folder {chosen.local_path}, which is not on "
                       f"this machine (on a shared disk: dvc remote modify --local {name} url "
                       "/PATH/ON/THE/DISK)")
        elif not chosen.verifies:
            raise RemoteError(
                f"remote {name!r} ({chosen.url}) does not set verify = true, which every remote "
                f"of this project must (docs/remotes.md): dvc remote modify {name} verify true")
        else:
            return name
    raise NoRemoteError(f"no DVC remote to pull from: {problem}.\nConfigured remotes:\n"
                        f"{settings.describe()}\n{WITHOUT_REMOTE}")


def remote_to_push(remote: str | None = None) -> str:
    """The name of the writable remote to push to: ``remote``, else the default; never a URL
    nor the read-only remote of a pulled URL (:data:`URL_REMOTE`)."""
    if remote is not None and url_scheme(remote) is not None:
        raise RemoteError(f"--remote {remote}: push goes to a configured, writable remote; "
                          "give its name (dvc remote list)")
    settings = configured_remotes()
    name = remote or settings.default
    if name is None:
        raise RemoteError("no DVC remote to push to: pass --remote NAME, or make one the "
                          "default for this clone (dvc remote default --local NAME). "
                          f"Configured remotes:\n{settings.describe()}")
    if name == URL_REMOTE:
        raise RemoteError(f"remote {name!r} is the read-only remote of a pulled URL: push to a "
                          "writable remote (--remote NAME; docs/remotes.md)")
    if name not in settings.remotes:
        raise RemoteError(f"no remote named {name!r} is configured: dvc remote list names "
                          f"those there are:\n{settings.describe()}")
    return name


def stale_stages() -> dict[str, Any]:
    """DVC stages whose deps, params or outs differ from dvc.lock (empty when all current)."""
    return json.loads(_run([_tool("dvc"), "status", "--json"], capture=True) or "{}")


def locked_stages() -> dict[str, Any]:
    """Every stage of the lock files (``dvc.lock``, and ``{folder}/dvc.lock`` of a pipeline in
    a folder such as ``paper/``) by its address in ``dvc status``: ``name``, or
    ``{folder}/dvc.yaml:name``."""
    stages: dict[str, Any] = {}
    for path in [Path("dvc.lock"), *sorted(Path().glob("*/dvc.lock"))]:
        if path.is_file():
            prefix = "" if path.parent == Path() else f"{path.parent.as_posix()}/dvc.yaml:"
            document = parse_yaml(path.read_text()) or {}
            stages.update({prefix + name: stage
                           for name, stage in document.get("stages", {}).items()})
    return stages


def lock_of(address: str) -> Path | None:
    """The lock file that records the stage at ``address`` (as ``dvc status`` names it:
    ``name`` of dvc.yaml, ``{folder}/dvc.yaml:name``); None for a ``.dvc`` pointer file, which
    records its own hash."""
    if ":" in address:
        return Path(address.split(":", 1)[0]).with_name("dvc.lock")
    return None if address.endswith(".dvc") else Path("dvc.lock")


def default_targets() -> list[str] | None:
    """What a pull without targets fetches: every DVC file of the checkout (tracked or not yet
    committed) but the pipelines that have no lock here (``dvc.yaml`` without ``dvc.lock``,
    ``paper/dvc.yaml`` without ``paper/dvc.lock``): they never ran in this checkout's history,
    so no results of theirs are recorded to pull (DVC would warn for each output and fail to
    check them out). Each one skipped is named once. None outside a git checkout (DVC's own
    default: everything)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "*.dvc",
                             "dvc.yaml", "*/dvc.yaml"], text=True, capture_output=True,
                            check=False)
    if listed.returncode != 0:
        return None
    targets = []
    for path in (Path(line) for line in listed.stdout.splitlines()):
        lock = path.with_name("dvc.lock")
        if path.name != "dvc.yaml" or lock.is_file():
            targets.append(path.as_posix())
        else:
            log.warning("%s is not pulled: this checkout has no %s, so none of its results are "
                        "recorded to pull (%s builds them; where they were built, dvc push and "
                        "commit %s)", path.as_posix(), lock.as_posix(),
                        BUILD.get(path.as_posix(), f"dvc repro {path.as_posix()}"),
                        lock.as_posix())
    return targets


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def current_targets(stages: Mapping[str, Any], stale: set[str]) -> list[str]:
    """Snakemake targets of the locked stages (:func:`locked_stages`) that are current with all
    their upstream stages.

    A stage is upstream of another when one of its outputs is (or holds) a dependency of the
    other. Only such targets may be touched: touching a target also marks everything it is
    built from as up to date in Snakemake.
    """
    outs = {name: [o["path"] for o in stage.get("outs", [])] for name, stage in stages.items()}

    def upstream(name: str) -> set[str]:
        deps = [d["path"] for d in stages[name].get("deps", [])]
        return {other for other, paths in outs.items() if other != name and any(
            _inside(dep, out) or _inside(out, dep) for dep in deps for out in paths)}

    blocked: set[str] = set()
    pending = [name for name in stages if name in stale]
    while pending:  # everything downstream of a stale stage is blocked too
        name = pending.pop()
        if name not in blocked:
            blocked.add(name)
            pending.extend(other for other in stages if name in upstream(other))
    targets: list[str] = []
    for name, stage in stages.items():
        command = stage["cmd"].split()
        if name not in blocked and command[:1] == ["snakemake"]:
            targets.extend(command[1:])
    return targets


def pull(targets: list[str] | None = None, remote: str | None = None,
         endpoint_url: str | None = None) -> None:
    """``dvc pull``, then ``snakemake --touch`` for every stage that is current, with all it is
    built from, against dvc.lock (and paper/dvc.lock).

    ``remote`` is a configured remote's name or a URL pulled read-only (:func:`remote_to_pull`;
    ``endpoint_url``: an S3-compatible store's); default: the default remote. ``targets`` are
    stage names or DVC files (default: :func:`default_targets`, the pipelines that have a lock
    here: a remote that holds one pipeline's results pulls into a clone whose other pipeline
    never ran, such as the paper's alone). A stage that does not match
    the current params or code (nor anything downstream of one) is not touched, so Snakemake
    and DVC both still report it; :class:`StaleResultsError` then names it.
    """
    name = remote_to_pull(remote, endpoint_url)
    if not targets:
        found = default_targets()
        if found == []:
            raise NothingToPullError(
                "nothing to pull: no pipeline here has a lock file (dvc.lock, paper/dvc.lock) "
                "and no .dvc pointer file is tracked, so no results are recorded to pull; "
                "check out the commit whose lock names the pushed results (where they were "
                "built: git add dvc.lock or paper/dvc.lock, commit, push), or build them here "
                "(make run, make paper)")
        targets = found or []
    try:
        _run([_tool("dvc"), "pull", "--remote", name, *targets])
    except subprocess.CalledProcessError as err:
        raise PullFailedError(
            f"dvc pull from remote {name!r} exited with {err.returncode}; DVC's message above "
            "names the cause (an unreachable URL, missing credentials, or, with verify = true, "
            "a corrupted object: docs/remotes.md, 'Repairing the remote')") from None
    locked = locked_stages()
    # a pipeline without a lock (dvc.yaml before `make run`, paper/dvc.yaml before `make
    # paper`) neither ran here nor was pulled: it is not built, not stale
    stale = {name: change for name, change in stale_stages().items()
             if (lock := lock_of(name)) is None or lock.is_file()}
    current = current_targets(locked, set(stale))
    for name in stale:  # outputs of stale stages: older than any input, so Snakemake reruns them
        for out in locked.get(name, {}).get("outs", []):
            path = Path(out["path"])
            for file in ([path] if path.is_file() else path.rglob("*") if path.is_dir() else []):
                os.utime(file, (OLDEST, OLDEST))
    if current:
        _run([_tool("snakemake"), "--touch", "--quiet=progress", *current])
    if stale:
        details = "\n".join(f"  {stage}: {json.dumps(change)}" for stage, change in stale.items())
        raise StaleResultsError(
            "pulled results do not match the current params.yaml or code for these stages:\n"
            f"{details}\nSnakemake was NOT told they (nor what they feed) are up to date; run "
            "`make run` (dvc repro) to rebuild exactly what changed.")
    log.info("pulled results are current; Snakemake marks them up to date")


def publish_device(scale: str, label: str, results: str | Path = layout.RESULTS,
                   folder: str | Path = layout.PUBLISHED, push: bool = True,
                   remote: str | None = None) -> Path:
    """Publish the measurement table of one device: copy it to ``devices/{scale}/{label}.parquet``,
    version it with ``dvc add`` (a pointer file per device: machines never conflict in git) and
    ``dvc push`` it to ``remote`` (default: the default remote; :func:`remote_to_push`).
    Returns the pointer file, which the caller commits to git. The scale and the label are
    checked as names (:func:`layout.check_label`) before they become part of a path."""
    scale = layout.check_label(scale, "the scale (--scale)", layout.SCALE_NAME)
    label = layout.check_label(label, "the device label (--device)")
    source = Path(layout.device_table(scale, label, str(results)))
    push_to = remote_to_push(remote) if push else ""
    if not source.exists():
        raise FileNotFoundError(
            f"{source} not found: measure the device first (`snakemake {source}`, or `make run` "
            "with the device in workflow.devices)")
    fix = f"measure the device again (`snakemake {source}`)"
    labels = set(read_parquet(source, fix, columns=["device"])["device"])
    if labels != {label}:
        raise UserError(f"{source} holds devices {sorted(labels, key=str)}, not only {label!r}")
    dest = Path(layout.published_table(scale, label, str(folder)))
    with atomic_path(dest, owned=True) as tmp:  # the device's table where layout puts it
        shutil.copyfile(source, tmp)
    _run([_tool("dvc"), "add", "--quiet", str(dest)])
    pointer = dest.with_name(dest.name + ".dvc")
    if push:
        _run([_tool("dvc"), "push", "--remote", push_to, str(pointer)])
    return pointer
