"""The supernet stage: the archs that later stages evaluate (``archs``), and the weight-sharing
supernet trained on them with the sandwich rule (``train``; ``load_supernet`` reads it back).

Importing the package loads neither torch nor the model: ``load_supernet`` imports them on
first use.
"""

from ..lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"load_supernet": "train"})
__all__ = ["load_supernet"]
