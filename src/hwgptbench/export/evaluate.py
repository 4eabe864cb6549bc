"""Evaluation of an export folder (:mod:`hwgptbench.export.write`): the project's offline tasks
and lm-eval's tasks, run on the exported model files rather than the checkpoint they came from.

The offline tasks run on the data stage's held-out (``val``) split, for any format: ``cloze``
(:func:`hwgptbench.evaluation.tasks.build_cloze` / ``score_cloze``, the items of
``compress.evaluate.cloze``) and ``perplexity`` (the mean loss over ``batches`` seeded windows
of the model's whole context, ``compress.evaluate``'s batches, batch size and seed). Every
other task name (or a task YAML file) goes to lm-eval: an ``hf`` folder that holds its
tokenizer through lm-eval's own ``hf`` model, the other formats (and an ``hf`` folder without
a tokenizer) through :mod:`hwgptbench.evaluation.lm_eval_adapter` with the data stage's
tokenizer. lm-eval runs with the Hugging Face hub offline: a task whose data is not in the
local cache is a :class:`~hwgptbench.errors.UserError` that says how to provide it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..outputs import write_json_output
from ..params import load_typed
from ..settings.compress import ClozeSettings, CompressEvaluation, EvaluateSettings
from ..versions import library_versions
from . import manifest as export_manifest
from .check import Logits
from .write import FORMATS, HF_FOLDER, load_exported

log = logging.getLogger(__name__)

RESULT_FORMAT = "hwgptbench-evaluate/1"
OFFLINE_TASKS = ("cloze", "perplexity")
DEFAULT_TASKS = OFFLINE_TASKS
# the default format of an export folder: the first of these it holds
PREFERENCE = ("hf", "pt2", "onnx")
# params.yaml's compress.evaluate (``--params`` reads it from a params file)
DEFAULTS = EvaluateSettings(batches=4, batch_size=16, seed=99, device="auto",
                            cloze=ClozeSettings(items=100, context_len=48, choice_len=16,
                                                choices=4, seed=7))
PERPLEXITY_KEYS = ("batches", "batch_size", "seed")  # what the perplexity task reads of it
MAX_LOSS = 709.0  # a mean loss whose exponential is a float; above it the perplexity is inf
LIBRARIES = ("torch", "transformers", "tokenizers", "onnxruntime", "lm-eval", "datasets")
OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
DATA_HINT = ("lm-eval never downloads here: on a machine with network access load the task "
             "once (python -c \"import lm_eval.tasks as t; t.TaskManager().load(['{task}'])\", "
             "or datasets.load_dataset of its dataset_path) to fill the Hugging Face datasets "
             "cache, then copy that cache here (~/.cache/huggingface/datasets) or point "
             "HF_DATASETS_CACHE (or HF_HOME) at it")


def defaults(params_files: Sequence[str] | None) -> EvaluateSettings:
    """The cloze and perplexity settings: :data:`DEFAULTS`, or compress.evaluate of the params
    files."""
    if not params_files:
        return DEFAULTS
    compress = load_typed(params_files, ["compress"]).compress
    return CompressEvaluation.of(compress, "export-evaluate").evaluate


def overridden(settings: EvaluateSettings, cloze: dict[str, int], perplexity: dict[str, int]
               ) -> EvaluateSettings:
    """settings with the cloze values and the perplexity ones (of :data:`PERPLEXITY_KEYS`)
    replaced."""
    return EvaluateSettings.model_validate({
        **settings.model_dump(), "cloze": {**settings.cloze.model_dump(), **cloze},
        **{key: perplexity[key] for key in PERPLEXITY_KEYS if key in perplexity}})


def written_formats(manifest: dict[str, Any]) -> list[str]:
    """The formats an export folder holds (not skipped), in :data:`FORMATS` order."""
    return [fmt for fmt in FORMATS
            if fmt in manifest["formats"] and "skipped" not in manifest["formats"][fmt]]


def pick_format(folder: Path, manifest: dict[str, Any], fmt: str | None) -> str:
    """fmt, else the first format of :data:`PREFERENCE` the folder holds."""
    held = written_formats(manifest)
    if fmt is not None:
        return fmt  # load_exported says why a format it does not hold is missing
    for candidate in PREFERENCE:
        if candidate in held:
            return candidate
    raise UserError(f"{folder} holds no model file (formats: {manifest['formats']}); export "
                    "the arch again")


class ImplausibleScore(UserError, ValueError):
    """A task's score that is not a finite number (a model whose logits are NaN or inf): never
    written as a result."""


def check_scores(results: dict[str, dict[str, Any]], folder: Path, fmt: str) -> None:
    """Raise :class:`ImplausibleScore` naming the model file, the task, the score and its value
    unless every number of each task's results is finite (lm-eval's standard errors, which it
    leaves NaN where it cannot estimate one, aside)."""
    for task, scores in results.items():
        for name, value in scores.items():
            if (isinstance(value, float) and not math.isfinite(value)
                    and not name.endswith("_stderr")):
                raise ImplausibleScore(
                    f"{folder} ({fmt}): task {task} scored {name} {value!r}, not a finite "
                    "number: the model's logits are not finite (a corrupt or tampered model "
                    "file, or weights that overflow in this format); export the arch again "
                    "(`hwgptbench export`), or evaluate another format (--format)")


def _check_cloze(settings: ClozeSettings, block_size: int) -> None:
    """UserError when a cloze item does not fit the model's context."""
    length = settings.context_len + settings.choice_len - 1
    if length > block_size:
        raise UserError(f"cloze: context_len + choice_len - 1 = {length} tokens exceed the "
                        f"model's block size {block_size}: pass a smaller --cloze-context-len "
                        "or --cloze-choice-len")


def cloze_task(run: Logits, val: Sequence[Any], settings: ClozeSettings, block_size: int,
               batch_size: int) -> dict[str, float | int]:
    """:func:`~hwgptbench.evaluation.tasks.score_cloze` of the model on items of the val split."""
    from ..evaluation.tasks import build_cloze, score_cloze

    _check_cloze(settings, block_size)
    try:
        items = build_cloze(val, settings.items, settings.context_len, settings.choice_len,
                            settings.choices, settings.seed)
    except ValueError as err:
        raise UserError(f"cloze: {err}") from err
    return score_cloze(run, items, batch_size=batch_size)


@torch.inference_mode()
def perplexity_task(run: Logits, val: Sequence[Any], settings: EvaluateSettings,
                    block_size: int) -> dict[str, float | int]:
    """Mean next-token loss and perplexity over seeded windows of block_size tokens of val."""
    from ..evaluation.perplexity import validation_batches

    try:
        batches = validation_batches(val, block_size, settings.batches, settings.batch_size,
                                     settings.seed)
    except ValueError as err:
        raise UserError(f"perplexity: {err}") from err
    losses = [float(F.cross_entropy(run(x).float().flatten(0, 1), y.flatten()))
              for x, y in batches]
    loss = sum(losses) / len(losses)
    perplexity = math.inf if loss > MAX_LOSS else math.exp(loss)  # NaN stays NaN
    return {"val_loss": loss, "perplexity": perplexity, "seq_len": block_size,
            "tokens": sum(y.numel() for _, y in batches)}


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """The Hugging Face hub and datasets offline: the environment variables for libraries
    imported later, the flags of those already imported (each read its variable on import);
    all restored after."""
    saved_env = {name: os.environ.get(name) for name in OFFLINE_ENV}
    flags = [("huggingface_hub.constants", "HF_HUB_OFFLINE"),
             ("datasets.config", "HF_HUB_OFFLINE"), ("datasets.config", "HF_DATASETS_OFFLINE")]
    saved_flags = []
    os.environ.update({name: "1" for name in OFFLINE_ENV})
    for module_name, flag in flags:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, flag):
            saved_flags.append((module, flag, getattr(module, flag)))
            setattr(module, flag, True)
    try:
        yield
    finally:
        for module, flag, value in saved_flags:
            setattr(module, flag, value)
        for name, old in saved_env.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def _lm_eval() -> Any:
    """The ``lm_eval`` package, or a UserError that says how to install it."""
    from ..evaluation.lm_eval_adapter import import_lm_eval

    try:
        return import_lm_eval()
    except ImportError as err:
        raise UserError(str(err)) from err


def task_manager(tasks: Sequence[str]) -> Any:
    """An lm-eval TaskManager that has loaded each task once, offline (its data then comes
    from the local cache): UserError for an unknown task or one whose data is not local. Only
    YAML files of tasks skip the index of lm-eval's own tasks (seconds to build)."""
    _lm_eval()
    from lm_eval.tasks import TaskManager

    files_only = all(Path(task).suffix in (".yaml", ".yml") and Path(task).is_file()
                     for task in tasks)
    manager = TaskManager(include_defaults=not files_only)
    for task in tasks:
        try:
            manager.load([task])
        except KeyError as err:
            raise UserError(f"lm-eval task {task!r}: unknown to lm-eval (`lm-eval ls "
                            "tasks` lists its tasks), and not a task YAML file; the "
                            f"offline tasks are {', '.join(OFFLINE_TASKS)}") from err
        except OSError as err:  # ConnectionError, FileNotFoundError, DatasetNotFoundError
            raise UserError(f"lm-eval task {task!r}: its data is not on this machine "
                            f"({type(err).__name__}: {err}); "
                            + DATA_HINT.format(task=task)) from err
    return manager


def _metrics(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """lm-eval's results as the adapter returns them: numbers only, the default filter's
    ``,none`` suffix dropped."""
    return {task: {name.removesuffix(",none"): float(value) for name, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
            for task, values in results.items()}


def lm_eval_tasks(run: Logits | None, hf_dir: Path | None, tokenizer: Any, block_size: int,
                  tasks: Sequence[str], manager: Any, batch_size: int,
                  limit: int | float | None, num_fewshot: int | None
                  ) -> dict[str, dict[str, float]]:
    """lm-eval's metrics of each task (and of a group's subtasks), offline, the tasks from
    manager (:func:`task_manager`): through lm-eval's own ``hf`` model on the Hugging Face
    folder hf_dir, or (hf_dir None) through the adapter on the exported callable run."""
    lm_eval = _lm_eval()
    with hub_offline():
        if hf_dir is not None:
            output = lm_eval.simple_evaluate(
                model="hf", model_args={"pretrained": str(hf_dir), "dtype": "float32",
                                        "max_length": block_size},
                tasks=list(tasks), device="cpu", batch_size=batch_size, task_manager=manager,
                limit=limit, num_fewshot=num_fewshot)
            return _metrics(output["results"])
        from ..evaluation.lm_eval_adapter import evaluate_tasks

        assert run is not None
        return evaluate_tasks(run, tokenizer, block_size, tasks, batch_size=batch_size,
                              limit=limit, num_fewshot=num_fewshot, task_manager=manager)


def _own_hf(folder: Path, manifest: dict[str, Any], fmt: str) -> Path | None:
    """The Hugging Face folder, when fmt is hf, written, with its tokenizer (lm-eval's hf
    model needs one); else None (lm-eval runs through the adapter)."""
    if fmt != "hf" or fmt not in written_formats(manifest):
        return None
    hf_dir = folder / HF_FOLDER
    if (hf_dir / "tokenizer.json").is_file():
        return hf_dir
    log.warning("%s has no tokenizer (export with --tokenizer): lm-eval runs the folder through "
                "the hwgptbench adapter with the data stage's tokenizer", hf_dir)
    return None


def _load(folder: Path, fmt: str) -> Logits:
    try:
        return load_exported(folder, fmt)
    except ImportError as err:
        raise UserError(f"format {fmt}: {err}") from err


def _check_tokenizer(tokenizer: Any, vocab_size: int, data_dir: Path) -> None:
    if tokenizer.get_vocab_size() > vocab_size:
        raise UserError(f"{data_dir}: its tokenizer has {tokenizer.get_vocab_size()} tokens, "
                        f"more than the model's vocab_size {vocab_size}: pass the data folder "
                        "the model was trained on")


def evaluate_export(folder: str | Path, data_dir: str | Path, fmt: str | None = None,
                    tasks: Sequence[str] = DEFAULT_TASKS,
                    settings: EvaluateSettings = DEFAULTS, batch_size: int = 16,
                    limit: int | float | None = None, num_fewshot: int | None = None
                    ) -> dict[str, Any]:
    """The results of the fmt model of an export folder (default: :func:`pick_format`) on
    tasks: :data:`OFFLINE_TASKS` with settings (default :data:`DEFAULTS`), the rest lm-eval's
    (``limit`` examples of each, ``num_fewshot`` shots)."""
    from ..tokens.shards import TokenShards

    folder, data_dir = Path(folder), Path(data_dir)
    if not folder.is_dir():
        raise UserError(f"--model {folder}: no such folder; pass an export folder written by "
                        "`hwgptbench export`")
    if not tasks:
        raise UserError(f"no tasks: give --tasks ({', '.join(OFFLINE_TASKS)} or lm-eval's)")
    manifest = export_manifest.read(folder)
    fmt = pick_format(folder, manifest, fmt)
    offline = [task for task in dict.fromkeys(tasks) if task in OFFLINE_TASKS]
    remote = [task for task in dict.fromkeys(tasks) if task not in OFFLINE_TASKS]
    hf_dir = _own_hf(folder, manifest, fmt) if remote else None
    # loaded (and checked: docs/security.md) first, unless lm-eval's hf model alone runs it
    # (that loads the folder itself)
    run = _load(folder, fmt) if offline or hf_dir is None else None
    shards = TokenShards.open(data_dir)
    tokenizer = shards.tokenizer()
    _check_tokenizer(tokenizer, manifest["vocab_size"], data_dir)
    block_size = int(manifest["block_size"])
    if "cloze" in offline:
        _check_cloze(settings.cloze, block_size)
    manager = None
    if remote:  # before the offline tasks: a task lm-eval cannot load fails at once
        with hub_offline():
            manager = task_manager(remote)
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    used: dict[str, Any] = {}
    val = shards.split("val")
    for task in offline:
        assert run is not None
        start = time.perf_counter()
        if task == "cloze":
            results[task] = cloze_task(run, val, settings.cloze, block_size, batch_size)
            used[task] = settings.cloze.model_dump(mode="json")
        else:
            results[task] = perplexity_task(run, val, settings, block_size)
            used[task] = {key: getattr(settings, key) for key in PERPLEXITY_KEYS}
        seconds[task] = time.perf_counter() - start
        log.info("%s %s: %s", fmt, task, results[task])
    if remote:
        start = time.perf_counter()
        if hf_dir is not None:
            run = None  # lm-eval's hf model loads its own copy
        results |= lm_eval_tasks(run, hf_dir, tokenizer, block_size, remote, manager,
                                 batch_size, limit, num_fewshot)
        seconds["lm_eval"] = time.perf_counter() - start
        used["lm_eval"] = {"tasks": remote, "model": "hf" if hf_dir else "hwgptbench",
                           "limit": limit, "num_fewshot": num_fewshot}
    check_scores(results, folder, fmt)
    return {"result_format": RESULT_FORMAT, "model": str(folder), "format": fmt,
            "arch": manifest["arch"], "family": manifest["family"],
            "source": manifest.get("source", {}), "data": str(data_dir),
            "batch_size": batch_size, "tasks": results, "settings": used, "seconds": seconds,
            "versions": library_versions(*LIBRARIES)}


def write_results(results: dict[str, Any], out: str | Path) -> None:
    """The results as JSON at out, atomically, marked as written by ``hwgptbench evaluate``
    (docs/security.md: an output replaces only what the same command wrote)."""
    write_json_output(results, out, "evaluate")
