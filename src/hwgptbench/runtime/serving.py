"""Serving sweep: time to first token, time per output token and throughput as the batch grows.

What a deployer reads off a model is two latencies and a throughput, at each batch size:

- **TTFT** (time to first token, ``ttft_ms``): the prefill of a ``seq_len``-token prompt for the
  whole batch, one forward whose last position gives the first token (the ``prefill``
  workload; the argmax over its logits is not timed: it is ~0.1% of the forward);
- **TPOT** (time per output token, ``tpot_ms``): one decode step of the batch with the KV
  cache, averaged over ``gen_len`` tokens (the ``decode`` workload, per token);
- **throughput** (``throughput_tokens_per_s``): generated tokens per second while decoding,
  ``batch_size / TPOT``; ``prefill_tokens_per_s`` is the prompt's tokens per second.

Each batch size's prefill and decode are two runtime conditions, timed by the runtime stage
as it times any (:func:`~hwgptbench.runtime.stage.measure_condition`: archs interleaved, the
same budget); this module sweeps the batch sizes and joins the two rows of each arch. A
batch is a static batch (every sequence starts and ends together): what continuous batching
in a serving engine approaches at steady state. ``end_to_end_ms`` is one request of
``gen_len`` tokens, ``ttft_ms + (gen_len - 1) * tpot_ms``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..meters.condition import Condition

KEPT = ("latency_ci95_ms", "memory_peak_mb", "memory_reason")


def serving_conditions(batch_size: int, seq_len: int, gen_len: int, dtype: str
                       ) -> tuple[Condition, Condition]:
    """The prefill and decode conditions of one batch size."""
    prefill = Condition(batch_size, seq_len, dtype, "eager", "prefill")
    return prefill, Condition(batch_size, seq_len, dtype, "eager", "decode", gen_len)


def _joined(prefill: dict[str, Any], decode: dict[str, Any]) -> dict[str, Any]:
    """One serving row from an arch's prefill and decode rows of one batch size."""
    failed = next((r for r in (prefill, decode) if r["status"] != "ok"), None)
    row = {"arch_id": prefill["arch_id"], "params": prefill["params"],
           "batch_size": prefill["batch_size"], "seq_len": prefill["seq_len"],
           "gen_len": decode["gen_len"], "dtype": prefill["dtype"],
           "threads": prefill["threads"],
           "status": "ok" if failed is None else failed["status"],
           "reason": None if failed is None else failed["reason"]}
    ttft, tpot = prefill["latency_ms"], decode["latency_ms"]
    if failed is not None or ttft is None or tpot is None:
        return row | {"ttft_ms": None, "tpot_ms": None, "throughput_tokens_per_s": None,
                      "prefill_tokens_per_s": None, "end_to_end_ms": None,
                      **{f"{k}_{w}": None for k in KEPT for w in ("prefill", "decode")}}
    return row | {
        "ttft_ms": ttft, "tpot_ms": tpot,
        "throughput_tokens_per_s": decode["tokens_per_s"],
        "prefill_tokens_per_s": prefill["tokens_per_s"],
        "end_to_end_ms": ttft + (decode["gen_len"] - 1) * tpot,
        **{f"{k}_prefill": prefill[k] for k in KEPT},
        **{f"{k}_decode": decode[k] for k in KEPT}}


def serving_sweep(measure: Callable[[Condition], list[dict[str, Any]]],
                  batch_sizes: Sequence[int], seq_len: int, gen_len: int, dtype: str
                  ) -> list[dict[str, Any]]:
    """One row per (arch, batch size): TTFT, TPOT, throughput, status (module doc).
    ``measure`` gives the runtime rows of one condition, one per arch in a fixed order."""
    rows = []
    for batch_size in batch_sizes:
        prefill, decode = serving_conditions(batch_size, seq_len, gen_len, dtype)
        rows += [_joined(p, d) for p, d in zip(measure(prefill), measure(decode), strict=True)]
    return rows
