"""Names that result tables share with the code that reads them.

The figures and the report read result tables only; what they need to know about a table's
values (the breakdown's category names, which perplexity rows are the fully trained
supernet's) lives here, where the stage that writes the table and its readers both import it,
so that no reader imports a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

ANY = "any"  # device and condition of perplexity (quality, surrogates), which depends on neither

# Categories of the runtime breakdown table (``category`` column of the ``modules`` view)
OTHER = "other"
MODULE_CLASSES = ("embedding", "qkv_proj", "attention_core", "out_proj", "mlp_up",
                  "mlp_activation", "mlp_down", "norm", "residual", "lm_head")
# ranges the workloads record themselves (hwgptbench.runtime.workloads)
STAGE_CLASSES = ("sampling", "backward", "optimizer")
# the data-parallel train step's collectives (hwgptbench.runtime.parallel): the class of their
# time in the ``modules`` view, and their kinds in the ``collectives`` view
COMMUNICATION = "communication"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def fully_trained(table: pl.DataFrame) -> pl.DataFrame:
    """The rows of a perplexity table scored by the fully trained supernet (largest
    ``train_steps``)."""
    import polars as pl

    return table.filter(pl.col("train_steps") == pl.col("train_steps").max())
