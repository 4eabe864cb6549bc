"""Feature matrix of archs for surrogates: the space encoding plus analytic size columns.

Besides :meth:`SearchSpace.encode`, every row carries log(parameter count) and log(forward
FLOPs at the measured batch and sequence length), which make latency, energy and memory nearly
linear in the features. Both counts are computed from the encoded matrix with numpy, using the
closed forms of :meth:`SearchSpace.n_params` and :func:`~hwgptbench.meters.flops.forward_flops`,
so 10^5 archs take no Python loop beyond the encoding itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..space import Arch, SearchSpace

ANALYTIC_COLUMNS = ("log_n_params", "log_forward_flops")


def feature_names(space: SearchSpace) -> list[str]:
    """Column names of :func:`feature_matrix`."""
    return space.feature_names() + list(ANALYTIC_COLUMNS)


def analytic_counts(space: SearchSpace, encoded: np.ndarray, vocab_size: int, batch_size: int,
                    seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact parameter counts and forward FLOPs (int64) of the rows of ``space.encode(archs)``."""
    n_max = space.max_n_layer
    embed = encoded[:, 0].astype(np.int64)[:, None]
    n_layer = encoded[:, 1].astype(np.int64)[:, None]
    bias = encoded[:, 2].astype(np.int64)[:, None]
    present = np.arange(n_max)[None, :] < n_layer
    heads = np.where(present, encoded[:, 3:3 + n_max], 0).astype(np.int64)
    # Look the exact ratio up among the choices so that int(ratio * embed_dim) matches Arch.
    ratio_choices = np.asarray(space.mlp_ratio, dtype=np.float64)
    ratio_index = np.searchsorted(np.asarray(space.mlp_ratio, dtype=np.float32),
                                  encoded[:, 3 + n_max:3 + 2 * n_max])
    ratio_index = np.minimum(ratio_index, len(ratio_choices) - 1)
    hidden = np.floor(ratio_choices[ratio_index] * embed).astype(np.int64)
    hidden = np.where(present, hidden, 0)
    width = heads * space.head_size
    kv_heads = np.where(present, space.n_kv_head, 0) if space.n_kv_head else heads
    kv_width = kv_heads * space.head_size
    llama = space.family == "llama"
    mlp_in = 2 if llama else 1  # gate and up, or fc (as SearchSpace.n_params)
    norm = 1 if llama else 2  # RMSNorm: scale; LayerNorm: scale and shift, bias flag or not

    per_layer = (embed * (2 * norm + 2 * width + 2 * kv_width + (mlp_in + 1) * hidden)
                 + bias * (width + 2 * kv_width + 2 * embed + mlp_in * hidden))
    lm_heads = 2 if llama else 1  # an untied LM head
    n_params = (embed[:, 0] * (lm_heads * vocab_size + norm)
                + np.where(present, per_layer, 0).sum(1))

    tokens = batch_size * seq_len
    attention = 4 * batch_size * heads * seq_len * seq_len * space.head_size
    flops = 2 * tokens * embed[:, 0] * vocab_size
    projections = 2 * width + 2 * kv_width + (mlp_in + 1) * hidden
    flops = flops + (2 * tokens * embed * projections + attention).sum(1)
    return n_params, flops


def feature_matrix(space: SearchSpace, archs: Sequence[Arch], vocab_size: int, batch_size: int,
                   seq_len: int) -> np.ndarray:
    """float32 features (n, len(feature_names(space))) of archs for one measurement condition."""
    return features_of_encoded(space, space.encode(archs), vocab_size, batch_size, seq_len)


def features_of_encoded(space: SearchSpace, encoded: np.ndarray, vocab_size: int,
                        batch_size: int, seq_len: int) -> np.ndarray:
    """:func:`feature_matrix` from the rows of ``space.encode(archs)`` (the leading columns of
    any feature matrix), e.g. to re-derive the features of another condition."""
    encoded = np.asarray(encoded, dtype=np.float32)
    n_params, flops = analytic_counts(space, encoded, vocab_size, batch_size, seq_len)
    analytic = np.column_stack([np.log(n_params), np.log(flops)]).astype(np.float32)
    return np.concatenate([encoded, analytic], axis=1)
