"""Compression baselines built without search, at a given parameter count.

LLaMA-NAS claims that one-shot NAS over a fine-tuned supernet beats pruning and sparsification
at equal size. These are the pruning baselines for that comparison, as pure functions of a fixed
:class:`~hwgptbench.model.gpt.GPT` (the importance-reordered dense model, or the supernet's
largest sub-network ``supernet.extract()``). Each returns a new model (the input is untouched)
and what it built:

- :func:`uniform_width` (structured width pruning as LLM-Pruner, Ma et al. 2023, and SliceGPT,
  Ashkboos et al. 2024, apply it: the same ratio in every layer, no search): every layer keeps
  the same number of leading query heads (a multiple of the key/value heads with grouped-query
  attention, whose groups all shrink alike) and the same number of leading MLP channels. For
  each head count the channel count is solved exactly (any int >= 1, not only the space's
  ratios), and the configuration with the most parameters <= the target is kept (a tie goes to
  more heads). Heads and channels are sliced exactly as ``SuperGPT.extract`` slices them (the
  same :func:`~hwgptbench.model.elastic.leading`), so where the configuration is an arch of
  the supernet's space the model equals that sub-network.
- :func:`depth_prune` (ShortGPT, Men et al. 2024; the depth axis of Minitron, Muralidharan et
  al. 2024): whole blocks are dropped in increasing order of Block Influence, 1 - the mean
  cosine similarity between a block's input and output hidden states on calibration tokens
  (computed once, on the full model, as ShortGPT does), until the count is <= the target.
- :func:`wanda` (Sun et al. 2023, "A Simple and Effective Pruning Approach for Large Language
  Models"): unstructured sparsity of every Linear weight in the blocks (embeddings, norms and
  the LM head stay dense), by the score ``|W_ij| * ||X_j||_2`` (X_j: the j-th input feature of
  that Linear over all calibration tokens, recorded with forward pre-hooks in one pass of the
  dense model; Wanda's reference code instead feeds each block the outputs of the blocks
  already pruned), compared per output row. Every row of a Linear with n_in inputs
  loses the same ``floor(k * n_in / P)`` lowest-scored weights (k weights to prune, P prunable
  entries in all: one sparsity ratio for every layer, as in Wanda); the remainder needed to
  reach the target *exactly* (fewer weights than there are rows, unless some were zero
  already) is then taken from the globally lowest remaining scores. The remainder takes the
  lowest remaining weights of the rows it touches, so within every row each kept weight still
  scores >= each pruned one; only the count pruned per row may then exceed the uniform count.

Why written here: the baselines must prune *this* model family (fused QKV, grouped-query heads,
SwiGLU, this importance order) and hit an exact parameter or nonzero count so that rows of the
comparison are at equal size, which neither library offers. torchao's sparsifier
(``torchao.sparsity``) is not installed in this project's environment, so Wanda is the small
implementation below; its masks are plain boolean tensors written into the weights as zeros
(the dense kernels still run: the size gain is :func:`sparse_size_bytes`, CSR storage).

Counts: :func:`param_count` counts every parameter, a tied embedding once;
:func:`nonzero_params` counts the nonzero ones.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from ..model.elastic import leading
from ..model.gpt import GPT, Block, GatedMLP, GPTConfig
from ..space import Arch

log = logging.getLogger(__name__)


def param_count(model: nn.Module) -> int:
    """Number of parameters, a tied (shared) tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def nonzero_params(model: nn.Module) -> int:
    """Number of nonzero parameter entries, a tied (shared) tensor counted once."""
    return sum(int(torch.count_nonzero(p)) for p in model.parameters())


def _block_linears(model: GPT) -> dict[str, nn.Linear]:
    """The Linear layers of the blocks by weight name, e.g. ``blocks.0.attn.qkv.weight``."""
    return {f"blocks.{name}.weight": module for name, module in model.blocks.named_modules()
            if isinstance(module, nn.Linear)}


def sparse_size_bytes(model: GPT) -> int:
    """Bytes of the weights with every block Linear weight holding a zero stored in CSR (values,
    int32 column indices, int32 row pointers) and every other parameter dense (tied once)."""
    sparse = {id(linear.weight) for linear in _block_linears(model).values()}
    total = 0
    for p in model.parameters():
        nnz = int(torch.count_nonzero(p))
        if id(p) in sparse and nnz < p.numel():
            total += nnz * (p.element_size() + 4) + (p.size(0) + 1) * 4
        else:
            total += p.numel() * p.element_size()
    return total


# ---- slicing: leading heads and channels, chosen layers ----------------------------------------


def _ratio_for(hidden: int, embed_dim: int) -> int | float:
    """An MLP ratio r with ``int(r * embed_dim) == hidden`` (Arch stores ratios, not widths)."""
    ratio = hidden / embed_dim
    while int(ratio * embed_dim) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return int(ratio) if ratio.is_integer() else ratio


def _arch(model: GPT, layers: Sequence[int], n_head: Sequence[int], hidden: Sequence[int]
          ) -> Arch:
    old = model.config.arch
    ratios = [old.mlp_ratio[i] if h == old.mlp_hidden[i] else _ratio_for(h, old.embed_dim)
              for i, h in zip(layers, hidden, strict=True)]
    return Arch(old.embed_dim, len(layers), tuple(n_head), tuple(ratios), old.bias)


def _block_state(block: Block, config: GPTConfig, n_head: int, hidden: int) -> dict[str, Tensor]:
    """The weights of block with its leading n_head query heads (of every key/value group) and
    leading hidden MLP channels, in the layout of the fixed Block (SuperGPT.extract's slices)."""
    attn, mlp = block.attn, block.mlp
    width = n_head * attn.head_size
    groups = max(config.n_kv_head, 1)  # grouped-query: leading heads of every group
    state = {f"{name}.{key}": value for name, norm in (("ln1", block.ln1), ("ln2", block.ln2))
             for key, value in norm.state_dict().items()}
    for kind in ("weight", "bias"):
        fused = getattr(attn.qkv, kind)
        if fused is None:
            continue
        q, k, v = fused.detach().split(attn.widths)
        if not config.n_kv_head:  # one key/value head per query head: they shrink together
            k, v = leading(k, 0, width), leading(v, 0, width)
        state[f"attn.qkv.{kind}"] = torch.cat([leading(q, 0, width, groups), k, v])
    state["attn.proj.weight"] = leading(attn.proj.weight.detach(), 1, width, groups)
    inputs = ("gate", "up") if isinstance(mlp, GatedMLP) else ("fc",)
    for name in inputs:
        linear = getattr(mlp, name)
        state[f"mlp.{name}.weight"] = leading(linear.weight.detach(), 0, hidden)
        if linear.bias is not None:
            state[f"mlp.{name}.bias"] = leading(linear.bias.detach(), 0, hidden)
    state["mlp.proj.weight"] = leading(mlp.proj.weight.detach(), 1, hidden)
    for linear, name in ((attn.proj, "attn.proj"), (mlp.proj, "mlp.proj")):
        if linear.bias is not None:
            state[f"{name}.bias"] = linear.bias.detach()
    return state


@torch.no_grad()
def _sliced(model: GPT, layers: Sequence[int], n_head: Sequence[int], hidden: Sequence[int]
            ) -> tuple[GPT, Arch]:
    """A new GPT of model's blocks ``layers`` (in that order), block ``layers[i]`` keeping its
    leading ``n_head[i]`` query heads and ``hidden[i]`` MLP channels; weights copied."""
    if not layers:
        raise ValueError("a model needs at least one block")
    blocks = model.block_list()
    for i, h, w in zip(layers, n_head, hidden, strict=True):
        block = blocks[i]
        if not 1 <= h <= block.attn.n_head or not 1 <= w <= block.mlp.proj.in_features:
            raise ValueError(f"block {i} has {block.attn.n_head} heads and "
                             f"{block.mlp.proj.in_features} MLP channels; asked {h} and {w}")
    arch = _arch(model, layers, n_head, hidden)
    config = dataclasses.replace(model.config, arch=arch)
    state = {key: value for key, value in model.state_dict().items()
             if not key.startswith("blocks.")}
    for new, (i, h, w) in enumerate(zip(layers, n_head, hidden, strict=True)):
        block_state = _block_state(blocks[i], model.config, h, w)
        state |= {f"blocks.{new}.{key}": value for key, value in block_state.items()}
    weight = model.wte.weight
    with torch.device(weight.device):
        pruned = GPT(config).to(weight.dtype)
    pruned.load_state_dict(state)
    pruned.recompute = model.recompute
    return pruned.train(model.training), arch


def keep_layers(model: GPT, indices: Sequence[int]) -> GPT:
    """A new GPT of the blocks ``indices`` of model (in increasing order), at full width."""
    indices = sorted(set(indices))
    if any(not 0 <= i < len(model.blocks) for i in indices):
        raise ValueError(f"layer indices {indices} not all in [0, {len(model.blocks)})")
    blocks = model.block_list()
    return _sliced(model, indices, [blocks[i].attn.n_head for i in indices],
                   [blocks[i].mlp.proj.in_features for i in indices])[0]


# ---- uniform width (LLM-Pruner / SliceGPT style) -----------------------------------------------


def _block_params(config: GPTConfig, n_head: int, hidden: int) -> int:
    with torch.device("meta"):
        return param_count(Block(config, n_head, hidden))


def head_choices(model: GPT) -> list[int]:
    """Query-head counts a uniform width may keep: multiples of the key/value heads (grouped-
    query attention) or any count (one key/value head per query head), up to the fewest heads
    of any layer."""
    step = max(model.config.n_kv_head, 1)
    return list(range(step, min(model.config.arch.n_head) + 1, step))


def uniform_width_params(model: GPT, n_head: int, hidden: int) -> int:
    """Parameters of model with every layer at n_head query heads and hidden MLP channels."""
    outside = param_count(model) - sum(param_count(b) for b in model.blocks)
    return outside + len(model.blocks) * _block_params(model.config, n_head, hidden)


def _widest_hidden(model: GPT, n_head: int, target_params: int) -> int | None:
    """The most MLP channels (<= the model's) with n_head heads per layer whose count is <= the
    target, solved exactly (a block's count is linear in its channels); None if none fits."""
    config, n_layer = model.config, len(model.blocks)
    outside = param_count(model) - sum(param_count(b) for b in model.blocks)
    one = _block_params(config, n_head, 1)
    per_channel = _block_params(config, n_head, 2) - one
    spare = target_params - outside - n_layer * one
    if spare < 0:
        return None
    return min(1 + spare // (n_layer * per_channel), min(config.arch.mlp_hidden))


def uniform_width(model: GPT, target_params: int) -> tuple[GPT, Arch]:
    """The uniform-width model (same leading heads and MLP channels in every layer) with the
    most parameters <= target_params, and its arch (MLP widths as exact ratios of the embedding
    width; build it with ``GPTConfig`` directly when a ratio is not a choice of the space)."""
    best: tuple[int, int, int] | None = None  # params, heads, hidden
    for n_head in head_choices(model):  # ascending: a tie in params goes to more heads
        hidden = _widest_hidden(model, n_head, target_params)
        if hidden is None:
            continue
        params = uniform_width_params(model, n_head, hidden)
        if best is None or params >= best[0]:
            best = (params, n_head, hidden)
    if best is None:
        smallest = uniform_width_params(model, head_choices(model)[0], 1)
        raise ValueError(f"no uniform width fits {target_params} parameters: the narrowest "
                         f"({head_choices(model)[0]} heads, 1 MLP channel) has {smallest}")
    params, n_head, hidden = best
    n_layer = len(model.blocks)
    pruned, arch = _sliced(model, range(n_layer), [n_head] * n_layer, [hidden] * n_layer)
    log.info("uniform width: %d heads, %d MLP channels per layer, %d params (target %d)",
             n_head, hidden, params, target_params)
    return pruned, arch


# ---- depth (ShortGPT Block Influence) ----------------------------------------------------------


def _calibrate(model: GPT, batches: Sequence[Tensor]) -> None:
    """One forward pass of model (in eval mode, no autograd) over every calibration batch."""
    if not batches:
        raise ValueError("calibration needs at least one batch of token ids")
    was_training = model.training
    model.eval()
    device = model.wte.weight.device
    try:
        with torch.inference_mode():
            for x in batches:
                model(x.to(device))
    finally:
        model.train(was_training)


def block_influence(model: GPT, batches: Sequence[Tensor]) -> Tensor:
    """ShortGPT's Block Influence of every block (n_layer,): 1 - the mean over calibration tokens
    of the cosine similarity between the block's input and output hidden states; in [0, 2], 0
    for a block that passes its input through."""
    sums = torch.zeros(len(model.blocks), dtype=torch.float64)
    tokens = [0]

    def hook(i: int) -> RemovableHandle:
        def record(_module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
            similarity = F.cosine_similarity(args[0].float(), output.float(), dim=-1)  # (B, T)
            sums[i] += similarity.double().sum().cpu()
            if i == 0:
                tokens[0] += similarity.numel()

        return model.blocks[i].register_forward_hook(record)

    handles = [hook(i) for i in range(len(model.blocks))]
    try:
        _calibrate(model, batches)
    finally:
        for handle in handles:
            handle.remove()
    return (1 - sums / tokens[0]).clamp(0, 2).float()


def depth_prune(model: GPT, target_params: int, influence: Tensor) -> tuple[GPT, list[int]]:
    """Drop whole blocks in increasing order of their Block Influence (``influence``, from
    :func:`block_influence` of this model) until the count is <= target_params; the new model
    and the kept layer indices (increasing)."""
    if influence.shape != (len(model.blocks),):
        raise ValueError(f"influence has shape {tuple(influence.shape)}; the model has "
                         f"{len(model.blocks)} blocks")
    total = param_count(model)
    kept = set(range(len(model.blocks)))
    for i in torch.argsort(influence, stable=True).tolist():
        if total <= target_params:
            break
        if len(kept) == 1:
            raise ValueError(f"no depth fits {target_params} parameters: one block leaves "
                             f"{total}")
        kept.discard(i)
        total -= param_count(model.blocks[i])
    layers = sorted(kept)
    log.info("depth pruning: kept layers %s, %d params (target %d)", layers, total,
             target_params)
    return keep_layers(model, layers), layers


# ---- Wanda (Sun et al. 2023) -------------------------------------------------------------------


def input_norms(model: GPT, batches: Sequence[Tensor]) -> dict[str, Tensor]:
    """``||X_j||_2`` over all calibration tokens of every input feature j of every block Linear,
    by weight name (float32, on the weight's device)."""
    linears = _block_linears(model)
    squares = {name: torch.zeros(linear.in_features, device=linear.weight.device)
               for name, linear in linears.items()}

    def hook(name: str, linear: nn.Linear) -> RemovableHandle:
        def record(_module: nn.Module, args: tuple[Tensor, ...]) -> None:
            squares[name] += args[0].flatten(0, -2).float().square().sum(0)

        return linear.register_forward_pre_hook(record)

    handles = [hook(name, linear) for name, linear in linears.items()]
    try:
        _calibrate(model, batches)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total.sqrt() for name, total in squares.items()}


def wanda_scores(weight: Tensor, norms: Tensor) -> Tensor:
    """Wanda's score ``|W_ij| * ||X_j||_2`` (float32) of a weight (out, in)."""
    return weight.detach().float().abs() * norms.to(weight.device).unsqueeze(0)


@torch.no_grad()
def wanda(model: GPT, norms: dict[str, Tensor], target_nonzeros: int
          ) -> tuple[GPT, dict[str, Tensor]]:
    """A copy of model with its block Linear weights pruned by Wanda's score (``norms``: the
    input norms of :func:`input_norms` of this model) until exactly target_nonzeros parameters
    are nonzero (all parameters, tied once); and the boolean masks by weight name (True: the
    weight is nonzero after pruning)."""
    pruned = copy.deepcopy(model)
    linears = _block_linears(pruned)
    weights = {name: linear.weight for name, linear in linears.items()}
    current = nonzero_params(pruned)
    prunable_nonzero = sum(int(torch.count_nonzero(w)) for w in weights.values())
    lowest = current - prunable_nonzero
    if not lowest <= target_nonzeros <= current:
        raise ValueError(f"target_nonzeros {target_nonzeros} not in [{lowest}, {current}]: "
                         f"{lowest} nonzeros lie outside the block Linear weights")
    to_prune = current - target_nonzeros
    entries = sum(w.numel() for w in weights.values())
    scores = {name: wanda_scores(w, norms[name]) for name, w in weights.items()}
    keep: dict[str, Tensor] = {}
    for name, w in weights.items():
        per_row = to_prune * w.size(1) // entries  # one sparsity ratio for every layer
        order = torch.argsort(scores[name], dim=1, stable=True)
        mask = torch.ones_like(w, dtype=torch.bool)
        mask.scatter_(1, order[:, :per_row], False)
        keep[name] = mask & (w != 0)
    remainder = sum(int(m.sum()) for m in keep.values()) + lowest - target_nonzeros
    if remainder:  # the globally lowest remaining scores; each layer offers its lowest few
        names = list(keep)
        values, where = [], []
        for index, name in enumerate(names):
            remaining = scores[name].masked_fill(~keep[name], math.inf).flatten()
            low = torch.topk(remaining, min(remainder, remaining.numel()), largest=False)
            values.append(low.values.cpu())
            where += [(index, int(j)) for j in low.indices.tolist()]
        chosen = torch.topk(torch.cat(values), remainder, largest=False).indices.tolist()
        for c in chosen:
            index, flat = where[c]
            keep[names[index]].view(-1)[flat] = False
    for name, w in weights.items():
        w.mul_(keep[name])
    assert nonzero_params(pruned) == target_nonzeros, "Wanda missed its nonzero target"
    log.info("Wanda: %d of %d block Linear weights pruned, %d nonzero params", to_prune,
             entries, target_nonzeros)
    return pruned, keep
