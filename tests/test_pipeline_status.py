"""`hwgptbench status`: one line per pipeline (hwgptbench.pipeline.status)."""

from __future__ import annotations

from hwgptbench.pipeline.status import summary

STAGES = {"dvc.yaml": ["data", "search@tiny"], "paper/dvc.yaml": ["paper/dvc.yaml:paper"]}


def test_a_pipeline_that_never_ran_is_not_built_and_the_rest_current() -> None:
    stale = {"paper/dvc.yaml:paper": [{"changed deps": {"src/hwgptbench/cli.py": "modified"}}]}
    assert summary(STAGES, stale, {"dvc.yaml"}) == [
        "dvc.yaml: current (2 stages)", "paper/dvc.yaml: not built (make paper builds it)"]


def test_stages_not_current_are_named_with_where_to_look() -> None:
    stale = {"search@tiny": [{"changed deps": {"src/hwgptbench/metrics.py": "modified"}}],
             "paper/dvc.yaml:paper": [{"changed outs": {"results/paper": "deleted"}}]}
    assert summary(STAGES, stale, {"dvc.yaml", "paper/dvc.yaml"}) == [
        "dvc.yaml: 1 of 2 stages not current: search@tiny (`dvc status dvc.yaml` says what "
        "changed; make run rebuilds them)",
        "paper/dvc.yaml: 1 of 1 stages not current: paper/dvc.yaml:paper (`dvc status "
        "paper/dvc.yaml` says what changed; make paper rebuilds them)"]
    # the workflow's own pipeline is never "not built": before `make run` its stages are stale
    assert summary({"dvc.yaml": ["data"]}, {"data": []}, set())[0].startswith(
        "dvc.yaml: 1 of 1 stages not current: data")
