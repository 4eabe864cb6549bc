"""Post-training quantization of a model's ``nn.Linear`` layers: the one place that quantizes.

Methods, and the library behind each (speeds measured on a 2-core x86 CPU, torch 2.13, fp32,
batch 1 x 128 tokens; ``benchmarks/quantize_speed.py`` prints them):

- ``none``: an unchanged copy.
- ``int8_dynamic``: ``torch.ao.quantization.quantize_dynamic`` (CPU, fp32 models only): int8
  weights per output channel, activations quantized to int8 on the fly per tensor (7-bit range on
  the x86/fbgemm engine), int8 matmuls through FBGEMM with fp32 outputs. torch.ao is deprecated in
  favour of torchao but is the only fast int8 path on the CPU in eager mode: 1.2x (embed 256) to
  1.55x (embed 512) faster than fp32 on 4-layer project GPTs, none at embed 128 (0.95x); 3.6x on
  a bare Linear block 512-2048-512 at batch 64 (attention and the fp32 LM head dilute the gain).
- ``int8_weight_only``: torchao ``quantize_`` with ``Int8WeightOnlyConfig`` (per-row int8
  weights dequantized in the matmul; CPU and CUDA, any float dtype). On the CPU in eager mode it
  is slower than fp32 (0.82x to 0.88x the speed): it saves memory, not time, there.
- ``int4_weight_only``: torchao ``Int4WeightOnlyConfig`` in the layout torchao documents for
  CUDA (group size 32, tinygemm ``tile_packed_to_4d`` packing, HQQ parameters). Its kernels are
  CUDA only (compute capability >= 8.0, bf16); torchao 0.18 has no CPU int4 path for this config
  (its default ``plain`` packing needs the CUDA kernels of the extra package ``mslk``).

torchao is imported lazily (it is an optional dependency); its int8 dynamic-activation config is
left out because on the CPU it is fast only under ``torch.compile``. The LM head of the
``gpt_neox`` family is tied to the embedding (a functional product), so it and the embedding stay
unquantized; the ``llama`` family's untied ``nn.Linear`` head is quantized.
"""

from __future__ import annotations

import copy
import importlib
import io
import logging
import warnings
from types import ModuleType

import torch
import torch.nn as nn
from torch import Tensor

log = logging.getLogger(__name__)

METHODS = ("none", "int8_dynamic", "int8_weight_only", "int4_weight_only")
TORCHAO_CONFIGS = {"int8_weight_only": "Int8WeightOnlyConfig",
                   "int4_weight_only": "Int4WeightOnlyConfig"}
INT4_GROUP_SIZE = 32


class QuantizationUnsupported(RuntimeError):
    """The method cannot quantize this model on its device and dtype (the message says why)."""


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; methods: {', '.join(METHODS)}")


def _torchao() -> ModuleType | None:
    """The torchao package, or None where it does not import."""
    try:
        return importlib.import_module("torchao")
    except ImportError:
        return None


def backend_of(method: str) -> str:
    """The library, version and configuration that quantize with method."""
    _check_method(method)
    if method == "none":
        return f"torch {torch.__version__} (unquantized)"
    if method == "int8_dynamic":
        return (f"torch {torch.__version__} torch.ao.quantize_dynamic (int8 per-channel weights, "
                f"dynamic int8 activations, engine {torch.backends.quantized.engine})")
    torchao = _torchao()
    version = torchao.__version__ if torchao is not None else "(not installed)"
    config = TORCHAO_CONFIGS[method]
    if method == "int4_weight_only":
        config += f"(group_size={INT4_GROUP_SIZE}, tile_packed_to_4d, hqq)"
    return f"torchao {version} {config}"


def unsupported_reason(method: str, device: torch.device | str,
                       dtype: torch.dtype = torch.float32) -> str | None:
    """Why method cannot quantize a model of dtype on device, or None when it can."""
    _check_method(method)
    device = torch.device(device)
    if method == "none":
        return None
    if method == "int8_dynamic":
        if device.type != "cpu":
            return (f"int8_dynamic (torch.ao dynamic quantization) runs only on the CPU, not on "
                    f"{device.type}; use int8_weight_only (torchao) there")
        if dtype != torch.float32:
            return (f"int8_dynamic quantizes fp32 models (int8 matmuls with fp32 outputs); "
                    f"dtype {dtype} is not supported, use torch.float32")
        return None
    if device.type not in ("cpu", "cuda"):
        return f"{method} is run on cpu or cuda only, not on {device.type}"
    if method == "int4_weight_only":
        if device.type != "cuda":
            return (f"int4_weight_only (torchao 0.18 Int4WeightOnlyConfig) has no {device.type} "
                    "kernel: it needs a CUDA GPU of compute capability >= 8.0 and bf16 (tinygemm; "
                    "the default plain packing needs mslk's CUDA kernels); on the CPU use "
                    "int8_dynamic")
        if dtype != torch.bfloat16:
            return f"int4_weight_only computes in bf16; dtype {dtype} is not supported"
    if _torchao() is None:
        return f"{method} needs torchao: pip install torchao (the hwgptbench[quant] extra)"
    if method == "int4_weight_only":
        if not torch.cuda.is_available():
            return "int4_weight_only needs a CUDA device, and this torch sees none"
        capability = torch.cuda.get_device_capability(device)
        if capability[0] < 8:
            return ("int4_weight_only (tinygemm int4 kernel) needs CUDA compute capability >= "
                    f"8.0; {torch.cuda.get_device_name(device)} has {capability}")
    return None


def _device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's first Linear weight (CPU and fp32 where it has none)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            return module.weight.device, module.weight.dtype
    return torch.device("cpu"), torch.float32


def _torchao_config(method: str) -> object:
    """The torchao config of method; inductor settings are left alone (no global side effects)."""
    from torchao import quantization

    if method == "int8_weight_only":
        return quantization.Int8WeightOnlyConfig(set_inductor_config=False)
    return quantization.Int4WeightOnlyConfig(
        group_size=INT4_GROUP_SIZE, int4_packing_format="tile_packed_to_4d",
        int4_choose_qparams_algorithm="hqq", set_inductor_config=False)


def quantize(model: nn.Module, method: str, example_input: Tensor | None = None) -> nn.Module:
    """A copy of model with its ``nn.Linear`` layers quantized by method (the model itself is
    left unchanged). With example_input, one forward is run on it, so that a failure only running
    reveals raises here. Raises :class:`QuantizationUnsupported` when the method cannot run."""
    device, dtype = _device_dtype(model)
    reason = unsupported_reason(method, device, dtype)
    if reason is not None:
        raise QuantizationUnsupported(reason)
    quantized = copy.deepcopy(model)
    linears = sum(isinstance(m, nn.Linear) for m in quantized.modules())
    if method == "int8_dynamic":
        with warnings.catch_warnings():  # torch.ao and quantized tensors announce deprecation
            warnings.simplefilter("ignore")
            torch.ao.quantization.quantize_dynamic(
                quantized, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
                dtype=torch.qint8, inplace=True)
    elif method != "none":
        from torchao.quantization import quantize_

        quantize_(quantized, _torchao_config(method))
        plain = sum(isinstance(m, nn.Linear) and type(m.weight) in (Tensor, nn.Parameter)
                    for m in quantized.modules())
        if plain:
            log.warning("%s left %d of %d Linear layers unquantized (shape not supported)",
                        method, plain, linears)
    if example_input is not None:
        try:
            with torch.inference_mode():
                quantized(example_input)
        except (RuntimeError, NotImplementedError, AssertionError, ValueError) as err:
            raise QuantizationUnsupported(f"{method} model does not run on {device}: "
                                          f"{str(err).strip() or type(err).__name__}") from err
    log.info("quantized %d Linear layers: %s", linears, backend_of(method))
    return quantized


def _serialized_bytes(state: dict[str, object]) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


def model_size_bytes(model: nn.Module) -> int:
    """Bytes of the model's state_dict serialized with ``torch.save`` (packed int8 and torchao
    tensors at their stored size)."""
    return _serialized_bytes(model.state_dict())


def linear_weight_bytes(model: nn.Module) -> int:
    """Serialized bytes of the weights of the model's Linear layers, float or quantized (with
    their quantization scales and zero points; biases left out)."""
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    weights = {name: module.weight() if isinstance(module, dynamic) else module.weight
               for name, module in model.named_modules()
               if isinstance(module, (nn.Linear, dynamic))}
    return _serialized_bytes(weights)
