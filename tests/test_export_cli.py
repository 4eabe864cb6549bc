"""`hwgptbench export` and `hwgptbench evaluate` through the command line: a tiny random
supernet's uniform sub-network exported as pt2 and a Hugging Face folder, then the offline
cloze and perplexity tasks (equal across formats, whose logits are equal), an lm-eval task of
local data through lm-eval's own hf model and through the adapter, and the errors for data
that is not local, a missing folder and a missing format. fp32 on the CPU."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from conftest import REPO_ROOT
from hwgptbench.cli import main
from hwgptbench.export.evaluate import DEFAULTS
from hwgptbench.io import save_torch
from hwgptbench.model import SuperGPT
from hwgptbench.settings.compress import EvaluateSettings
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training.train import supernet_state

SPACE = {"embed_dim": [32, 64], "n_layer": [2, 3], "n_head": [2, 4], "mlp_ratio": [2, 4],
         "bias": [True, False], "head_size": 16, "block_size": 32, "rotary_fraction": 0.25}
ARCH = Arch(64, 2, (4, 4), (2, 2), True)  # uniform, 4 heads of 16 = embed_dim: every format
SMALL = ["--cloze-items", "24", "--cloze-context-len", "16", "--cloze-choice-len", "8",
         "--ppl-batches", "2", "--ppl-batch-size", "4"]


def cli(*argv: str | Path) -> tuple[int, str, str]:
    """hwgptbench's exit status, stdout and stderr for argv."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(arg) for arg in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def exported(shakespeare: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ARCH of a random supernet exported by the CLI as pt2 and hf (with the tokenizer)."""
    torch.manual_seed(0)
    vocab = TokenShards.open(shakespeare).manifest["tokenizer"]["vocab_size"]
    model = SuperGPT(SearchSpace.from_dict("t", SPACE), vocab)
    folder = tmp_path_factory.mktemp("export_cli")
    save_torch(supernet_state(model, model.space, None, 0, "f"), folder / "supernet.pt")
    code, stdout, stderr = cli("export", "--checkpoint", folder / "supernet.pt", "--arch",
                               ARCH.id, "--out", folder / "out", "--formats", "pt2", "hf",
                               "--tokenizer", shakespeare / "tokenizer.json",
                               "--source-name", "tiny")
    assert (code, stdout) == (0, ""), stderr
    return folder / "out"


def evaluate(folder: Path, data: Path, out: Path, *extra: str) -> dict:
    code, stdout, stderr = cli("evaluate", "--model", folder, "--data", data, "--out", out,
                               *SMALL, *extra)
    assert (code, stdout) == (0, ""), stderr
    return json.loads(out.read_text())


def test_export_writes_the_manifest(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["arch"] == ARCH.id and sorted(manifest["formats"]) == ["hf", "pt2"]
    assert all(record["check"]["passed"] for record in manifest["formats"].values())
    source = manifest["source"]
    assert source["name"] == "tiny" and source["kind"] == "supernet" and source["space"] == "t"
    assert (exported / "model.pt2").is_file() and (exported / "hf" / "tokenizer.json").is_file()


def test_offline_tasks_agree_across_formats(exported: Path, shakespeare: Path,
                                            tmp_path: Path) -> None:
    default = evaluate(exported, shakespeare, tmp_path / "hf.json")  # hf: held, preferred
    pt2 = evaluate(exported, shakespeare, tmp_path / "pt2.json", "--format", "pt2")
    assert default["format"] == "hf" and pt2["format"] == "pt2"
    for result in (default, pt2):
        assert result["arch"] == ARCH.id and result["model"] == str(exported)
        assert set(result["tasks"]) == {"cloze", "perplexity"}
        assert result["settings"]["cloze"] == DEFAULTS.cloze.model_dump(
            mode="json", exclude_none=True) | {"items": 24, "context_len": 16, "choice_len": 8}
        assert result["versions"]["torch_version"] == torch.__version__
    cloze, ppl = pt2["tasks"]["cloze"], pt2["tasks"]["perplexity"]
    assert cloze["n_items"] == 24 and cloze["chance"] == 0.25 and 0 <= cloze["accuracy"] <= 1
    assert ppl["seq_len"] == 32 and ppl["tokens"] == 2 * 4 * 32 and ppl["perplexity"] > 1
    assert default["tasks"]["cloze"]["accuracy"] == cloze["accuracy"]
    for task, metric in [("cloze", "mean_loglik_correct"), ("perplexity", "val_loss")]:
        assert default["tasks"][task][metric] == pytest.approx(pt2["tasks"][task][metric],
                                                               rel=1e-5)


def test_lm_eval_task_of_local_data_runs_through_hf_and_the_adapter(
        exported: Path, shakespeare: Path, tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    rows = [{"context": "To be, or not to be,", "choices": [" that is", " the king", " my lord"],
             "answer": 0},
            {"context": "My lord, I", "choices": [" will", " thee", " sword"], "answer": 0}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = tmp_path / "local_choice.yaml"
    task.write_text(yaml.safe_dump({
        "task": "local_choice", "dataset_path": "json", "test_split": "train",
        "dataset_kwargs": {"data_files": {"train": str(tmp_path / "items.jsonl")}},
        "output_type": "multiple_choice", "doc_to_text": "{{context}}",
        "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}]}))
    results = [evaluate(exported, shakespeare, tmp_path / f"{fmt}.json", "--format", fmt,
                        "--tasks", str(task)) for fmt in ("hf", "pt2")]
    assert [r["settings"]["lm_eval"]["model"] for r in results] == ["hf", "hwgptbench"]
    accs = [r["tasks"]["local_choice"]["acc"] for r in results]
    assert accs[0] == accs[1] and 0 <= accs[0] <= 1


def test_lm_eval_task_whose_data_is_not_local_is_a_user_error(
        exported: Path, shakespeare: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lm_eval")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    task = tmp_path / "hub_task.yaml"  # a hub dataset that no cache holds
    task.write_text(yaml.safe_dump({
        "task": "hub_task", "dataset_path": "hwgptbench-tests/no-such-dataset",
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "{{q}}",
        "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}"}))
    code, stdout, stderr = cli("evaluate", "--model", exported, "--data", shakespeare,
                               "--out", tmp_path / "r.json", "--format", "pt2", *SMALL,
                               "--tasks", "cloze", str(task))
    assert code == 2 and stdout == ""
    assert f"lm-eval task '{task}': its data is not on this machine" in stderr
    assert "HF_DATASETS_CACHE" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "r.json").exists()
    assert "HF_HUB_OFFLINE" not in os.environ  # offline for the call only


def test_lm_eval_own_task_without_local_data_says_how_to_provide_it(
        exported: Path, shakespeare: Path, tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    import datasets.config
    import huggingface_hub.constants

    if ((Path(datasets.config.HF_DATASETS_CACHE) / "allenai___ai2_arc").exists()
            or (Path(huggingface_hub.constants.HF_HUB_CACHE) / "datasets--allenai--ai2_arc"
                ).exists()):
        pytest.skip("this machine's Hugging Face cache holds arc_easy's data")
    code, _, stderr = cli("evaluate", "--model", exported, "--data", shakespeare, "--out",
                          tmp_path / "r.json", "--tasks", "arc_easy")
    assert code == 2 and "lm-eval task 'arc_easy': its data is not on this machine" in stderr
    assert "allenai/ai2_arc" in stderr and "HF_DATASETS_CACHE" in stderr


def test_a_missing_folder_or_format_is_a_user_error(exported: Path, shakespeare: Path,
                                                    tmp_path: Path) -> None:
    for model, fmt, message in [(tmp_path / "nowhere", "pt2", "no such folder"),
                                (exported, "onnx", "holds no onnx export: not asked for")]:
        code, _, stderr = cli("evaluate", "--model", model, "--data", shakespeare, "--out",
                              tmp_path / "r.json", "--format", fmt)
        assert code == 2 and message in stderr, stderr
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(err):
        main(["evaluate", "--model", str(exported), "--data", str(shakespeare), "--out",
              str(tmp_path / "r.json"), "--format", "gguf"])
    assert exit_info.value.code == 2 and "'gguf' is not one of hf, onnx, pt2" in err.getvalue()


def test_the_defaults_are_those_of_params_yaml() -> None:
    evaluate = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["compress"]["evaluate"]
    assert DEFAULTS == EvaluateSettings.parse(evaluate)
