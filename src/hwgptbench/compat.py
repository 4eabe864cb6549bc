"""HW-GPT-Bench's query API (``hwgpt.api.HWGPT``) answered by this benchmark.

A script written for HW-GPT-Bench runs with one changed import::

    from hwgptbench.compat import HWGPT          # was: from hwgpt.api import HWGPT
    api = HWGPT(search_space="s", use_supernet_surrogate=False)
    config = api.sample_arch()                   # {"sample_embed_dim": 384, ...}
    api.set_arch(config)
    api.query()                                  # every metric, every device
    api.query(metric="latencies", device=api.device_list[0])
    api.query(metric="perplexity", predictor="mlp")

Configs, metric names and return shapes are HW-GPT-Bench's; the numbers are this benchmark's
(:class:`~hwgptbench.api.Benchmark`, on the shipped tables or a run's results): ``perplexity``
and ``accuracy`` (HW-GPT-Bench's published values for its published archs, the surrogate
elsewhere), ``latencies`` (ms) and ``energies`` (mJ; None on a device without an energy
counter) per device, ``flops``, ``params``, ``float16_memory`` and ``bfloat16_memory``
(computed). docs/hwgptbench_api.md sets the two APIs and their metric definitions side by side.
An argument of the wrong type or value is a :class:`~hwgptbench.api.QueryError` naming it and
what it accepts.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .api import Benchmark, NoSurrogatesError, QueryError, bool_argument, scale_name
from .space import Arch, SearchSpace

log = logging.getLogger(__name__)

# the devices of HW-GPT-Bench's tables, none of which it published measurements of
HWGPTBENCH_DEVICES = ("a100", "a40", "h100", "rtx2080", "rtx3080", "a6000", "v100", "P100",
                      "cpu_xeon_silver", "cpu_xeon_gold", "cpu_amd_7502", "cpu_amd_7513",
                      "cpu_amd_7452")
PER_DEVICE = {"latencies": "latency_ms", "energies": "energy_mj"}
COMPUTED = ("flops", "params")  # in HW-GPT-Bench's order; Benchmark computes both exactly
# bytes per parameter of the weights in that dtype
MEMORY = {"float16_memory": 2, "bfloat16_memory": 2}
ARCH_ONLY = ("perplexity", "accuracy")
MEGABYTE = 1e6
# the list fields of a config: one value per layer
LAYER_LISTS = ("sample_layer_indices", "sample_n_head", "sample_mlp_ratio")


def _as_bool(value: Any) -> bool:
    """HW-GPT-Bench writes the bias flag as a bool or as the string "True" / "False"."""
    if isinstance(value, bool):
        return value
    if value in ("True", "False"):
        return value == "True"
    raise QueryError(f"sample_bias: {value!r} is not True, False, 'True' or 'False'")


def _base_folder(base_path: Any) -> Path:
    """``base_path`` if it names an existing folder (its ``results/`` may be absent: the
    shipped tables' surrogates are then cached in a new one, or in the user cache folder for
    the working directory outside a project checkout:
    :func:`~hwgptbench.published.surrogates.cache_results`)."""
    if not isinstance(base_path, (str, os.PathLike)):
        raise QueryError(f"base_path: {base_path!r} is not a path; pass the folder whose "
                         "results/ is read (default: '.')")
    folder = Path(base_path)
    if not folder.is_dir():
        raise QueryError(f"base_path: {folder} is not an existing folder; pass the folder whose "
                         "results/ is read (HW-GPT-Bench: its checkout; default '.')")
    return folder


def _checked_predictor(predictor: Any) -> str:
    """``predictor`` if it is a str: ``mlp`` the surrogate, any other name the supernet's
    evaluation."""
    if not isinstance(predictor, str):
        raise QueryError(f"predictor: {predictor!r} is not a str; 'mlp' (the surrogate) or "
                         "another name (the supernet's published evaluation)")
    return predictor


def _names(value: Any, argument: str, known: Sequence[str]) -> list[str]:
    """A name, or a list or tuple of names, as a list (``known``: the names a message lists)."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise QueryError(f"{argument}: {value!r} is not a name or a list of names; known: "
                         f"{', '.join(known) or 'none'}")
    return list(names)


def arch_of(config: Mapping[str, Any], space: SearchSpace) -> Arch:
    """The arch of a HW-GPT-Bench config (``sample_*`` keys; head and ratio lists of the
    space's maximum depth or of ``sample_n_layer``, of which the first ``sample_n_layer``
    count)."""
    if not isinstance(config, Mapping):
        raise QueryError(f"config: {config!r} is not a dict; set_arch takes a dict like "
                         "sample_arch() returns")
    required = ("sample_embed_dim", "sample_n_layer", "sample_n_head", "sample_mlp_ratio",
                "sample_bias")
    missing = [key for key in required if key not in config]
    if missing:
        raise QueryError(f"config lacks {', '.join(missing)}: set_arch takes a dict like "
                         "sample_arch() returns")
    n_layer = config["sample_n_layer"]
    if not isinstance(n_layer, int) or isinstance(n_layer, bool) or n_layer < 1:
        raise QueryError(f"sample_n_layer: {n_layer!r} is not a positive int")
    if n_layer not in space.n_layer:  # before any list of n_layer values is built
        raise QueryError(f"sample_n_layer: {n_layer} is not a layer count of the {space.name} "
                         f"space ({', '.join(map(str, space.n_layer))})")
    for name in LAYER_LISTS:
        if name in config and not isinstance(config[name], (list, tuple)):
            raise QueryError(f"{name}: {config[name]!r} is not a list (one value per layer)")
    indices = config.get("sample_layer_indices", list(range(n_layer)))
    if list(indices) != list(range(n_layer)):
        raise QueryError(f"sample_layer_indices: {list(indices)} skips or reorders layers; "
                         f"this benchmark's archs run the first sample_n_layer layers "
                         f"(HW-GPT-Bench's 'normal' scheme: {list(range(n_layer))})")
    heads, ratios = list(config["sample_n_head"]), list(config["sample_mlp_ratio"])
    for name, values in (("sample_n_head", heads), ("sample_mlp_ratio", ratios)):
        if len(values) < n_layer:
            raise QueryError(f"{name}: {len(values)} values for {n_layer} layers")
    try:
        arch = Arch(embed_dim=config["sample_embed_dim"], n_layer=n_layer,
                    n_head=tuple(heads[:n_layer]), mlp_ratio=tuple(ratios[:n_layer]),
                    bias=_as_bool(config["sample_bias"]))
        space.validate(arch)
    except ValueError as err:
        raise QueryError(f"config {dict(config)} is not an arch of the {space.name} space: "
                         f"{err}") from None
    return arch


def config_of(arch: Arch, space: SearchSpace) -> dict[str, Any]:
    """HW-GPT-Bench's config of an arch: lists at the space's maximum depth, the layers past
    ``n_layer`` filled with the arch's last values (they take no part)."""
    fill = space.max_n_layer - arch.n_layer
    return {"sample_embed_dim": arch.embed_dim, "sample_n_layer": arch.n_layer,
            "sample_layer_indices": list(range(arch.n_layer)),
            "sample_n_head": [*arch.n_head, *[arch.n_head[-1]] * fill],
            "sample_mlp_ratio": [*arch.mlp_ratio, *[arch.mlp_ratio[-1]] * fill],
            "sample_bias": arch.bias}


class HWGPT:
    """HW-GPT-Bench's ``HWGPT`` over :class:`~hwgptbench.api.Benchmark`.

    ``base_path`` is an existing folder whose ``results/`` is read (HW-GPT-Bench: its
    checkout; the shipped tables' surrogates are cached there, or, for the default ``.``
    outside a project checkout, in the user cache folder); a shipped scale answers for its
    shipped devices and those measured or adapted there
    (:meth:`Benchmark.load <hwgptbench.api.Benchmark.load>`), each named by its label
    (``device_list``; an adapted device at the condition `hwgptbench adapt` chose).
    ``use_supernet_surrogate`` adds ``perplexity`` and ``accuracy`` to every :meth:`query`, as
    HW-GPT-Bench's supernet evaluation did. ``prefer_measured`` answers every metric with its
    measured (or published) value where the arch has one, and the surrogate's elsewhere;
    False: the surrogate's everywhere.
    """

    def __init__(self, search_space: str, use_supernet_surrogate: bool = True,
                 base_path: str | os.PathLike[str] = ".", prefer_measured: bool = True
                 ) -> None:
        self.search_space_name = scale_name(search_space, "search_space")
        self.base_path = base_path
        self.use_supernet_surrogate = bool_argument(use_supernet_surrogate,
                                                     "use_supernet_surrogate")
        prefer_measured = bool_argument(prefer_measured, "prefer_measured")
        results = _base_folder(base_path) / "results"
        try:
            self.benchmark = Benchmark.load(search_space, results)
        except NoSurrogatesError as err:
            raise QueryError(f"search_space: {search_space!r} has no tables here ({err})"
                             ) from None
        space = self.benchmark.space
        self.search_space = {"embed_dim_choices": list(space.embed_dim),
                             "n_layer_choices": list(space.n_layer),
                             "mlp_ratio_choices": list(space.mlp_ratio),
                             "n_head_choices": list(space.n_head),
                             "bias_choices": list(space.bias)}
        self.device_list = self.benchmark.devices
        self.hw_metrics_surrogate = list(PER_DEVICE)
        self.hw_metrics_true = [*COMPUTED, *MEMORY]
        self.metrics = list(ARCH_ONLY)
        self.mode = "auto" if prefer_measured else "surrogate"
        self.config: dict[str, Any] | None = None
        self._arch: Arch | None = None
        # the (device, metric) pairs without a table here that a warning has named already
        self._missing_named: set[tuple[str, str]] = set()

    def sample_arch(self) -> dict[str, Any]:
        """A uniformly drawn arch's config (drawn from Python's ``random``, as HW-GPT-Bench's:
        ``random.seed`` makes it repeat); it becomes the current arch."""
        space, rng = self.benchmark.space, random.Random(random.getrandbits(64))
        depth = space.max_n_layer
        embed_dim, n_layer = rng.choice(space.embed_dim), rng.choice(space.n_layer)
        config = {"sample_embed_dim": embed_dim, "sample_n_layer": n_layer,
                  "sample_layer_indices": list(range(n_layer)),
                  "sample_n_head": [rng.choice(space.n_head) for _ in range(depth)],
                  "sample_mlp_ratio": [rng.choice(space.mlp_ratio) for _ in range(depth)],
                  "sample_bias": rng.choice(space.bias)}
        self.set_arch(config)
        return config

    def set_arch(self, config: Mapping[str, Any]) -> None:
        """Make ``config`` (HW-GPT-Bench's ``sample_*`` dict) the arch that queries answer."""
        self._arch = arch_of(config, self.benchmark.space)
        self.config = dict(config)

    @property
    def arch(self) -> Arch:
        """The current arch (:meth:`set_arch`)."""
        if self._arch is None:
            raise QueryError("Please set arch config before querying: api.set_arch(config), "
                             "e.g. with config = api.sample_arch()")
        return self._arch

    def _value(self, metric: str, device: str | None = None, mode: str | None = None) -> Any:
        """One metric of the current arch (None where the device does not measure it)."""
        if device is not None:
            self._check_device(device)
            if metric not in self.benchmark.metrics or device not in self.benchmark.devices_of(
                    metric):
                return None
        return self.benchmark.query([self.arch], metric, device=device,
                                    mode=mode or self.mode)[metric][0]

    def _check_device(self, device: Any) -> None:
        if not isinstance(device, str):
            raise QueryError(f"device: {device!r} is not a device name; devices with tables "
                             f"here: {', '.join(self.device_list) or 'none'}")
        if device in self.device_list:
            return
        borrowed = (f"{device!r} is one of HW-GPT-Bench's devices, whose measurements it never "
                    "published; " if device in HWGPTBENCH_DEVICES else f"unknown device "
                    f"{device!r}; ")
        raise QueryError(f"{borrowed}devices with tables here: "
                         f"{', '.join(self.device_list) or 'none'} (measure yours: "
                         "docs/guide.md, 'Adding a device'; or adapt it from a few measured "
                         "archs, whose label then names it here: `hwgptbench adapt`, "
                         "docs/transfer.md)")

    def compute_predictions_ppl(self) -> float:
        """Perplexity of the current arch (published where it was, else predicted)."""
        return float(self._value("perplexity"))

    def get_flops(self) -> int:
        """FLOPs of one forward of the current arch at batch 1 and the space's block size."""
        return int(self._value("flops"))

    def get_params(self) -> int:
        """Parameters of the current arch (its trained sub-network, counted exactly)."""
        return int(self._value("params"))

    def get_memory(self, objective: str) -> float:
        """MB (10^6 bytes) of the current arch's weights in the dtype of ``objective``
        (``float16_memory`` or ``bfloat16_memory``)."""
        if not isinstance(objective, str) or objective not in MEMORY:
            raise QueryError(f"unknown memory metric {objective!r}; known: {', '.join(MEMORY)}")
        return self.get_params() * MEMORY[objective] / MEGABYTE

    def compute_predictions_hw(self, hw_metric: str, device: str) -> float | None:
        """``latencies`` (ms) or ``energies`` (mJ) of the current arch on ``device``."""
        if not isinstance(hw_metric, str) or hw_metric not in PER_DEVICE:
            raise QueryError(f"unknown per-device metric {hw_metric!r}; known: "
                             f"{', '.join(PER_DEVICE)}")
        self._check_device(device)
        value = self._value(PER_DEVICE[hw_metric], device)
        if value is None and (device, hw_metric) not in self._missing_named:
            self._missing_named.add((device, hw_metric))
            log.warning("%s: %s has no %s table here, so every query answers None for it",
                        hw_metric, device, PER_DEVICE[hw_metric])
        return value

    def _arch_metrics(self, predictor: str) -> dict[str, float]:
        """Perplexity and accuracy: ``predictor`` ``mlp`` as HW-GPT-Bench's surrogate (here:
        the selected one, after the published value); any other, its supernet evaluation
        (here: the published value only)."""
        mode = self.mode if _checked_predictor(predictor) == "mlp" else "measured"
        values = {metric: self._value(metric, mode=mode) for metric in ARCH_ONLY}
        if any(v is None for v in values.values()):
            raise QueryError(f"predictor {predictor!r} asks for the supernet's evaluation of "
                             f"{self.arch.id}, which is not among the published archs: query "
                             "with predictor='mlp' (the surrogate)")
        return values

    def query(self, device: str | Sequence[str] | None = None,
              metric: str | Sequence[str] | None = None, predictor: str = "mlp"
              ) -> dict[str, Any]:
        """Metrics of the current arch, shaped as HW-GPT-Bench's: ``{"latencies": {device:
        ms}, "energies": {device: mJ}, "flops": int, "params": int, "float16_memory": MB,
        ...}``; ``metric="perplexity"`` (or ``"accuracy"``) gives ``{"perplexity": float}``.
        A device alone asks for latencies and energies; a metric alone asks on every device."""
        known = [*PER_DEVICE, *COMPUTED, *MEMORY, *ARCH_ONLY]
        _checked_predictor(predictor)
        if device is not None and metric is None:
            metric = self.hw_metrics_surrogate
        if isinstance(metric, str) and metric in ARCH_ONLY:
            return {metric: self._arch_metrics(predictor)[metric]}
        devices = (self.device_list if device is None else
                   _names(device, "device", self.device_list))
        for name in devices:
            self._check_device(name)
        metrics = ([*self.hw_metrics_surrogate, *self.hw_metrics_true] if metric is None else
                   _names(metric, "metric", known))
        unknown = [m for m in metrics if m not in known]
        if unknown:
            raise QueryError(f"unknown metrics {unknown}; HW-GPT-Bench's metrics: "
                             f"{', '.join(known)}")
        results: dict[str, Any] = {}
        for name in metrics:
            if name in PER_DEVICE:
                results[name] = {d: self.compute_predictions_hw(name, d) for d in devices}
            elif name in MEMORY:
                results[name] = self.get_memory(name)
            elif name in COMPUTED:
                results[name] = int(self._value(name))
            else:
                results[name] = self._arch_metrics(predictor)[name]
        if self.use_supernet_surrogate:
            results.update(self._arch_metrics(predictor))
        return results
