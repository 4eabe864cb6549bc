"""The resume folder of an interrupted measure shard (``{out}.parts/``: the inputs stamp, the
group plan of each condition, a parquet file per measured group) when a file of it is damaged:
refused with one message that names the file and what to delete, and the shard measures again
once that is done."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from conftest import REPO_ROOT
from hwgptbench import cli
from hwgptbench.campaign import shard as campaign
from hwgptbench.campaign.parts import COMMAND, ShardParts
from hwgptbench.errors import UserError
from hwgptbench.measure import stage
from hwgptbench.meters.condition import Condition
from hwgptbench.outputs import MARKER, make_own_dir
from test_measure_groups import ARCHS, SPACE, VOCAB, _budget_for, _section

CONDITION = Condition(1, 16, "fp32")
PLAN = f"{CONDITION.id}.plan.json"
GROUP = f"{CONDITION.id}.group-00000.parquet"
ARCH_ROWS = f"{CONDITION.id}.archs.parquet"
STARTED = f"{CONDITION.id}.group-00001.started.json"
RERUN = "rerun the same `hwgptbench measure` command"
SECTION = _section(memory_budget_gb=_budget_for(5))


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The resume folder of a shard killed while it timed its second group."""
    out = tmp_path_factory.mktemp("interrupted") / "shard.parquet"
    real = campaign._Campaign.measure_group

    def killed(self: Any, condition: Condition, group: Any, index: int) -> list[dict[str, Any]]:
        if index == 1:
            raise KeyboardInterrupt
        return real(self, condition, group, index)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(campaign._Campaign, "measure_group", killed)
        with pytest.raises(KeyboardInterrupt):
            stage.measure_shard(SECTION, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)
    parts = Path(f"{out}.parts")
    assert {p.name for p in parts.iterdir()} == {MARKER, "inputs.json", PLAN, GROUP, ARCH_ROWS,
                                                 STARTED}
    yield parts


def resume(interrupted: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the interrupted shard's folder beside a new output: (output, folder)."""
    out = tmp_path / "shard.parquet"
    parts = Path(f"{out}.parts")
    shutil.copytree(interrupted, parts)
    return out, parts


def measure(out: Path) -> pl.DataFrame:
    return stage.measure_shard(SECTION, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)


def plan_with(**changes: Any) -> Any:
    """The interrupted shard's plan with top-level fields changed."""
    return lambda doc: doc | changes


def first_group(change: Any) -> Any:
    """The interrupted shard's plan with its first group changed."""
    return lambda doc: doc | {"groups": [change(doc["groups"][0]), *doc["groups"][1:]]}


PLANS = {
    "not json": b"{\"groups\": [",
    "a list": b"[]",
    "no groups": plan_with(groups=None),
    "a fractional budget": plan_with(budget=1.5),
    "an index beyond the archs": first_group(lambda g: g | {"members": [*g["members"], 99]}),
    "an arch planned twice": first_group(lambda g: g | {"members": g["members"] * 2}),
    "a string flag": first_group(lambda g: g | {"over_budget": "no"}),
}


@pytest.mark.parametrize("case", list(PLANS), ids=list(PLANS))
def test_a_damaged_plan_names_the_folder_to_delete(case: str, interrupted: Path,
                                                   tmp_path: Path) -> None:
    out, parts = resume(interrupted, tmp_path)
    change = PLANS[case]
    plan = parts / PLAN
    plan.write_bytes(change if isinstance(change, bytes) else
                     json.dumps(change(json.loads(plan.read_text()))).encode())
    with pytest.raises(UserError) as refused:
        measure(out)
    message = str(refused.value)
    assert message.startswith(str(plan)) and "\n" not in message
    assert f"delete the folder {parts} (the shard is measured anew) and {RERUN}" in message
    if case == "not json":  # what the message says to do works
        shutil.rmtree(parts)
        assert measure(out).height == len(ARCHS)


def rows_of_other_archs(table: pl.DataFrame) -> pl.DataFrame:
    return table.with_columns(arch_id=pl.lit(ARCHS[0].id))


def refused_in_one_line(out: Path, damaged: Path, then: str) -> None:
    """The shard's rerun is refused in one line that names the damaged file and says to
    delete it (``then`` says what follows) and rerun."""
    with pytest.raises(UserError) as refused:
        measure(out)
    message = str(refused.value)
    assert message.startswith(str(damaged)) and "\n" not in message
    assert f"delete {damaged} ({then}) and {RERUN}" in message


GROUPS = {
    "garbage": lambda path: path.write_bytes(b"PAR1 not a parquet table PAR1"),
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:200]),
    "empty": lambda path: path.write_bytes(b""),
    "no latency column": lambda path: pl.read_parquet(path).drop("latency_ms").write_parquet(path),
    "a string status": lambda path: pl.read_parquet(path).with_columns(status=pl.lit(1))
    .write_parquet(path),
    "rows of other archs": lambda path: rows_of_other_archs(pl.read_parquet(path))
    .write_parquet(path),
    "a member missing": lambda path: pl.read_parquet(path).slice(1).write_parquet(path),
    "a null arch id": lambda path: pl.read_parquet(path).with_columns(
        arch_id=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("arch_id")))
    .write_parquet(path),
}


@pytest.mark.parametrize("case", list(GROUPS), ids=list(GROUPS))
def test_a_damaged_group_names_the_file_to_delete(case: str, interrupted: Path,
                                                  tmp_path: Path) -> None:
    out, parts = resume(interrupted, tmp_path)
    group = parts / GROUP
    GROUPS[case](group)
    refused_in_one_line(out, group, "its group is measured again")
    if case == "garbage":  # what the message says to do works
        group.unlink()
        assert sorted(measure(out)["arch_id"]) == sorted(a.id for a in ARCHS)


ARCH_ROW_DAMAGE = {
    "garbage": lambda path: path.write_bytes(b"PAR1 not a parquet table PAR1"),
    "rows of other archs": lambda path: pl.read_parquet(path).with_columns(
        arch_id=pl.lit("not-an-arch")).write_parquet(path),
    "an arch twice": lambda path: pl.concat([pl.read_parquet(path)] * 2).write_parquet(path),
}


@pytest.mark.parametrize("case", list(ARCH_ROW_DAMAGE), ids=list(ARCH_ROW_DAMAGE))
def test_damaged_per_arch_rows_name_the_file_to_delete(case: str, interrupted: Path,
                                                       tmp_path: Path) -> None:
    out, parts = resume(interrupted, tmp_path)
    rows = parts / ARCH_ROWS
    ARCH_ROW_DAMAGE[case](rows)
    refused_in_one_line(out, rows, "its archs are measured again")
    rows.unlink()
    assert sorted(measure(out)["arch_id"]) == sorted(a.id for a in ARCHS)


def test_a_damaged_start_marker_names_the_folder_to_delete(interrupted: Path,
                                                           tmp_path: Path) -> None:
    out, parts = resume(interrupted, tmp_path)
    (parts / STARTED).write_text("[")
    with pytest.raises(UserError, match=f"delete the folder {parts}"):
        measure(out)


def test_the_measure_command_refuses_a_damaged_stamp_in_one_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archs = tmp_path / "archs.parquet"
    pl.DataFrame({"arch_id": [a.id for a in ARCHS]}).write_parquet(archs)
    out = tmp_path / "shard.parquet"
    stamp = Path(f"{out}.parts") / "inputs.json"
    for content in ("{\"key\": ", "{\"key\": 7}"):
        make_own_dir(stamp.parent, COMMAND)
        stamp.write_text(content)
        code = cli.main(["measure", "--params", str(REPO_ROOT / "params.yaml"), "--scale",
                         "tiny", "--device", "auto", "--archs", str(archs), "--out", str(out),
                         "--vocab-size", str(VOCAB)])
        assert code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines()
                 if line.startswith("hwgptbench measure: error:")]
        assert len(lines) == 1 and f"{stamp}" in lines[0]
        assert f"delete the folder {stamp.parent}" in lines[0]
    shutil.rmtree(stamp.parent)
    stamp.parent.write_text("a file where the folder goes")
    with pytest.raises(UserError, match="is not a folder hwgptbench measure made"):
        ShardParts(stamp.parent, "key")
    assert stamp.parent.read_text() == "a file where the folder goes"


def test_a_resume_folder_the_command_did_not_make_is_kept(tmp_path: Path) -> None:
    """``{out}.parts`` of a user's (no marker of hwgptbench measure) is refused, not deleted
    as a stale resume state."""
    parts = tmp_path / "shard.parquet.parts"
    parts.mkdir()
    (parts / "inputs.json").write_text(json.dumps({"key": "other"}))
    (parts / "thesis.tex").write_text("mine")
    with pytest.raises(UserError, match="not a folder hwgptbench measure made"):
        ShardParts(parts, "key")
    assert sorted(p.name for p in parts.iterdir()) == ["inputs.json", "thesis.tex"]
