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
Rejected, with a :class:`CheckpointError` (a ValueError) naming the config field, is everything
that would change the math of the fixed GPT: another ``model_type``; rope scaling
(``rope_parameters``/``rope_scaling`` with a ``rope_type`` other than ``default``: linear,
dynamic, yarn, llama3, ... rescale the rotary frequencies or the attention), per-layer rope
parameters or a ``partial_rotary_factor`` other than 1; ``attention_bias`` or ``mlp_bias``
(the llama GPT has no biases); ``hidden_act`` other than SiLU (the SwiGLU MLP is fixed); an
``intermediate_size`` no ratio of ``hidden_size`` reproduces; ``num_attention_heads`` not a
multiple of ``num_key_value_heads``; and weights whose shapes disagree with the config (e.g.
``head_dim`` inconsistent with q_proj).
``pretraining_tp`` (sliced matmuls of the same product) and dropout (off at inference) do not
change the function and are ignored.

Before transformers reads the folder, its files are checked (:class:`CheckpointError`, naming
the file): config.json a JSON object with a supported ``model_type`` and every dim the import
reads (a dim left out would take transformers' default, a 7B-parameter model); the weights
``model.safetensors``, or the files ``model.safetensors.index.json`` names, each a readable
safetensors file, holding at least as many numbers as the config's model has (so a config
never makes transformers build a model larger than its weights); pickled
``pytorch_model.bin`` weights only with ``allow_pickle``.
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
from ..io import first_line, read_json
from ..space import Arch
from . import GPT, GPTConfig

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "mistral")
_SILU = ("silu", "swish")
_INSTALL_HINT = "pip install 'hwgptbench[hf]'"
CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# the dims of config.json that every import reads, positive whole numbers: one left out would
# take transformers' default (LlamaConfig's: a 7B-parameter model, built before any weight
# is read)
CONFIG_DIMS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "vocab_size", "max_position_embeddings")
OPTIONAL_DIMS = ("num_key_value_heads", "head_dim")
FOLDER_FIX = ("give compress.checkpoint a folder as transformers' save_pretrained writes it: "
              "config.json and safetensors weights (docs/compress.md)")


class CheckpointError(UserError, ValueError):
    """A Hugging Face checkpoint folder that cannot be imported: not a folder, a config.json
    that is not JSON or lacks a field, weight files other than the ones the loader reads, a
    corrupt safetensors file, or a model whose math the GPT does not reproduce."""


def _transformers() -> Any:
    """The transformers module, or an ImportError naming the fix."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError("importing a Hugging Face checkpoint needs the optional dependency "
                          f"transformers: {_INSTALL_HINT}") from err
    return transformers


def _load_config(path: str | Path) -> Any:
    """The transformers config of a checkpoint folder whose config.json passed
    :func:`_check_config_file`."""
    transformers = _transformers()
    _check_config_file(Path(path))
    try:
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # its parsing of a given file raises errors of many types
        raise CheckpointError(f"{Path(path) / CONFIG}: transformers cannot read it "
                              f"({first_line(err)}); {FOLDER_FIX}") from None


def _positive_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_config_file(path: Path) -> dict[str, Any]:
    """config.json of the checkpoint folder ``path``: a JSON object naming a supported
    model_type, with the dims of :data:`CONFIG_DIMS` (and those of :data:`OPTIONAL_DIMS` it
    sets) positive whole numbers and a positive rms_norm_eps."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder; {FOLDER_FIX}")
    file = path / CONFIG
    if not file.is_file():
        raise CheckpointError(f"{path}: no {CONFIG}; {FOLDER_FIX}")
    doc = read_json(file, FOLDER_FIX)
    if not isinstance(doc, dict):
        raise CheckpointError(f"{file}: not a JSON object; {FOLDER_FIX}")
    model_type = doc.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{file}: model_type {model_type!r} (architectures "
                              f"{doc.get('architectures')!r:.80}) is not a LLaMA-family causal "
                              f"LM; supported model_type: {list(SUPPORTED_MODEL_TYPES)}")
    for field in CONFIG_DIMS + tuple(f for f in OPTIONAL_DIMS if doc.get(f) is not None):
        if field not in doc:
            raise CheckpointError(f"{file}: no {field} (a positive whole number); {FOLDER_FIX}")
        if not _positive_whole(doc[field]):
            raise CheckpointError(f"{file}: {field} is {doc[field]!r:.40}, not a positive whole "
                                  f"number; {FOLDER_FIX}")
    eps = doc.get("rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise CheckpointError(f"{file}: rms_norm_eps is {eps!r:.40}, not a positive number; "
                              f"{FOLDER_FIX}")
    return doc


def _where(config: Any) -> str:
    return f"Hugging Face config {getattr(config, '_name_or_path', '') or '?'!s}"


def _rope_theta(config: Any) -> float:
    """The rotary base; CheckpointError when the rope is not the default (unscaled) one.

    transformers 5 keeps the rope in ``config.rope_parameters`` ({'rope_theta', 'rope_type',
    ...}); older versions in ``config.rope_theta`` and ``config.rope_scaling`` (None or a dict
    with 'type' / 'rope_type').
    """
    where = _where(config)
    params = getattr(config, "rope_parameters", None)
    if params is not None:
        field = "rope_parameters"
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise CheckpointError(f"{where}: rope_parameters {params!r}: per-layer rope parameters "
                                  "are not supported (the GPT has one rotary table)")
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        scaling = params
    else:
        field = "rope_scaling"
        theta = getattr(config, "rope_theta", None)
        scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if rope_type != "default":
        raise CheckpointError(f"{where}: {field} {scaling!r}: rope_type {rope_type!r} rescales the "
                              "rotary embedding; only the default (unscaled) rope is supported")
    partial = scaling.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial is not None and float(partial) != 1.0:
        raise CheckpointError(f"{where}: partial_rotary_factor {partial!r}: only rotary over the "
                              "whole head (1.0) is supported")
    if theta is None:
        raise CheckpointError(f"{where}: {field}: no rope_theta")
    theta = float(theta)
    if not theta > 0:
        raise CheckpointError(f"{where}: rope_theta {theta!r} is not positive")
    return theta


def mlp_ratio_for(intermediate_size: int, hidden_size: int) -> int | float:
    """The ratio r with ``int(r * hidden_size) == intermediate_size`` (the Arch's MLP width);
    the plain quotient when it works, else the nearest float above it that does."""
    ratio = intermediate_size / hidden_size
    for _ in range(64):
        if int(ratio * hidden_size) == intermediate_size:
            return int(ratio) if ratio.is_integer() else ratio
        ratio = math.nextafter(ratio, math.inf)
    raise CheckpointError(f"intermediate_size {intermediate_size}: no MLP ratio r of hidden_size "
                          f"{hidden_size} gives int(r * hidden_size) == intermediate_size")


def _check_config(config: Any) -> dict[str, Any]:
    """Validate a transformers config for import; its dims in the project's names. A field of
    another type than the import reads (a rope_theta that is no number) is a CheckpointError
    too."""
    try:
        return _summary(config)
    except CheckpointError:
        raise
    except (TypeError, ValueError, AttributeError) as err:
        raise CheckpointError(f"{_where(config)}: {first_line(err)}; {FOLDER_FIX}") from None


def _summary(config: Any) -> dict[str, Any]:
    """The dims of a transformers config in the project's names, or CheckpointError naming
    the field that the fixed GPT does not reproduce."""
    where = _where(config)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{where}: model_type {model_type!r} (architectures "
                              f"{getattr(config, 'architectures', None)}) is not a "
                              f"LLaMA-family causal LM; supported model_type: "
                              f"{list(SUPPORTED_MODEL_TYPES)}")
    for field in ("attention_bias", "mlp_bias"):
        if getattr(config, field, False):
            raise CheckpointError(f"{where}: {field} is true; the llama GPT has no biases")
    act = getattr(config, "hidden_act", "silu")
    if act not in _SILU:
        raise CheckpointError(f"{where}: hidden_act {act!r}: the llama GPT's gated MLP uses SiLU "
                              "(SwiGLU)")
    hidden, n_layer = int(config.hidden_size), int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    if heads % kv_heads:
        raise CheckpointError(f"{where}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    if head_dim % 2:
        raise CheckpointError(f"{where}: head_dim {head_dim} is odd; rotary needs an even "
                              "head size")
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
    ``sliding_window`` (Mistral's, else None). Raises CheckpointError for a checkpoint
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
            raise CheckpointError(f"Hugging Face checkpoint: weight {key!r} is missing")
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


class PickledWeightsError(CheckpointError):
    """A checkpoint holds its weights only as pickles, which loading would execute."""


def _weight_files(path: Path, allow_pickle: bool) -> list[Path]:
    """The safetensors files the loader reads from the checkpoint folder: model.safetensors,
    else the files its index names; none for pickled weights, which only ``allow_pickle``
    accepts. Other file sets are refused, naming the weight files found."""
    if (path / SAFETENSORS).is_file():
        return [path / SAFETENSORS]
    if (path / SAFETENSORS_INDEX).is_file():
        return _indexed_files(path / SAFETENSORS_INDEX)
    pickled = any((path / name).is_file() for name in PICKLED)
    if pickled and allow_pickle:
        return []
    found = sorted(p.name for p in path.iterdir()
                   if p.name.endswith((".bin", ".safetensors"))) or ["no weight file"]
    where = (f"{path}: no .safetensors weights (found {', '.join(found)}); the weights are read "
             f"from {SAFETENSORS} or the files {SAFETENSORS_INDEX} names")
    if pickled:
        raise PickledWeightsError(
            f"{where}; a pickled .bin file runs code when loaded (docs/security.md). Convert "
            "the checkpoint to safetensors, or, for a checkpoint you trust, set "
            "compress.allow_pickle_weights: true")
    raise CheckpointError(f"{where}; {FOLDER_FIX}")


def _indexed_files(index: Path) -> list[Path]:
    """The safetensors files a sharded checkpoint's index names: each a file of the folder."""
    doc = read_json(index, FOLDER_FIX)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no weight_map of weight names to files; {FOLDER_FIX}")
    files = []
    for name in sorted(set(map(str, weight_map.values()))):
        file = index.parent / name
        if Path(name).name != name or not name.endswith(".safetensors") or not file.is_file():
            raise CheckpointError(f"{index}: names {name!r:.80}, not a .safetensors file of the "
                                  f"folder; {FOLDER_FIX}")
        files.append(file)
    return files


def _stored_parameters(files: list[Path]) -> int:
    """How many numbers the safetensors files hold (their headers read and checked: the
    offsets of every tensor cover the file exactly)."""
    from safetensors import SafetensorError, safe_open

    total = 0
    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                total += sum(math.prod(handle.get_slice(key).get_shape())
                             for key in handle.keys())
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{file}: not a safetensors file ({first_line(err)}); "
                                  f"{FOLDER_FIX}") from None
    return total


def _config_parameters(summary: dict[str, Any]) -> int:
    """How many numbers the model that a config summary describes has."""
    hidden, heads, kv = summary["embed_dim"], summary["n_head"], summary["kv_heads"]
    attention = 2 * hidden * heads * summary["head_size"] + 2 * hidden * kv * summary["head_size"]
    layer = attention + 3 * hidden * summary["mlp_hidden"] + 2 * hidden
    embeddings = summary["vocab_size"] * hidden * (1 if summary["tie_word_embeddings"] else 2)
    return summary["n_layer"] * layer + embeddings + hidden


def _check_weights(path: Path, summary: dict[str, Any], allow_pickle: bool) -> None:
    """The weight files are those the loader reads and hold the model the config describes:
    a config larger than its weights is refused before the model is built."""
    files = _weight_files(path, allow_pickle)
    if not files:
        return
    stored, described = _stored_parameters(files), _config_parameters(summary)
    if described > stored:
        raise CheckpointError(f"{path / CONFIG}: describes a model of {described:,} parameters, "
                              f"but the weights hold {stored:,} numbers; the config and weights "
                              f"are not of one model; {FOLDER_FIX}")


@torch.no_grad()
def load_hf_llama(path: str | Path, *, block_size: int | None = None,
                  allow_pickle: bool = False) -> GPT:
    """A fixed llama GPT (fp32, eval mode) equal to the LLaMA-family checkpoint at path.

    Weights are read from safetensors files; a checkpoint with pickled ``.bin`` weights only
    is refused with :class:`PickledWeightsError` unless ``allow_pickle``.

    block_size defaults to the checkpoint's max_position_embeddings (large for recent models:
    the rotary tables and a default KV cache scale with it). Raises CheckpointError for a
    folder whose files are not a checkpoint's or whose math the GPT does not reproduce (module
    docstring), ImportError without transformers.
    """
    transformers = _transformers()
    config = _load_config(path)
    summary = _check_config(config)
    _check_weights(Path(path), summary, allow_pickle)
    gpt_config = gpt_config_from_hf(summary, block_size)
    window = summary["sliding_window"]
    if window is not None and gpt_config.block_size > window:
        raise CheckpointError(f"{_where(config)}: sliding_window {window} < block_size "
                              f"{gpt_config.block_size}: sliding-window attention is not "
                              f"supported; pass block_size <= {window}")
    if gpt_config.block_size > summary["max_position_embeddings"]:
        log.warning("block_size %d exceeds the checkpoint's max_position_embeddings %d",
                    gpt_config.block_size, summary["max_position_embeddings"])
    try:
        hf_model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), config=config, local_files_only=True, output_loading_info=True,
            use_safetensors=None if allow_pickle else True,
            **{dtype_kwarg(transformers): torch.float32})
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise CheckpointError(f"{path}: transformers cannot load its weights "
                              f"({first_line(err)}); {FOLDER_FIX}") from None
    try:
        name = type(hf_model).__name__
        if name not in ("LlamaForCausalLM", "MistralForCausalLM"):
            raise CheckpointError(f"{path}: loaded {name}, not LlamaForCausalLM/MistralForCausalLM")
        missing = list(info.get("missing_keys") or [])
        if missing:
            raise CheckpointError(f"{path}: checkpoint lacks weights {sorted(missing)[:8]} "
                                  "(would be randomly initialized)")
        hf_state = hf_model.state_dict()
        state = _state_dict_from_hf(hf_state, summary["n_layer"], summary["tie_word_embeddings"])
    finally:
        del hf_model
        gc.collect()
    model = GPT(gpt_config)
    expected = model.state_dict()
    unknown = sorted(set(state) ^ set(expected))
    if unknown:
        raise CheckpointError(f"{path}: GPT and checkpoint keys differ: {unknown[:8]}")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise CheckpointError(f"{path}: {key} has shape {tuple(tensor.shape)} in the "
                                  f"checkpoint, {tuple(expected[key].shape)} from its config "
                                  "(hidden_size, num_attention_heads, num_key_value_heads, "
                                  "head_dim, intermediate_size, vocab_size)")
    model.load_state_dict(state)  # copies, so the GPT shares no storage with the HF tensors
    del state, hf_state
    gc.collect()
    log.info("imported %s (%s) as %s, block_size %d, n_kv_head %d, rope_base %g",
             path, summary["model_type"], gpt_config.arch.id, gpt_config.block_size,
             gpt_config.n_kv_head, gpt_config.rope_base)
    return model.eval()
