"""Importance order of attention heads and MLP channels, so that "first k" keeps the best k.

A sub-network keeps the leading heads (of every key/value group) and the leading MLP channels
of each layer. Before a dense model becomes a supernet, its units are therefore permuted into
descending importance, layer by layer.

The score of a unit is the mean L2 norm of what it writes into the residual stream on
calibration tokens: for a head, the norm of its output projected by its columns of the output
projection (``x_h W_h^T``); for an MLP channel, ``|x_j| * ||W[:, j]||`` through the down
projection. It is activation-aware, as Wanda's ``|W| * ||X||`` is: a weight whose input is
always near zero matters little however large it is, which weight magnitude alone cannot see;
and it scores the unit's whole contribution, not one matrix. It costs one forward pass per
calibration batch and no gradients, so it scales to large checkpoints.

Permuting units leaves the dense model's function unchanged: query/key/value rows and output
columns of a head move together (with grouped-query attention a query head moves only within
its key/value group, whose keys and values it shares), as do an MLP channel's input rows (fc,
or gate and up) and output column. Layers are not reordered: depth is sliced from the front.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from ..model.gpt import GPT, Block, GatedMLP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerImportance:
    """Scores of one block's query heads (n_head,) and MLP channels (hidden,)."""

    heads: Tensor
    channels: Tensor


@torch.inference_mode()
def unit_importance(model: GPT, batches: Sequence[Tensor]) -> list[LayerImportance]:
    """Mean residual-stream contribution norm of every head and MLP channel, per block,
    over the token ids of the calibration batches (each (B, T))."""
    if not batches:
        raise ValueError("importance needs at least one calibration batch")
    sums = [[torch.zeros(b.attn.n_head), torch.zeros(b.mlp.proj.in_features)]
            for b in model.block_list()]
    tokens = 0

    def recorder(i: int, block: Block) -> list[RemovableHandle]:
        attn_proj, mlp_proj = block.attn.proj, block.mlp.proj
        hs = block.attn.head_size

        def heads(_module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
            x = args[0].flatten(0, -2).float()  # (N, n_head * hs)
            w = attn_proj.weight.float()  # (E, n_head * hs)
            for h in range(block.attn.n_head):
                part = x[:, h * hs:(h + 1) * hs] @ w[:, h * hs:(h + 1) * hs].T  # (N, E)
                sums[i][0][h] += part.norm(dim=-1).sum().cpu()

        def channels(_module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
            x = args[0].flatten(0, -2).float()  # (N, hidden)
            column_norms = mlp_proj.weight.float().norm(dim=0)  # (hidden,)
            sums[i][1] += (x.abs().sum(dim=0) * column_norms).cpu()

        return [attn_proj.register_forward_pre_hook(heads),
                mlp_proj.register_forward_pre_hook(channels)]

    handles = [h for i, block in enumerate(model.block_list()) for h in recorder(i, block)]
    was_training = model.training
    model.eval()
    device = model.wte.weight.device
    try:
        for x in batches:
            model(x.to(device))
            tokens += x.numel()
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return [LayerImportance(heads / tokens, channels / tokens) for heads, channels in sums]


def head_order(scores: Tensor, n_kv_head: int) -> Tensor:
    """Permutation of query heads: descending score within each key/value group (groups stay
    in place; one group per head without grouped-query attention, i.e. a global sort)."""
    n_head = scores.numel()
    if n_kv_head in (0, n_head):
        return torch.argsort(scores, descending=True, stable=True)
    group = n_head // n_kv_head
    within = torch.argsort(scores.view(n_kv_head, group), dim=1, descending=True, stable=True)
    return (within + torch.arange(n_kv_head).unsqueeze(1) * group).flatten()


def _rows(tensor: Tensor, order: Tensor, block: int) -> Tensor:
    """tensor's rows in blocks of ``block`` rows, permuted by order (over blocks)."""
    return tensor.unflatten(0, (-1, block))[order].flatten(0, 1)


@torch.no_grad()
def _permute_block(block: Block, heads: Tensor, channels: Tensor) -> None:
    attn, mlp = block.attn, block.mlp
    hs = attn.head_size
    mha = attn.n_kv_head == attn.n_head
    for param in (attn.qkv.weight, attn.qkv.bias):
        if param is None:
            continue
        q, k, v = param.split(attn.widths)
        k, v = (_rows(k, heads, hs), _rows(v, heads, hs)) if mha else (k, v)
        param.copy_(torch.cat([_rows(q, heads, hs), k, v]))
    attn.proj.weight.copy_(_rows(attn.proj.weight.T, heads, hs).T)
    inputs = [mlp.gate, mlp.up] if isinstance(mlp, GatedMLP) else [mlp.fc]
    for linear in inputs:
        linear.weight.copy_(linear.weight[channels])
        if linear.bias is not None:
            linear.bias.copy_(linear.bias[channels])
    mlp.proj.weight.copy_(mlp.proj.weight[:, channels])


def reorder(model: GPT, importance: Sequence[LayerImportance]) -> list[LayerImportance]:
    """Permute every block's heads and MLP channels into descending importance, in place; the
    model computes the same function. Returns the scores in the new order."""
    if len(importance) != len(model.blocks):
        raise ValueError(f"{len(importance)} layer scores for {len(model.blocks)} blocks")
    reordered = []
    for block, scores in zip(model.block_list(), importance, strict=True):
        heads = head_order(scores.heads, block.attn.n_kv_head)
        channels = torch.argsort(scores.channels, descending=True, stable=True)
        _permute_block(block, heads, channels)
        reordered.append(LayerImportance(scores.heads[heads], scores.channels[channels]))
    log.info("reordered the heads and MLP channels of %d blocks by importance", len(reordered))
    return reordered
