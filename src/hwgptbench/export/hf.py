"""A Hugging Face folder of a uniform arch: ``LlamaForCausalLM`` (family ``llama``) or
``GPTNeoXForCausalLM`` (``gpt_neox``), safetensors weights, plus the tokenizer.

The reverse of :mod:`hwgptbench.model.hf` for llama: its weight-name table read right to
left (the fused ``qkv`` rows split into q, k, v; the same head layout and rotate-half rotary,
``num_key_value_heads`` the layer's key/value heads, ``head_dim`` the space's head size).

gpt_neox maps onto GPT-NeoX's own math: parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``
(``use_parallel_residual``), LayerNorms with bias (``layer_norm_eps``), rotate-half rotary on
the leading ``partial_rotary_factor`` (``rotary_pct``) of each head, exact GELU (``gelu``), the LM
head tied to the embedding (``tie_word_embeddings``), ``attention_bias`` the arch's bias flag
(the MLP always has biases in GPT-NeoX: zeros for an arch without). GPT-NeoX fuses q, k, v per
head (rows ``[q0 k0 v0 q1 k1 v1 ...]``) where the GPT stacks them (``[q0 q1 ... k0 ... v0 ...]``):
the rows are regrouped. GPT-NeoX's head size is ``hidden_size / num_attention_heads`` and it has
no grouped-query attention, so an arch must match both.

Neither class has per-layer head counts or MLP widths (transformers 5 configs take one
``num_attention_heads`` and one ``intermediate_size``): an arch whose layers differ is held by
the pt2 and ONNX formats only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from ..model import GPT, GPTConfig
from ..model.hf import dtype_kwarg
from .check import FormatUnavailableError, Logits

INSTALL_HINT = "pip install 'hwgptbench[hf]'"
CLASSES = {"llama": "LlamaForCausalLM", "gpt_neox": "GPTNeoXForCausalLM"}


def _transformers() -> Any:
    """The transformers module, or an ImportError naming the fix."""
    try:
        import transformers
    except ImportError as err:
        raise ImportError("the Hugging Face format needs the optional dependency transformers: "
                          f"{INSTALL_HINT}") from err
    return transformers


def _layers(values: tuple[Any, ...], what: str) -> str:
    """``layers 0,2 have 4 heads, layer 1 has 8 heads``: the layers of each distinct value."""
    groups: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        groups.setdefault(value, []).append(i)
    return ", ".join(
        f"layer{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))} "
        f"{'have' if len(ids) > 1 else 'has'} {what.format(value)}"
        for value, ids in groups.items())


def unsupported_reason(config: GPTConfig) -> str | None:
    """Why the Hugging Face classes cannot hold the model of config, or None."""
    arch, name = config.arch, CLASSES[config.family]
    differ = [_layers(values, what) for values, what in ((arch.n_head, "{} heads"),
                                                         (arch.mlp_hidden, "MLP width {}"))
              if len(set(values)) > 1]
    if differ:
        return (f"arch {arch.id}: {'; '.join(differ)}, but {name} has the same heads and MLP "
                "width in every layer; the pt2 and ONNX formats hold per-layer archs")
    n_head = arch.n_head[0]
    if config.llama and config.rotary_fraction != 1:
        return (f"rotary_fraction {config.rotary_fraction}: {name} rotates the whole head")
    if not config.llama and n_head * config.head_size != arch.embed_dim:
        return (f"arch {arch.id}: {n_head} heads of size {config.head_size} != embed_dim "
                f"{arch.embed_dim}, but {name}'s head size is hidden_size / num_attention_heads")
    if not config.llama and config.kv_heads(n_head) != n_head:
        return f"n_kv_head {config.n_kv_head}: {name} has no grouped-query attention"
    try:
        _transformers()
    except ImportError as err:
        return str(err)
    return None


def _tokenizer(transformers: Any, path: str | Path, config: GPTConfig) -> tuple[Any, int]:
    """The data stage's ``tokenizers`` file as a fast Hugging Face tokenizer (EOT as bos and
    eos), and EOT's id."""
    from tokenizers import Tokenizer

    from ..tokens.tokenizer import EOT_TOKEN

    tokenizer = Tokenizer.from_file(str(path))
    eot = tokenizer.token_to_id(EOT_TOKEN)
    if eot is None:
        raise UserError(f"tokenizer {path}: no {EOT_TOKEN!r} token, which the Hugging Face "
                        "folder names as its end-of-text (eos) token")
    if tokenizer.get_vocab_size() > config.vocab_size:
        raise UserError(f"tokenizer {path}: {tokenizer.get_vocab_size()} tokens, more than the "
                        f"model's vocab_size {config.vocab_size}: not the model's tokenizer")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOT_TOKEN, eos_token=EOT_TOKEN,
        model_max_length=config.block_size)
    return fast, eot


def _llama(transformers: Any, model: GPT, ours: dict[str, Tensor],
           eot: int | None) -> tuple[Any, dict[str, Tensor]]:
    """LlamaForCausalLM's config and state dict of a llama GPT."""
    config, arch = model.config, model.config.arch
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=arch.embed_dim,
        intermediate_size=arch.mlp_hidden[0], num_hidden_layers=arch.n_layer,
        num_attention_heads=arch.n_head[0], num_key_value_heads=config.kv_heads(arch.n_head[0]),
        head_dim=config.head_size, hidden_act="silu", max_position_embeddings=config.block_size,
        rms_norm_eps=config.norm_eps, rope_theta=config.rope_base, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=False, bos_token_id=eot, eos_token_id=eot)
    state = {"model.embed_tokens.weight": ours["wte.weight"],
             "model.norm.weight": ours["ln_f.weight"], "lm_head.weight": ours["lm_head.weight"]}
    for i, block in enumerate(model.block_list()):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = ours[src + "attn.qkv.weight"].split(block.attn.widths)
        state |= {dst + "input_layernorm.weight": ours[src + "ln1.weight"],
                  dst + "self_attn.q_proj.weight": q, dst + "self_attn.k_proj.weight": k,
                  dst + "self_attn.v_proj.weight": v,
                  dst + "self_attn.o_proj.weight": ours[src + "attn.proj.weight"],
                  dst + "post_attention_layernorm.weight": ours[src + "ln2.weight"]}
        for theirs, name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "proj")):
            state[f"{dst}mlp.{theirs}.weight"] = ours[f"{src}mlp.{name}.weight"]
    return hf_config, state


def _per_head_qkv(fused: Tensor, n_head: int) -> Tensor:
    """Rows ``[q; k; v]`` (heads in order within each) regrouped as GPT-NeoX's
    ``[q_h; k_h; v_h]`` head after head (a weight or a bias)."""
    return fused.reshape(3, n_head, -1, *fused.shape[1:]).transpose(0, 1).reshape(fused.shape)


def _gpt_neox(transformers: Any, model: GPT, ours: dict[str, Tensor],
              eot: int | None) -> tuple[Any, dict[str, Tensor]]:
    """GPTNeoXForCausalLM's config and state dict (without the tied LM head) of a gpt_neox
    GPT."""
    config, arch = model.config, model.config.arch
    n_head = arch.n_head[0]
    hf_config = transformers.GPTNeoXConfig(
        vocab_size=config.vocab_size, hidden_size=arch.embed_dim,
        intermediate_size=arch.mlp_hidden[0], num_hidden_layers=arch.n_layer,
        num_attention_heads=n_head, hidden_act="gelu", rotary_pct=config.rotary_fraction,
        rotary_emb_base=config.rope_base, max_position_embeddings=config.block_size,
        layer_norm_eps=config.norm_eps, use_parallel_residual=True, tie_word_embeddings=True,
        attention_bias=arch.bias, bos_token_id=eot, eos_token_id=eot)
    state = {"gpt_neox.embed_in.weight": ours["wte.weight"],
             "gpt_neox.final_layer_norm.weight": ours["ln_f.weight"],
             "gpt_neox.final_layer_norm.bias": ours["ln_f.bias"]}
    for i in range(arch.n_layer):
        src, dst = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        for kind in ("weight", "bias"):
            state[f"{dst}input_layernorm.{kind}"] = ours[f"{src}ln1.{kind}"]
            state[f"{dst}post_attention_layernorm.{kind}"] = ours[f"{src}ln2.{kind}"]
        for kind in ("weight", "bias") if arch.bias else ("weight",):
            state[f"{dst}attention.query_key_value.{kind}"] = _per_head_qkv(
                ours[f"{src}attn.qkv.{kind}"], n_head)
            state[f"{dst}attention.dense.{kind}"] = ours[f"{src}attn.proj.{kind}"]
        for theirs, name in (("dense_h_to_4h", "fc"), ("dense_4h_to_h", "proj")):
            weight = ours[f"{src}mlp.{name}.weight"]
            state[f"{dst}mlp.{theirs}.weight"] = weight
            state[f"{dst}mlp.{theirs}.bias"] = ours.get(f"{src}mlp.{name}.bias",
                                                        weight.new_zeros(weight.size(0)))
    return hf_config, state


def save(model: GPT, folder: Path, tokenizer_path: str | Path | None = None) -> list[Path]:
    """Write the Hugging Face folder of model (fp32 safetensors; the tokenizer too when given)
    at folder; the files written. FormatUnavailableError for a model the classes cannot hold."""
    config = model.config
    reason = unsupported_reason(config)
    if reason:
        raise FormatUnavailableError(f"Hugging Face format: {reason}")
    transformers = _transformers()
    tokenizer, eot = (_tokenizer(transformers, tokenizer_path, config)
                      if tokenizer_path is not None else (None, None))
    ours = {k: v.detach().to("cpu", torch.float32).clone() for k, v in model.state_dict().items()}
    hf_config, state = (_llama if config.llama else _gpt_neox)(transformers, model, ours, eot)
    hf_class = getattr(transformers, CLASSES[config.family])
    with torch.device("meta"):
        hf_model = hf_class(hf_config)
    _, unexpected = hf_model.load_state_dict(state, strict=False, assign=True)
    hf_model.tie_weights()
    unset = [name for name, value in hf_model.state_dict().items() if value.is_meta]
    if unexpected or unset:
        raise RuntimeError(f"the weights do not fit {hf_class.__name__}: unexpected "
                           f"{unexpected}, not set {unset}")
    from ..outputs import atomic_dir

    with atomic_dir(folder) as staging:
        hf_model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
    return sorted(path for path in folder.iterdir() if path.is_file())


def load(folder: Path) -> Logits:
    """ids -> logits of the Hugging Face folder (fp32, safetensors, local files only)."""
    transformers = _transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, use_safetensors=True, trust_remote_code=False,
        **{dtype_kwarg(transformers): torch.float32}).eval()

    @torch.no_grad()
    def run(ids: Tensor) -> Tensor:
        return model(input_ids=ids, use_cache=False).logits

    return run
