"""The resume folder of one measure shard (``{out}.parts/``) or of the archs ``adapt``
measures: what an interrupted job has measured, so that a rerun measures only the rest.

It holds the inputs stamp, each condition's group plan (saved again when the campaign splits
the rest into smaller groups), a parquet file per measured group, each condition's per-arch
rows (energy, memory and FLOPs are measured one arch at a time, so a rerun keeps those of a
group it did not finish; its interleaved timing needs the whole group and is run again) and a
marker per group that started and did not finish, with the memory free when it started, the
kernel's count of OOM kills then and, for a group that failed, the error: a rerun says why
that group did not finish. Once a condition is finished (its contended rows timed again, its
repeat subset timed), its rows are stored whole: a rerun times only its rows still contended.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from .. import __version__
from ..errors import UserError
from ..io import atomic_write_json, canonical_json, read_json, read_parquet, write_parquet
from ..meters.condition import Condition
from ..metrics import measured_bounds, measurement_frame
from ..outputs import make_own_dir, remove_file, remove_own_dir
from ..settings.sections import MeasureSettings
from ..space import Arch, SearchSpace
from .budget import GB, Group, GroupPlan
from .pressure import oom_kills

log = logging.getLogger(__name__)

class ResumeStateError(UserError, ValueError):
    """A file of a shard's resume folder (``{out}.parts/``) that cannot be read back: the
    message names it and how to restart."""


COMMAND = "measure"  # the command whose marker a shard's resume folder carries
GROUP_COLUMNS = {"arch_id": pl.String, "status": pl.String, "latency_ms": pl.Float64,
                 "latency_anchor_only": pl.Boolean}


def inputs_key(section: MeasureSettings, space: SearchSpace, archs: Sequence[Arch],
               vocab_size: int, label: str) -> str:
    """Hash of everything a campaign's rows depend on: what a stored part must have been
    measured with to be reused."""
    doc = {"measure": {k: v for k, v in section.model_dump().items()
                       if k not in ("device", "aliases")},
           "space": space.name, "spec": repr(space), "archs": [a.id for a in archs],
           "vocab_size": vocab_size, "label": label, "version": __version__}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


@dataclass(frozen=True)
class Owner:
    """The command a resume folder belongs to: its marker, and how a user reruns it."""

    command: str = COMMAND
    rerun: str = "rerun the same `hwgptbench measure` command"


class ShardParts:
    """The resumable progress of one campaign (a shard job, or the archs ``adapt`` measures):
    its group plans, a part file per measured group and the rows of each finished condition,
    in ``{out}.parts/``. The folder belongs to one set of inputs (settings, archs, device): a
    folder left by other inputs is discarded, so a restarted job measures only the groups not
    yet written, with the settings they were planned with. A file of the folder that cannot be
    read back (not JSON or parquet, or not what this class writes) is refused with
    :class:`ResumeStateError`, which says what to delete."""

    def __init__(self, root: str | os.PathLike[str], key: str, owner: Owner = Owner()) -> None:
        self.owner = owner
        self.root = make_own_dir(root, owner.command)  # a path it did not make is refused
        stamp = self.root / "inputs.json"
        if stamp.is_file() and self._key(stamp) != key:
            log.warning("%s: left by other settings or archs; measuring anew", self.root)
            remove_own_dir(self.root, owner.command)
            make_own_dir(self.root, owner.command)
        if not stamp.is_file():
            atomic_write_json(stamp, {"key": key})

    def _damaged(self, path: Path, why: str) -> ResumeStateError:
        """The error for a plan or stamp file (or the folder) that cannot be read back."""
        return ResumeStateError(f"{path}: {why}; the resume state of this shard is damaged: "
                                f"delete the folder {self.root} (the shard is measured anew) "
                                f"and {self.owner.rerun}")

    def _json(self, path: Path) -> Any:
        """A JSON file of the folder."""
        return read_json(path, f"delete the folder {self.root} (the shard is measured anew) "
                               f"and {self.owner.rerun}")

    def _key(self, stamp: Path) -> str | None:
        """The inputs key the folder was written for (None: no stamp)."""
        if not stamp.is_file():
            return None
        doc = self._json(stamp)
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
            raise self._damaged(stamp, "holds no inputs key")
        return doc["key"]

    def plan(self, condition: Condition, make: Callable[[], GroupPlan], n_archs: int
             ) -> GroupPlan:
        """The condition's group plan of the shard's ``n_archs`` archs: the one saved by an
        earlier run, else make() saved."""
        path = self._plan_path(condition)
        if path.is_file():
            return self._saved_plan(path, n_archs)
        plan = make()
        self.save_plan(condition, plan)
        return plan

    def _plan_path(self, condition: Condition) -> Path:
        return self.root / f"{condition.id}.plan.json"

    def save_plan(self, condition: Condition, plan: GroupPlan) -> None:
        """Store the condition's plan (a new one replaces the saved one)."""
        atomic_write_json(self._plan_path(condition),
                          {"budget": plan.budget, "anchors": list(plan.anchors),
                           "groups": [asdict(g) for g in plan.groups]})

    def _saved_plan(self, path: Path, n_archs: int) -> GroupPlan:
        """A saved plan, checked: each arch a member of one group, every index an arch's."""
        doc = self._json(path)
        try:
            plan = GroupPlan(tuple(Group(_indices(g["members"]), _indices(g["anchors"]),
                                         _whole(g["bytes"]), _flag(g["over_budget"]))
                                   for g in doc["groups"]),
                             _whole(doc["budget"]), _indices(doc["anchors"]))
        except (KeyError, TypeError, ValueError) as err:
            raise self._damaged(path, f"is not a group plan ({type(err).__name__}: {err})"
                                ) from None
        members = sorted(i for g in plan.groups for i in g.members)
        anchors = [*plan.anchors, *(i for g in plan.groups for i in g.anchors)]
        if members != list(range(n_archs)) or any(i >= n_archs for i in anchors):
            raise self._damaged(path, f"does not plan each of the shard's {n_archs} archs "
                                      "once")
        return plan

    def part(self, condition: Condition, group: int) -> Path:
        """The part file of one group."""
        return self.root / f"{condition.id}.group-{group:05d}.parquet"

    def write(self, condition: Condition, group: int, rows: list[dict[str, Any]]) -> None:
        """Store one group's rows (atomically); the group is no longer unfinished."""
        write_parquet(measurement_frame(rows), self.part(condition, group))
        remove_file(self._marker(condition, group))

    def _arch_rows_path(self, condition: Condition) -> Path:
        return self.root / f"{condition.id}.archs.parquet"

    def arch_rows(self, condition: Condition, archs: Collection[str]) -> dict[str, dict[str, Any]]:
        """The condition's per-arch rows stored so far, by arch id (``archs``: the shard's)."""
        path = self._arch_rows_path(condition)
        if not path.is_file():
            return {}
        fix = f"delete {path} (its archs are measured again) and {self.owner.rerun}"
        table = read_parquet(path, fix)
        if (table.schema.get("arch_id") != pl.String or "status" not in table.columns
                or table["arch_id"].is_duplicated().any()
                or not set(table["arch_id"]) <= set(archs)):
            raise ResumeStateError(f"{path}: not the per-arch rows of this shard's archs; {fix}")
        check_values(table, path, fix)
        return {row["arch_id"]: row for row in table.to_dicts()}

    def write_arch_rows(self, condition: Condition, rows: Sequence[dict[str, Any]]) -> None:
        """Store the condition's per-arch rows measured so far (atomically)."""
        write_parquet(measurement_frame(list(rows)), self._arch_rows_path(condition))

    def _marker(self, condition: Condition, group: int) -> Path:
        return self.root / f"{condition.id}.group-{group:05d}.started.json"

    def started(self, condition: Condition, group: int, planned: int, free: int) -> None:
        """Mark a group as started: when, the memory it planned on and the memory free then,
        and the kernel's OOM kills so far."""
        atomic_write_json(self._marker(condition, group),
                          {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "pid": os.getpid(),
                           "planned_gib": round(planned / GB, 3), "free_gib": round(free / GB, 3),
                           "oom_kills": oom_kills()})

    def failed(self, condition: Condition, group: int, error: BaseException) -> None:
        """Record on the group's marker the error that ended it."""
        path = self._marker(condition, group)
        doc = self._json(path) if path.is_file() else {}
        atomic_write_json(path, {**doc, "error": f"{type(error).__name__}: {error}"})

    def unfinished(self, condition: Condition, group: int) -> str | None:
        """Why an earlier run did not finish the group (None: it never started it)."""
        path = self._marker(condition, group)
        if not path.is_file():
            return None
        doc = self._json(path)
        if not isinstance(doc, dict):
            raise self._damaged(path, "is not a group's start marker")
        if doc.get("error"):
            return f"it failed: {doc['error']}"
        when = (f"started {doc.get('started')} by process {doc.get('pid')}, planned on "
                f"{doc.get('planned_gib')} GiB with {doc.get('free_gib')} GiB free")
        before, now = doc.get("oom_kills"), oom_kills()
        if isinstance(before, int) and now is not None and now > before:
            return (f"{when}, it was ended while the kernel's OOM killer ran ({now - before} "
                    "kill(s) since): out of memory, other processes' or this plan's")
        return (f"{when}, it was ended without an error (interrupted, or killed; the "
                "kernel's OOM killer did not run since)")

    def rows(self, condition: Condition, index: int, group: Group, archs: Sequence[Arch]
             ) -> list[dict[str, Any]] | None:
        """The stored rows of group ``index`` (of ``archs``), or None when it was not measured
        yet. Stored rows must be the group's: one per member, and anchors' timing rows."""
        path = self.part(condition, index)
        if not path.is_file():
            return None
        fix = f"delete {path} (its group is measured again) and {self.owner.rerun}"
        table = read_parquet(path, fix)
        missing = [c for c, dtype in GROUP_COLUMNS.items()
                   if table.schema.get(c) not in (dtype, pl.Null)]
        if missing:
            raise ResumeStateError(f"{path}: not a group's rows (columns {', '.join(missing)} "
                                   f"missing or of another type); {fix}")
        own = table.filter(~pl.col("latency_anchor_only").fill_null(False))["arch_id"]
        timing = set(table.filter(pl.col("latency_anchor_only"))["arch_id"])
        if (Counter(own.to_list()) != Counter(archs[i].id for i in group.members)
                or not timing <= {archs[i].id for i in group.anchors}):
            raise ResumeStateError(f"{path}: its rows are not those of the group's "
                                   f"{len(group.members)} archs; {fix}")
        check_values(table, path, fix)
        return table.to_dicts()

    def _finished_path(self, condition: Condition) -> Path:
        return self.root / f"{condition.id}.rows.parquet"

    def finished(self, condition: Condition, archs: Sequence[Arch]
                 ) -> list[dict[str, Any]] | None:
        """The stored rows of a finished condition (one per arch of ``archs``), or None."""
        path = self._finished_path(condition)
        if not path.is_file():
            return None
        fix = f"delete {path} (its condition is measured again) and {self.owner.rerun}"
        table = read_parquet(path, fix)
        if (table.schema.get("arch_id") != pl.String
                or Counter(table["arch_id"].to_list()) != Counter(a.id for a in archs)):
            raise ResumeStateError(f"{path}: not one row per arch of this campaign; {fix}")
        check_values(table, path, fix)
        return table.to_dicts()

    def write_finished(self, condition: Condition, rows: Sequence[dict[str, Any]]) -> None:
        """Store a finished condition's rows (atomically)."""
        write_parquet(measurement_frame(list(rows)), self._finished_path(condition))

    def remove(self) -> None:
        """Delete the folder (once the campaign's table is written)."""
        remove_own_dir(self.root, self.owner.command)


def check_values(table: pl.DataFrame, path: Path, fix: str) -> None:
    """Raise :class:`ResumeStateError` naming ``path``, the column, the arch and the value
    unless every measured value of ``table`` that is not null is a finite number within its
    unit's bounds (:func:`~hwgptbench.metrics.measured_bounds`, as the tables read from
    outside are checked): a stored part is reused only if a fresh measurement could have
    written it."""
    for column, bounds in measured_bounds().items():
        if column not in table.columns:
            continue
        if not table.schema[column].is_numeric() and table.schema[column] != pl.Null:
            raise ResumeStateError(f"{path}: column {column} is {table.schema[column]}, not "
                                   f"numbers; {fix}")
        values = table[column].cast(pl.Float64)
        bad = values.is_not_null() & (~values.is_finite() | (values < bounds.low)
                                      | (values > bounds.high))
        if bad.any():
            row = int(bad.arg_true()[0])
            arch = table["arch_id"][row] if "arch_id" in table.columns else f"row {row}"
            raise ResumeStateError(
                f"{path}: {column} {values[row]!r} of arch {arch} is not a measured value "
                f"(finite, within [{bounds.low:g}, {bounds.high:g}]: {bounds.words}); {fix}")


def _indices(values: Any) -> tuple[int, ...]:
    """A plan's list of arch indices."""
    if not isinstance(values, list):
        raise TypeError(f"{values!r:.60} is not a list of arch indices")
    return tuple(_whole(v) for v in values)


def _whole(value: Any) -> int:
    """A plan's count or index: a whole number, at least 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r:.60} is not a whole number")
    return value


def _flag(value: Any) -> bool:
    """A plan's boolean."""
    if not isinstance(value, bool):
        raise TypeError(f"{value!r:.60} is not a boolean")
    return value
