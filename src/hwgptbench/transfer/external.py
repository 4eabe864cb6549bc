"""Public latency data of other projects as few-shot transfer problems (docs/transfer.md).

Each loader reads files a user fetched (nothing of them ships with this package) and gives one
:class:`DeviceTable` per device: the archs' keys, a numeric feature vector per arch, the
measured latency (ms) and two analytic proxies (``flops``, ``params``) for the baselines.

- :func:`load_help_fbnet`: HELP's FBNet files (github.com/HayeonLee/HELP, ``data/fbnet``:
  ``metainfo.pt`` and ``latency/{device}.pt``; 5,000 archs of 22 layers, 9 ops each, every
  device measured on all of them). Features: one indicator per (layer, op). The ``.pt`` files
  are read with ``torch.load(weights_only=True)`` (plain lists and numbers; nothing executes).
- :func:`load_hat`: HAT's latency CSVs (github.com/mit-han-lab/hardware-aware-transformers,
  ``latency_dataset/{task}_{device}_all.csv``, MIT licence; 2,000 encoder-decoder
  SubTransformers per file, different archs per file). Latency = encoder + decoder mean.
  Features: per-layer cost terms of the encoder and decoder (products of widths and depths).
- :func:`load_gpt_tables`: this project's measurement tables (e.g. the shipped
  ``published/s/devices/*.parquet``), one device table per (device, condition).

:data:`SPLITS` holds each data set's published protocol (:class:`Split`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ..errors import UserError
from ..io import read_outside_parquet
from ..space import Arch


class ExternalDataError(UserError, ValueError):
    """Fetched data that is missing or not in the expected format."""


@dataclass
class DeviceTable:
    """One device's measured archs: keys (n,), features (n, d), latency in ms (n,), and the
    analytic proxies ``flops`` and ``params`` (n,)."""

    device: str
    keys: np.ndarray
    features: np.ndarray
    values: np.ndarray
    flops: np.ndarray
    params: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.keys)
        shapes = [len(self.values), len(self.flops), len(self.params), len(self.features)]
        if any(s != n for s in shapes):
            raise ExternalDataError(f"{self.device}: {n} archs but columns of lengths {shapes}")
        if not np.all(np.isfinite(self.values) & (self.values > 0)):
            raise ExternalDataError(f"{self.device}: latencies must be finite and positive")


@dataclass
class ExternalSet:
    """Device tables of one search space.

    ``standardise``: whether the features are scaled to unit variance before linear models
    (numeric features) or kept (indicators). ``blocks`` and ``groups`` (one int per feature, or
    None) describe indicator features: ``blocks`` the layer a feature belongs to, ``groups``
    the op it selects; the transfer methods may tie an op's deviation from the sources across
    layers (:class:`~.methods.TablePrior`)."""

    name: str
    tables: dict[str, DeviceTable]
    feature_names: list[str]
    standardise: bool
    blocks: np.ndarray | None = None
    groups: np.ndarray | None = None

    def table(self, device: str) -> DeviceTable:
        """The table of one device (an error names the known ones)."""
        if device not in self.tables:
            raise ExternalDataError(f"{self.name} has no device {device!r}; it has "
                                    f"{', '.join(sorted(self.tables))}")
        return self.tables[device]


@dataclass(frozen=True)
class Split:
    """An evaluation protocol: source devices, held-out target devices, where the k archs are
    drawn from and which archs are scored.

    ``protocol`` ``help``: HELP's meta-test (the k archs from its training pool, the first
    ``train`` archs without the 10% fastest and slowest on the target; scored on the next
    ``query`` archs, likewise trimmed), and also on every arch outside the k; ``all``: the k
    archs from all of the target's archs, scored on all the others. ``sources`` empty: every
    table whose device (``device_of``) differs from the target's, except ``exclude``.
    ``role``: ``choice`` (the methods are chosen on it) or ``report`` (scored, never chosen
    on)."""

    name: str
    targets: tuple[str, ...]
    sources: tuple[str, ...] = ()
    role: str = "report"
    exclude: tuple[str, ...] = ()
    protocol: str = "all"
    train: int = 4000
    query: int = 1000
    published: dict[str, dict[str, float]] = field(default_factory=dict)


HELP_TRAIN = ("1080ti_1", "1080ti_32", "1080ti_64", "silver_4114", "silver_4210r", "samsung_a50",
              "pixel3", "essential_ph_1", "samsung_s7")
HELP_VALIDATION = ("titanx_1", "titanx_32", "titanx_64", "gold_6240")
FBNET_UNUSED = ("2080ti_1", "2080ti_32", "2080ti_64", "gold_6226", "pixel2", "titan_rtx_1",
                "titan_rtx_32", "titan_rtx_64", "titanxp_1", "titanxp_32", "titanxp_64")
HELP_FBNET_SPLIT = Split(
    "help_fbnet", targets=("raspi4", "eyeriss", "fpga"), sources=HELP_TRAIN, protocol="help",
    # HELP's README, Table 2 (FBNet, 10 samples of the target): Spearman
    published={"HELP": {"raspi4": 0.887, "eyeriss": 0.943, "fpga": 0.892, "mean": 0.910},
               "MAML": {"raspi4": 0.718, "eyeriss": 0.763, "fpga": 0.727, "mean": 0.736},
               "Meta-SGD": {"raspi4": 0.821, "eyeriss": 0.822, "fpga": 0.776, "mean": 0.806}})


HAT_DEVICES = ("cpu_raspberrypi", "cpu_xeon", "gpu_titanxp")
HAT_REPORT = tuple(f"wmt14ende_{d}" for d in HAT_DEVICES)
# The methods are chosen on the choice splits and scored, unchanged, on the report splits;
# no report target is ever a source of a choice split.
SPLITS = {
    "help_validation": Split("help_validation", HELP_VALIDATION, HELP_TRAIN, role="choice",
                             protocol="help"),
    "fbnet_unused": Split("fbnet_unused", FBNET_UNUSED, HELP_TRAIN, role="choice",
                          protocol="help"),
    "hat_wmt14enfr": Split("hat_wmt14enfr", tuple(f"wmt14enfr_{d}" for d in HAT_DEVICES),
                           role="choice", exclude=HAT_REPORT),
    "help_fbnet": HELP_FBNET_SPLIT,
    "hat_wmt14ende": Split("hat_wmt14ende", HAT_REPORT),
}


def device_of(name: str) -> str:
    """The hardware of a table name: HAT's ``{task}_{device}`` gives ``device``, this
    project's ``{device}/{condition}`` gives ``device``; others (HELP's) are their own."""
    if "/" in name:
        return name.split("/", 1)[0]
    for device in HAT_DEVICES:
        if name.endswith("_" + device):
            return device
    return name


# --- HELP: FBNet -------------------------------------------------------------------------

FBNET_OPS = ("k3_e1", "k3_e1_g2", "k3_e3", "k3_e6", "k5_e1", "k5_e1_g2", "k5_e3", "k5_e6", "skip")
# An assumed CIFAR macro (HELP's files hold the op choices only): per stage (channels, layers,
# stride) of the FBNet macro, stem 3x3 conv to 16 channels at stride 1, input 32x32.
FBNET_STAGES = ((16, 1, 1), (24, 4, 1), (32, 4, 2), (64, 4, 2), (112, 4, 1), (184, 4, 2),
                (352, 1, 1))
_OP = re.compile(r"^k(\d)_e(\d)(?:_g(\d))?$")


MAX_HELP_FILE = 64 << 20  # bytes of a HELP .pt file (its 5,000 archs' ops: about 1 MB)


def _torch_load(path: Path) -> object:
    """A HELP ``.pt`` file through :func:`hwgptbench.io.load_torch`: a regular file of at most
    :data:`MAX_HELP_FILE` bytes, data only, each tensor no larger than its storage (a stride of
    0 makes a 1.5 kB file a view of 3.4 GB, which ``numpy.asarray`` would copy)."""
    from ..io import TorchFileError, load_torch

    if not path.exists():
        raise ExternalDataError(f"{path} not found: point at HELP's data/fbnet folder")
    try:
        return load_torch(path, "point at HELP's data/fbnet folder", max_bytes=MAX_HELP_FILE)
    except TorchFileError as err:
        raise ExternalDataError(f"{err} (a plain torch file of lists and numbers is read "
                                "with weights_only=True)") from None


def fbnet_costs(ops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(multiply-adds, parameters) of FBNet archs (rows of op indices into ``FBNET_OPS``)
    under the assumed macro ``FBNET_STAGES``: an op is a 1x1 (grouped) expansion, a k x k
    depthwise conv and a 1x1 (grouped) projection; ``skip`` is free where shapes match, else a
    strided 1x1 conv."""
    layers = [(c_out, s if i == 0 else 1) for c_out, n, s in FBNET_STAGES for i in range(n)]
    if ops.shape[1] != len(layers):
        raise ExternalDataError(f"FBNet archs have {len(layers)} layers, got {ops.shape[1]}")
    per_op = np.zeros((len(layers), len(FBNET_OPS), 2))
    c_in, size = 16, 32
    for layer, (c_out, stride) in enumerate(layers):
        out = size // stride
        for o, name in enumerate(FBNET_OPS):
            match = _OP.match(name)
            if match is None:  # skip
                cost = (0.0, 0.0) if (c_in == c_out and stride == 1) else \
                    (out * out * c_in * c_out, c_in * c_out)
            else:
                k, e, g = int(match[1]), int(match[2]), int(match[3] or 1)
                mid = e * c_in
                weights = c_in * mid / g + mid * k * k + mid * c_out / g
                cost = (size * size * c_in * mid / g + out * out * (mid * k * k + mid * c_out / g),
                        weights)
            per_op[layer, o] = cost
        c_in, size = c_out, out
    picked = per_op[np.arange(len(layers)), ops]  # (n, layers, 2)
    return picked[..., 0].sum(1), picked[..., 1].sum(1)


def fbnet_features(ops: np.ndarray) -> np.ndarray:
    """One indicator per (layer, op) (n, layers x ops), layer-major."""
    n, layers = ops.shape
    features = np.zeros((n, layers * len(FBNET_OPS)))
    features[np.arange(n)[:, None], np.arange(layers) * len(FBNET_OPS) + ops] = 1.0
    return features


def load_help_fbnet(folder: str | Path, devices: Sequence[str] | None = None) -> ExternalSet:
    """HELP's FBNet data: ``folder`` is its ``data/fbnet`` (or the repository root); every
    ``latency/*.pt`` is a device (or only ``devices``)."""
    folder = Path(folder)
    if (folder / "data" / "fbnet").is_dir():
        folder = folder / "data" / "fbnet"
    meta = _torch_load(folder / "metainfo.pt")
    if not isinstance(meta, dict) or "arch" not in meta:
        raise ExternalDataError(f"{folder / 'metainfo.pt'}: expected a dict with 'arch'")
    try:
        ops = np.array([[FBNET_OPS.index(op) for op in arch["arch_str"]] for arch in meta["arch"]])
    except (KeyError, TypeError, ValueError) as err:
        raise ExternalDataError(f"{folder / 'metainfo.pt'}: archs are not lists of FBNet ops "
                                f"({', '.join(FBNET_OPS)}): {err}") from err
    if ops.ndim != 2 or not len(ops):
        raise ExternalDataError(f"{folder / 'metainfo.pt'}: expected archs of one length each, "
                                f"got an array of shape {ops.shape}")
    names = sorted(p.stem for p in (folder / "latency").glob("*.pt")) if devices is None \
        else list(devices)
    if not names:
        raise ExternalDataError(f"no latency/*.pt under {folder}")
    features = fbnet_features(ops)
    flops, params = fbnet_costs(ops)
    keys = np.array(["-".join(map(str, row)) for row in ops])
    tables = {}
    for name in names:
        path = folder / "latency" / f"{name}.pt"
        try:
            values = np.asarray(_torch_load(path), dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ExternalDataError(f"{path}: not a list of latencies ({err})") from None
        if values.shape != (len(ops),):
            raise ExternalDataError(f"{path}: {values.shape} latencies for {len(ops)} archs")
        if not (np.isfinite(values) & (values > 0)).all():
            row = int(np.flatnonzero(~(np.isfinite(values) & (values > 0)))[0])
            raise ExternalDataError(f"{path}: latency {values[row]!r} of arch {row} is not a "
                                    "positive finite number")
        tables[name] = DeviceTable(name, keys, features, values, flops, params)
    layers = ops.shape[1]
    return ExternalSet("help_fbnet", tables,
                       [f"l{i}_{op}" for i in range(layers) for op in FBNET_OPS],
                       standardise=False, blocks=np.repeat(np.arange(layers), len(FBNET_OPS)),
                       groups=np.tile(np.arange(len(FBNET_OPS)), layers))


# --- HAT: encoder-decoder transformers ------------------------------------------------------

HAT_COLUMNS = ("encoder_embed_dim", "encoder_layer_num", "encoder_ffn_embed_dim_avg",
               "encoder_self_attention_heads_avg", "decoder_embed_dim", "decoder_layer_num",
               "decoder_ffn_embed_dim_avg", "decoder_self_attention_heads_avg",
               "decoder_ende_attention_heads_avg", "decoder_arbitrary_ende_attn_avg")
HAT_FEATURES = ("enc_ffn", "enc_attn", "enc_layers", "dec_ffn", "dec_attn", "dec_layers",
                "dec_proj", "dec_heads", "dec_cross_heads", "dec_embed", "enc_embed")
HAT_QKV = 512  # HAT's attention width (its qkv_dim)
HAT_TOKENS = 30  # sentence length of the flops proxy


def hat_features(table: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, flops, params) of HAT's CSV rows: per-layer cost terms (width products
    summed over layers), the weights of the layers (params) and the multiply-adds of a
    ``HAT_TOKENS``-token sentence through encoder and decoder (flops)."""
    c = {name: table[name].cast(pl.Float64).to_numpy() for name in HAT_COLUMNS}
    ee, el, ef = c["encoder_embed_dim"], c["encoder_layer_num"], c["encoder_ffn_embed_dim_avg"]
    de, dl, df = c["decoder_embed_dim"], c["decoder_layer_num"], c["decoder_ffn_embed_dim_avg"]
    features = np.column_stack([
        ee * el * ef, ee * ee * el, el, de * dl * df, de * de * dl, dl, de * dl * HAT_QKV,
        dl * c["decoder_self_attention_heads_avg"], dl * c["decoder_ende_attention_heads_avg"],
        de, ee])
    encoder = el * (4 * ee * HAT_QKV + 2 * ee * ef)
    decoder = dl * (8 * de * HAT_QKV + 2 * de * df)
    attention = HAT_TOKENS * HAT_TOKENS * HAT_QKV * (el + dl * (1 + c[
        "decoder_arbitrary_ende_attn_avg"]))
    return features, HAT_TOKENS * (encoder + decoder) + attention, encoder + decoder


HAT_LATENCIES = ("latency_mean_encoder", "latency_mean_decoder")
HAT_SIGNED = ("decoder_arbitrary_ende_attn_avg",)  # -1 stands for "all encoder layers"


def _hat_table(path: Path) -> pl.DataFrame:
    """One of HAT's CSVs, its columns checked: every column the loader reads present, a
    finite number in every row, positive but for :data:`HAT_SIGNED`; anything else (not a
    CSV, not UTF-8, rows of other lengths) is :class:`ExternalDataError` naming the file."""
    try:
        table = pl.read_csv(path)
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), "")
        raise ExternalDataError(f"{path}: not a CSV table of HAT's latency_dataset ({first}); "
                                "point at HAT's latency_dataset folder") from None
    missing = [c for c in (*HAT_COLUMNS, *HAT_LATENCIES) if c not in table.columns]
    if missing:
        raise ExternalDataError(f"{path}: missing columns {', '.join(missing)}")
    for column in (*HAT_COLUMNS, *HAT_LATENCIES):
        try:
            values = table[column].cast(pl.Float64).to_numpy()
        except pl.exceptions.PolarsError:
            raise ExternalDataError(f"{path}: column {column} is not numbers") from None
        good = np.isfinite(values) & ((values > 0) | (column in HAT_SIGNED))
        if not good.all():
            row = int(np.flatnonzero(~good)[0])
            raise ExternalDataError(f"{path}: column {column}, row {row + 1}: "
                                    f"{table[column][row]!r} is not a finite"
                                    f"{'' if column in HAT_SIGNED else ' positive'} number")
    return table


def load_hat(folder: str | Path) -> ExternalSet:
    """HAT's latency CSVs: every ``*_all.csv`` under ``folder`` (its ``latency_dataset``) is a
    table named ``{task}_{device}``."""
    paths = sorted(Path(folder).glob("*_all.csv"))
    if not paths:
        raise ExternalDataError(f"no *_all.csv under {folder}: point at HAT's latency_dataset")
    tables = {}
    for path in paths:
        table = _hat_table(path)
        features, flops, params = hat_features(table)
        keys = np.array([",".join(f"{v:g}" for v in row)
                         for row in table.select(HAT_COLUMNS).iter_rows()])
        values = (table["latency_mean_encoder"] + table["latency_mean_decoder"]).to_numpy()
        name = path.name.removesuffix("_all.csv")
        tables[name] = DeviceTable(name, keys, features, values.astype(np.float64), flops, params)
    return ExternalSet("hat", tables, list(HAT_FEATURES), standardise=True)


# --- this project's measurement tables ------------------------------------------------------

GPT_FEATURES = ("n_layer", "log_embed_dim", "log_heads", "log_mlp_width", "bias")


def gpt_features(arch_ids: Sequence[str]) -> np.ndarray:
    """Analytic features of GPT archs (``GPT_FEATURES``) from their ids (the evaluation adds
    log FLOPs and log parameters, as :func:`hwgptbench.adaptation.methods.gpt_linear` has)."""
    archs = [Arch.from_id(a) for a in arch_ids]
    return np.column_stack([
        [a.n_layer for a in archs],
        np.log([a.embed_dim for a in archs]), np.log([sum(a.n_head) for a in archs]),
        np.log([a.embed_dim * float(sum(a.mlp_ratio)) for a in archs]),
        [float(a.bias) for a in archs]]).astype(np.float64)


def load_gpt_tables(paths: Sequence[str | Path], metric: str = "latency_ms") -> ExternalSet:
    """Measurement tables of this project (rows with ``arch_id``, ``flops``, ``params``,
    ``device``, ``status`` and condition columns): one table per (device, condition), named
    ``{device}/b{batch}-t{seq}-{dtype}-{launch}``."""
    tables = {}
    for path in paths:
        rows = read_outside_parquet(path, "give measurement tables of this project").filter(
            (pl.col("status") == "ok") & (pl.col(metric) > 0))
        keys = ["device", "batch_size", "seq_len", "dtype", "launch"]
        for (device, batch, seq, dtype, launch), part in rows.group_by(*keys,
                                                                        maintain_order=True):
            part = part.unique("arch_id", keep="first", maintain_order=True)
            name = f"{device}/b{batch}-t{seq}-{dtype}-{launch}"
            flops, params = (part[c].cast(pl.Float64).to_numpy() for c in ("flops", "params"))
            tables[name] = DeviceTable(name, part["arch_id"].to_numpy(),
                                       gpt_features(part["arch_id"].to_list()),
                                       part[metric].to_numpy().astype(np.float64), flops, params)
    if not tables:
        raise ExternalDataError(f"no ok {metric} rows in {', '.join(map(str, paths))}")
    return ExternalSet("gpt", tables, list(GPT_FEATURES), standardise=True)


def gpt_split(data: ExternalSet) -> Split:
    """Every table of this project's devices held out in turn; the sources are the tables of
    the other devices (the part before ``/``)."""
    return Split("gpt_devices", targets=tuple(sorted(data.tables)))
