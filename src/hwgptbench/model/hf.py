"""Import a Hugging Face LLaMA-family causal LM checkpoint into the fixed llama GPT.

A checkpoint directory on local disk (``config.json`` plus weights, as written by
``save_pretrained``) is read with ``transformers`` (an optional dependency:
``pip install 'hwgptbench[hf]'``) and copied into a :class:`~hwgptbench.model.GPT` of the
``llama`` family whose logits equal the Hugging Face model's.

The config maps to ``GPTConfig(Arch(hidden_size, num_hidden_layers, (num_attention_heads,) * L,
(intermediate_size / hidden_size,) * L, bias=False), vocab_size, block_size, head_dim, 1.0,
"llama", n_kv_head, rope_theta, rms_norm_eps)``: ``block_size`` is the caller's or
``max_position_embeddings``; the MLP ratio is the float whose ``int(ratio * hidden_size)`` gives
``intermediate_size`` back exactly; ``n_kv_head`` is ``num_key_value_heads`` for grouped-query
attention and 0 (one key/value head per query head) when it equals ``num_attention_heads``, so
that sub-networks with fewer heads stay multi-head attention. The weights map as

=====================================================  =============================
Hugging Face (``model.state_dict()``)                   GPT
=====================================================  =============================
``model.embed_tokens.weight``                           ``wte.weight``
``model.layers.{i}.input_layernorm.weight``             ``blocks.{i}.ln1.weight``
``model.layers.{i}.self_attn.{q,k,v}_proj.weight``      ``blocks.{i}.attn.qkv.weight``
                                                        (rows q, then k, then v)
``model.layers.{i}.self_attn.o_proj.weight``            ``blocks.{i}.attn.proj.weight``
``model.layers.{i}.post_attention_layernorm.weight``    ``blocks.{i}.ln2.weight``
``model.layers.{i}.mlp.{gate,up,down}_proj.weight``     ``blocks.{i}.mlp.{gate,up,proj}.weight``
``model.norm.weight``                                   ``ln_f.weight``
``lm_head.weight`` (``embed_tokens`` when tied)         ``lm_head.weight``
=====================================================  =============================

Both use the same head layout (query head i reads key/value head i // group) and the same
rotate-half rotary over the whole head, so no permutation is needed. A checkpoint with
``tie_word_embeddings`` gets a copy of its embedding as the (untied) LM head of the GPT: equal
logits, but the two no longer stay equal under fine-tuning.

Accepted are ``model_type`` ``llama`` and ``mistral`` (the same modules; Mistral's
``sliding_window`` only when it is unset or covers ``block_size``, where it masks nothing).
Rejected, with a ValueError naming the config field, is everything that would change the math
of the fixed GPT: another ``model_type``; rope scaling (``rope_parameters``/``rope_scaling``
with a ``rope_type`` other than ``default``: linear, dynamic, yarn, llama3, ... rescale the
rotary frequencies or the attention), per-layer rope parameters or a ``partial_rotary_factor``
other than 1; ``attention_bias`` or ``mlp_bias`` (the llama GPT has no biases); ``hidden_act``
other than SiLU (the SwiGLU MLP is fixed); an ``intermediate_size`` no ratio of
``hidden_size`` reproduces; ``num_attention_heads`` not a multiple of ``num_key_value_heads``;
and weights whose shapes disagree with the config (e.g. ``head_dim`` inconsistent with q_proj).
``pretraining_tp`` (sliced matmuls of the same product) and dropout (off at inference) do not
change the function and are ignored.
"""

from __future__ import annotations

import gc
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from ..space import Arch
from . import GPT, GPTConfig

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
_SILU = ("silu", "swish")
_INSTALL_HINT = "pip install 'hwgptbench[hf]'"


def _transformers() -> Any:
    """The transformers module, or an ImportError naming the fix."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError("importing a Hugging Face checkpoint needs the optional dependency "
                          f"transformers: {_INSTALL_HINT}") from err
    return transformers


def _load_config(path: str | Path) -> Any:
    transformers = _transformers()
    return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)


def _where(config: Any) -> str:
    return f"Hugging Face config {getattr(config, '_name_or_path', '') or '?'!s}"


def _rope_theta(config: Any) -> float:
    """The rotary base; ValueError when the rope is not the default (unscaled) one.

    transformers 5 keeps the rope in ``config.rope_parameters`` ({'rope_theta', 'rope_type',
    ...}); older versions in ``config.rope_theta`` and ``config.rope_scaling`` (None or a dict
    with 'type' / 'rope_type').
    """
    where = _where(config)
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        field = "rope_parameters"
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise ValueError(f"{where}: rope_parameters {params!r}: per-layer rope parameters "
                             "are not supported (the GPT has one rotary table)")
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        scaling = params
    else:
        field = "rope_scaling"
        theta = getattr(config, "rope_theta", None)
        scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type != "default":
        raise ValueError(f"{where}: {field} {scaling!r}: rope_type {rope_type!r} rescales the "
                         "rotary embedding; only the default (unscaled) rope is supported")
    partial = scaling.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor {partial!r}: only rotary over the "
                         "whole head (1.0) is supported")
    if theta is None:
        raise ValueError(f"{where}: {field}: no rope_theta")
    theta = float(theta)
    if not theta > 0:
        raise ValueError(f"{where}: rope_theta {theta!r} is not positive")
    return theta


def mlp_ratio_for(intermediate_size: int, hidden_size: int) -> int | float:
    """The ratio r with ``int(r * hidden_size) == intermediate_size`` (the Arch's MLP width);
    the plain quotient when it works, else the nearest float above it that does."""
    ratio = intermediate_size / hidden_size
    for _ in range(64):
        if int(ratio * hidden_size) == intermediate_size:
            return int(ratio) if ratio.is_integer() else ratio
        ratio = math.nextafter(ratio, math.inf)
    raise ValueError(f"intermediate_size {intermediate_size}: no MLP ratio r of hidden_size "
                     f"{hidden_size} gives int(r * hidden_size) == intermediate_size")


def _check_config(config: Any) -> dict[str, Any]:
    """Validate a transformers config for import; its dims in the project's names."""
    where = _where(config)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{where}: model_type {model_type!r} (architectures "
                         f"{getattr(config, 'architectures', None)}) is not a LLaMA-family causal "
                         f"LM; supported model_type: {list(SUPPORTED_MODEL_TYPES)}")
    for field in ("attention_bias", "mlp_bias"):
        if getattr(config, field, False):
            raise ValueError(f"{where}: {field} is true; the llama GPT has no biases")
    act = getattr(config, "hidden_act", "silu")
    if act not in _SILU:
        raise ValueError(f"{where}: hidden_act {act!r}: the llama GPT's gated MLP uses SiLU "
                         "(SwiGLU)")
    hidden, n_layer = int(config.hidden_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        raise ValueError(f"{where}: num_attention_heads {heads} is not a multiple of "
                         f"num_key_value_heads {kv_heads}")
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    if head_dim % 2:
        raise ValueError(f"{where}: head_dim {head_dim} is odd; rotary needs an even head size")
    intermediate = int(config.intermediate_size)
    ratio = mlp_ratio_for(intermediate, hidden)
    theta = _rope_theta(config)
    max_pos = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None) if model_type == "mistral" else None
    return {
        "model_type": model_type,
        "embed_dim": hidden,
        "n_layer": n_layer,
        "n_head": heads,
        "kv_heads": kv_heads,
        "n_kv_head": 0 if kv_heads == heads else kv_heads,
        "head_size": head_dim,
        "mlp_hidden": intermediate,
        "mlp_ratio": ratio,
        "vocab_size": int(config.vocab_size),
        "max_position_embeddings": max_pos,
        "rope_base": theta,
        "norm_eps": float(config.rms_norm_eps),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "sliding_window": window,
    }


def hf_config_summary(path: str | Path) -> dict[str, Any]:
    """Dims of a checkpoint from its config.json alone (no weights), validated for import.

    Keys use the project's names: ``embed_dim`` (hidden_size), ``n_layer``, ``n_head``,
    ``kv_heads`` (num_key_value_heads), ``n_kv_head`` (the GPTConfig / search-space value: 0 when
    every query head has its own), ``head_size``, ``mlp_hidden`` (intermediate_size),
    ``mlp_ratio``, ``vocab_size``, ``max_position_embeddings``, ``rope_base`` (rope_theta),
    ``norm_eps`` (rms_norm_eps), plus ``model_type``, ``tie_word_embeddings`` and
    ``sliding_window`` (Mistral's, else None). Raises ValueError for a checkpoint
    :func:`load_hf_llama` rejects (the sliding window is checked against block_size only there).
    """
    return _check_config(_load_config(path))


def gpt_config_from_hf(summary: dict[str, Any], block_size: int | None = None) -> GPTConfig:
    """The fixed llama GPTConfig of a :func:`hf_config_summary`."""
    n_layer = summary["n_layer"]
    arch = Arch(summary["embed_dim"], n_layer, (summary["n_head"],) * n_layer,
                (summary["mlp_ratio"],) * n_layer, False)
    return GPTConfig(arch, summary["vocab_size"], block_size or summary["max_position_embeddings"],
                     summary["head_size"], 1.0, "llama", summary["n_kv_head"],
                     summary["rope_base"], summary["norm_eps"])


def _state_dict_from_hf(hf: dict[str, Tensor], n_layer: int,
                        tied: bool) -> dict[str, Tensor]:
    """The GPT state dict of a Hugging Face LlamaForCausalLM state dict."""
    def take(key: str) -> Tensor:
        if key not in hf:
            raise ValueError(f"Hugging Face checkpoint: weight {key!r} is missing")
        return hf[key]

    out = {"wte.weight": take("model.embed_tokens.weight")}
    for i in range(n_layer):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        attn = src + "self_attn."
        out[dst + "ln1.weight"] = take(src + "input_layernorm.weight")
        out[dst + "attn.qkv.weight"] = torch.cat(
            [take(f"{attn}{p}_proj.weight") for p in "qkv"], dim=0)
        out[dst + "attn.proj.weight"] = take(attn + "o_proj.weight")
        out[dst + "ln2.weight"] = take(src + "post_attention_layernorm.weight")
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("proj", "down_proj")):
            out[f"{dst}mlp.{ours}.weight"] = take(f"{src}mlp.{theirs}.weight")
    out["ln_f.weight"] = take("model.norm.weight")
    out["lm_head.weight"] = out["wte.weight"] if tied else take("lm_head.weight")
    return out


def dtype_kwarg(transformers: Any) -> str:
    """``dtype`` (transformers >= 4.56) or the older ``torch_dtype``."""
    from packaging.version import Version

    return "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


class PickledWeightsError(UserError, ValueError):
    """A checkpoint holds its weights only as pickles, which loading would execute."""


def _check_weight_format(path: Path, allow_pickle: bool) -> None:
    """Refuse a checkpoint without safetensors weights unless pickles are allowed."""
    if allow_pickle or any(path.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in path.glob("*.bin")) or ["no weight file"]
    raise PickledWeightsError(
        f"{path}: no .safetensors weights (found {', '.join(pickled)}); a pickled .bin file "
        "runs code when loaded (docs/security.md). Convert the checkpoint to safetensors, or, "
        "for a checkpoint you trust, set compress.allow_pickle_weights: true")


@torch.no_grad()
def load_hf_llama(path: str | Path, *, block_size: int | None = None,
                  allow_pickle: bool = False) -> GPT:
    """A fixed llama GPT (fp32, eval mode) equal to the LLaMA-family checkpoint at path.

    Weights are read from safetensors files; a checkpoint with pickled ``.bin`` weights only
    is refused with :class:`PickledWeightsError` unless ``allow_pickle``.

    block_size defaults to the checkpoint's max_position_embeddings (large for recent models:
    the rotary tables and a default KV cache scale with it). Raises ValueError for a checkpoint
    whose math the GPT does not reproduce (module docstring), ImportError without transformers.
    """
    transformers = _transformers()
    config = _load_config(path)
    summary = _check_config(config)
    _check_weight_format(Path(path), allow_pickle)
    gpt_config = gpt_config_from_hf(summary, block_size)
    window = summary["sliding_window"]
    if window is not None and gpt_config.block_size > window:
        raise ValueError(f"{_where(config)}: sliding_window {window} < block_size "
                         f"{gpt_config.block_size}: sliding-window attention is not supported; "
                         f"pass block_size <= {window}")
    if gpt_config.block_size > summary["max_position_embeddings"]:
        log.warning("block_size %d exceeds the checkpoint's max_position_embeddings %d",
                    gpt_config.block_size, summary["max_position_embeddings"])
    hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), config=config, local_files_only=True, output_loading_info=True,
        use_safetensors=None if allow_pickle else True,
        **{dtype_kwarg(transformers): torch.float32})
    try:
        name = type(hf_model).__name__
        if name not in ("LlamaForCausalLM", "MistralForCausalLM"):
            raise ValueError(f"{path}: loaded {name}, not LlamaForCausalLM/MistralForCausalLM")
        missing = list(info.get("missing_keys") or [])
        if missing:
            raise ValueError(f"{path}: checkpoint lacks weights {sorted(missing)[:8]} (would be "
                             "randomly initialized)")
        hf_state = hf_model.state_dict()
        state = _state_dict_from_hf(hf_state, summary["n_layer"], summary["tie_word_embeddings"])
    finally:
        del hf_model
        gc.collect()
    model = GPT(gpt_config)
    expected = model.state_dict()
    unknown = sorted(set(state) ^ set(expected))
    if unknown:
        raise ValueError(f"{path}: GPT and checkpoint keys differ: {unknown[:8]}")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(f"{path}: {key} has shape {tuple(tensor.shape)} in the checkpoint, "
                             f"{tuple(expected[key].shape)} from its config (hidden_size, "
                             "num_attention_heads, num_key_value_heads, head_dim, "
                             "intermediate_size, vocab_size)")
    model.load_state_dict(state)  # copies, so the GPT shares no storage with the HF tensors
    del state, hf_state
    gc.collect()
    log.info("imported %s (%s) as %s, block_size %d, n_kv_head %d, rope_base %g",
             path, summary["model_type"], gpt_config.arch.id, gpt_config.block_size,
             gpt_config.n_kv_head, gpt_config.rope_base)
    return model.eval()
