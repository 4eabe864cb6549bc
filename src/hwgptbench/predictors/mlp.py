"""Deep-ensemble surrogate: K small torch MLPs from different seeds, full-batch AdamW.

Inputs and the (log) target are standardised with training statistics. The prediction is the
ensemble mean. The interval is mean ± z·sqrt(ensemble variance + residual variance), z the
normal quantile of the nominal coverage: the ensemble variance (across members, ddof 0)
captures disagreement away from the training data, and the residual variance captures
measurement noise that every member fits alike. The residual variance is the mean squared
error of ensembles cross-fitted on ``calibration_folds`` folds, predicting the rows they did
not see: in-sample residuals of members that fit the noise made the nominal 90% interval
cover only 26–40% of held-out rows on the tiny benchmark. ``calibration_folds=0`` uses the
in-sample residuals (one fit instead of 1 + folds).

The members are trained together as one batched network (:class:`_Members`: each layer's
weights stacked over members, one batched matmul per layer), which is the same optimisation as
training them one by one (AdamW is elementwise and the members share nothing) at a fraction of
the per-step overhead. Training runs on a fixed number of torch threads (default 1): fits are
then bit-identical run to run, and small matrices gain nothing from more threads. Prediction
of large batches runs on every core, as LightGBM's does: one query of 10^5 archs is a few
large matmuls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from scipy.stats import norm
from torch import nn

from ..io import CorruptFileError, atomic_write_text, load_torch, read_json, save_torch
from ..outputs import make_dirs
from .base import FIX, check_features, check_rows, from_target, to_target

log = logging.getLogger(__name__)

_OPTIONS = "options.json"
_WEIGHTS = "members.pt"
PARALLEL_ROWS = 4096  # predictions of at least this many rows run on every core
_OPTION_NAMES = ("hidden", "layers", "members", "epochs", "lr", "weight_decay", "seed",
                 "log_target", "coverage", "num_threads", "calibration_folds")


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run torch ops on n intra-op threads, restoring the previous setting afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _network(n_in: int, hidden: int, layers: int) -> nn.Sequential:
    """An MLP with `layers` hidden SiLU layers of width `hidden` and one output."""
    modules: list[nn.Module] = []
    for width_in in [n_in] + [hidden] * (layers - 1):
        modules += [nn.Linear(width_in, hidden), nn.SiLU()]
    return nn.Sequential(*modules, nn.Linear(hidden, 1))


class _Members(nn.Module):
    """K MLPs of the same shape as one module: layer weights (K, in, out), biases (K, 1, out)."""

    def __init__(self, nets: list[nn.Sequential]) -> None:
        super().__init__()
        linears = [[m for m in net if isinstance(m, nn.Linear)] for net in nets]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([layer[i].weight.detach().T for layer in linears]))
            for i in range(len(linears[0])))
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([layer[i].bias.detach()[None] for layer in linears]))
            for i in range(len(linears[0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs (K, n) of every member for inputs (n, in)."""
        h = x.expand(len(self.weights[0]), *x.shape)
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = torch.baddbmm(bias, h, weight)
            if i < last:
                h = nn.functional.silu(h)
        return h[..., 0]

    def state_dicts(self, n_in: int, hidden: int, layers: int) -> list[dict[str, torch.Tensor]]:
        """Each member as the state dict of an :func:`_network` (the stored format)."""
        states = []
        for k in range(len(self.weights[0])):
            net = _network(n_in, hidden, layers)
            linears = [m for m in net if isinstance(m, nn.Linear)]
            with torch.no_grad():
                for linear, weight, bias in zip(linears, self.weights, self.biases, strict=True):
                    linear.weight.copy_(weight[k].T)
                    linear.bias.copy_(bias[k, 0])
            states.append(net.state_dict())
        return states


class MLPEnsembleSurrogate:
    """Ensemble of small MLPs; Gaussian interval from ensemble plus residual variance."""

    family: ClassVar[str] = "mlp_ensemble"

    def __init__(self, hidden: int = 64, layers: int = 2, members: int = 5, epochs: int = 300,
                 lr: float = 1e-2, weight_decay: float = 1e-4, seed: int = 0,
                 log_target: bool = True, coverage: float = 0.9, num_threads: int = 1,
                 calibration_folds: int = 3) -> None:
        if min(hidden, layers, members, epochs, num_threads) < 1:
            raise ValueError("hidden, layers, members, epochs and num_threads must be positive")
        if calibration_folds == 1 or calibration_folds < 0:
            raise ValueError(f"calibration_folds must be 0 (off) or >= 2, got {calibration_folds}")
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {coverage}")
        self.hidden, self.layers, self.members, self.epochs = hidden, layers, members, epochs
        self.lr, self.weight_decay, self.seed = lr, weight_decay, seed
        self.log_target, self.coverage, self.num_threads = log_target, coverage, num_threads
        self.calibration_folds = calibration_folds
        self.members_net: _Members | None = None
        self.stats: dict[str, Any] = {}

    def _options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OPTION_NAMES}

    def _build(self, n_in: int) -> None:
        """Fresh members, member k initialised from seed + k without touching global RNG."""
        with torch.random.fork_rng(devices=[]):
            nets = []
            for k in range(self.members):
                torch.manual_seed(self.seed + k)
                nets.append(_network(n_in, self.hidden, self.layers))
        self.members_net = _Members(nets)

    def _inputs(self, X: np.ndarray) -> torch.Tensor:
        X = check_features(X)
        if X.shape[1] != self.stats["n_features"]:
            raise ValueError(f"expected {self.stats['n_features']} features, got {X.shape[1]}")
        mean, scale = np.asarray(self.stats["x_mean"]), np.asarray(self.stats["x_scale"])
        return torch.from_numpy(((X - mean) / scale).astype(np.float32))

    def _member_outputs(self, x: torch.Tensor, threads: int | None = None) -> torch.Tensor:
        """Outputs (K, n) of the members, on ``threads`` (default: ``num_threads``)."""
        assert self.members_net is not None
        with torch.inference_mode(), _torch_threads(threads or self.num_threads):
            return self.members_net(x)

    def _train(self, x: torch.Tensor, target: torch.Tensor) -> None:
        """Full-batch AdamW with a cosine learning-rate decay over `epochs` steps."""
        assert self.members_net is not None
        net = self.members_net
        optimizer = torch.optim.AdamW(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, self.epochs)
        with _torch_threads(self.num_threads):
            for _ in range(self.epochs):
                optimizer.zero_grad()
                # Members share no parameters, so one summed loss trains each independently.
                loss = (net(x) - target).square().mean(dim=1).sum()
                loss.backward()
                optimizer.step()
                schedule.step()

    def _cross_fitted_residual_var(self, x: torch.Tensor, target: torch.Tensor) -> float:
        """Mean squared error of ensembles fitted without the rows they predict."""
        from .quality import fold_indices

        residual = np.empty(len(target))
        for held_out in fold_indices(len(target), self.calibration_folds, self.seed):
            train = np.ones(len(target), dtype=bool)
            train[held_out] = False
            self._build(x.shape[1])
            self._train(x[train], target[train])
            predicted = self._member_outputs(x[held_out]).double().numpy().mean(0)
            residual[held_out] = predicted - target[held_out].double().numpy()
        return float(np.mean(residual**2))

    def fit(self, X: np.ndarray, y: np.ndarray) -> MLPEnsembleSurrogate:
        """Standardise, train all members, estimate the residual variance; return self."""
        X = check_features(X)
        z = to_target(y, self.log_target)
        check_rows(X, z)
        start = time.perf_counter()
        x_scale = X.std(axis=0, dtype=np.float64)
        self.stats = {"n_features": X.shape[1],
                      "x_mean": X.mean(axis=0, dtype=np.float64).tolist(),
                      "x_scale": np.where(x_scale > 0, x_scale, 1.0).tolist(),
                      "y_mean": float(z.mean()), "y_scale": float(z.std()) or 1.0}
        x = self._inputs(X)
        target = (z - self.stats["y_mean"]) / self.stats["y_scale"]
        target_t = torch.from_numpy(target.astype(np.float32))
        self.stats["residual_var"] = (self._cross_fitted_residual_var(x, target_t)
                                      if self.calibration_folds else None)
        self._build(X.shape[1])
        self._train(x, target_t)
        if self.stats["residual_var"] is None:
            residual = self._member_outputs(x).double().numpy().mean(0) - target
            self.stats["residual_var"] = float(np.mean(residual**2))
        log.debug("fitted %d-member MLP ensemble on %d rows in %.2f s", self.members, len(z),
                  time.perf_counter() - start)
        return self

    def _standardised(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ensemble mean and variance (ddof 0) in standardised target space."""
        if self.members_net is None:
            raise RuntimeError("MLPEnsembleSurrogate is not fitted; call fit or load first")
        # every core for large batches, as LightGBM predicts (10^5 archs: 0.49 -> 0.24 s on 2
        # cores); a few rows on one thread, where waking a thread pool costs more than it gives
        threads = os.cpu_count() if len(X) >= PARALLEL_ROWS else self.num_threads
        outputs = self._member_outputs(self._inputs(X), threads).double().numpy()
        return outputs.mean(0), outputs.var(0)

    def _unstandardise(self, z: np.ndarray) -> np.ndarray:
        return from_target(z * self.stats["y_scale"] + self.stats["y_mean"], self.log_target)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Ensemble-mean predictions (n,) in metric units."""
        return self._unstandardise(self._standardised(X)[0])

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """mean ± z·sqrt(ensemble variance + residual variance), mapped to metric units."""
        mean, variance = self._standardised(X)
        half = norm.ppf(0.5 + self.coverage / 2) * np.sqrt(variance + self.stats["residual_var"])
        return self._unstandardise(mean - half), self._unstandardise(mean + half)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write the member state dicts with torch.save plus options and statistics as JSON."""
        if self.members_net is None:
            raise RuntimeError("MLPEnsembleSurrogate is not fitted; nothing to save")
        folder = make_dirs(folder)
        states = self.members_net.state_dicts(self.stats["n_features"], self.hidden, self.layers)
        save_torch(states, folder / _WEIGHTS)
        document = {"options": self._options(), "stats": self.stats}
        atomic_write_text(folder / _OPTIONS, json.dumps(document, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> MLPEnsembleSurrogate:
        """Read a model written by :meth:`save`."""
        folder = Path(folder)
        document = read_json(folder / _OPTIONS, FIX)
        options, n_in = _checked_options(document, folder / _OPTIONS)
        model = cls(**options)
        model.stats = document["stats"]
        states = load_torch(folder / _WEIGHTS, FIX, max_bytes=MAX_WEIGHTS)
        # the widths of options.json are checked against the stored tensors' sizes before a
        # network is built: a width alone would allocate its network (hidden 12000: 2.6 GB)
        shapes = _shapes(n_in, model.hidden, model.layers)
        if not (isinstance(states, list) and len(states) == model.members and all(
                isinstance(state, dict) and set(state) == set(shapes)
                and all(isinstance(value, torch.Tensor) and tuple(value.shape) == shapes[key]
                        for key, value in state.items()) for state in states)):
            raise CorruptFileError(f"{folder / _WEIGHTS} does not hold the {model.members} "
                                   f"networks of width {model.hidden} and {model.layers} "
                                   f"layers over {n_in} features that {_OPTIONS} describes: "
                                   f"{FIX}")
        nets = [_network(n_in, model.hidden, model.layers) for _ in range(model.members)]
        for net, state in zip(nets, states, strict=True):
            net.load_state_dict(state)
        model.members_net = _Members(nets)
        return model


MAX_WEIGHTS = 256 << 20  # bytes of members.pt (5 members of width 64 over 30 features: 0.1 MB)


def _checked_options(document: Any, path: Path) -> tuple[dict[str, Any], int]:
    """The options of an ``options.json`` document and its feature count, their types and
    names checked (the widths are checked against the weights' sizes by the caller);
    :class:`CorruptFileError` otherwise."""
    options = document.get("options") if isinstance(document, dict) else None
    stats = document.get("stats") if isinstance(document, dict) else None
    n_in = stats.get("n_features") if isinstance(stats, dict) else None
    if (not isinstance(options, dict) or not set(options) <= set(_OPTION_NAMES)
            or any(type(options.get(key, 1)) is not int or options.get(key, 1) < 1
                   for key in ("hidden", "layers", "members"))
            or type(n_in) is not int or n_in < 1):
        raise CorruptFileError(f"{path} is not an MLP ensemble's options (options of "
                               f"{', '.join(_OPTION_NAMES)}, positive integer widths, "
                               f"stats with n_features): {FIX}")
    return options, n_in


def _shapes(n_in: int, hidden: int, layers: int) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and tensor sizes of :func:`_network`, computed without building
    it."""
    shapes: dict[str, tuple[int, ...]] = {}
    width = n_in
    for layer in range(layers):
        shapes[f"{2 * layer}.weight"], shapes[f"{2 * layer}.bias"] = (hidden, width), (hidden,)
        width = hidden
    shapes[f"{2 * layers}.weight"], shapes[f"{2 * layers}.bias"] = (1, hidden), (1,)
    return shapes
