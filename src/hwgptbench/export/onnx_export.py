"""``model.onnx``: the fixed GPT in ONNX (dynamic batch and sequence length), run by ONNX Runtime.

The file is converted from the ``torch.export`` program of :mod:`.pt2` by the dynamo exporter
(``torch.onnx.export(..., dynamo=True)``, which needs ``onnx`` and ``onnxscript``). The
TorchScript exporter (``dynamo=False``, deprecated since torch 2.9) cannot trace the model: the
attention's ``is_causal=T > 1`` becomes a traced tensor that ``scaled_dot_product_attention``
refuses. The module is not named ``onnx.py``, which would shadow the library's name.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.export import ExportedProgram

from ..model import GPT
from ..settings.compress import TimingSettings
from .check import Logits

FILE = "model.onnx"
INPUT, OUTPUT = "input_ids", "logits"
INSTALL_HINT = "pip install 'hwgptbench[export]'"


def unavailable_reason() -> str | None:
    """Why the ONNX file cannot be written here (a missing library), or None."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as err:
        return (f"the ONNX exporter needs onnx and onnxscript, {err.name} is not installed: "
                f"{INSTALL_HINT}")
    return None


def _onnxruntime() -> Any:
    """The onnxruntime module, or an ImportError naming the fix."""
    try:
        import onnxruntime
    except ImportError as err:
        raise ImportError(f"running an ONNX model needs onnxruntime: {INSTALL_HINT}") from err
    return onnxruntime


def runtime_available() -> bool:
    """Whether ONNX Runtime is installed (to run the file's logits check)."""
    try:
        _onnxruntime()
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _quiet_optimizer() -> Iterator[None]:
    """The ONNX graph optimizer's loggers at WARNING (they log every rewrite at INFO)."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def save(program: ExportedProgram, folder: Path) -> list[Path]:
    """Write ``model.onnx`` (plus ``model.onnx.data`` past ONNX's 2 GB limit); the files."""
    with _quiet_optimizer():
        onnx_program = torch.onnx.export(program, input_names=[INPUT], output_names=[OUTPUT],
                                         dynamo=True, verbose=False)
    assert onnx_program is not None  # None only from the TorchScript exporter
    from ..outputs import atomic_files

    with atomic_files(folder) as staging:
        onnx_program.save(staging / FILE)
    return sorted(folder.glob(f"{FILE}*"))


def load(folder: Path, threads: int | None = None) -> Logits:
    """ids -> logits of the ``model.onnx`` in folder, on ONNX Runtime's CPU provider
    (``threads``: its intra-op threads, default ONNX Runtime's choice)."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings about a graph (an old opset, a
    # shape merge) are lines of their own on stderr; a graph it cannot run is one ModelFileError
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(folder / FILE), options,
                                   providers=["CPUExecutionProvider"])

    def run(ids: Tensor) -> Tensor:
        return torch.from_numpy(session.run([OUTPUT], {INPUT: ids.cpu().numpy()})[0])

    return run


@torch.no_grad()
def latency(model: GPT, folder: Path, ids: Tensor, timing: TimingSettings,
            threads: int | None = None) -> dict[str, Any]:
    """ms per forward of ids through ONNX Runtime and through the eager model (fp32, on the
    CPU, ``threads`` intra-op threads for both, default each library's choice), timed
    interleaved (:func:`~hwgptbench.meters.latency.measure_latency_interleaved`, ``timing``:
    a ``compress.timing`` section, its estimator included), and their ratio."""
    from ..meters.latency import measure_latency_interleaved
    from ..meters.prefill import timing_kwargs

    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ValueError("latency compares on the CPU: move the model there first")
    onnx_run = load(folder, threads)
    ids = ids.cpu()
    torch_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        onnx_stats, eager_stats = measure_latency_interleaved(
            [lambda: onnx_run(ids), lambda: model(ids)], torch.device("cpu"),
            **timing_kwargs(timing, torch.device("cpu")))
    finally:
        torch.set_num_threads(torch_threads)
    onnx_ms, eager_ms = onnx_stats["latency_ms"], eager_stats["latency_ms"]
    return {"onnxruntime_ms": onnx_ms, "torch_eager_ms": eager_ms,
            "onnxruntime_vs_eager": onnx_ms / eager_ms, "threads": threads,
            "shape": list(ids.shape)}
