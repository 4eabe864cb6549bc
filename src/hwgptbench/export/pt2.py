"""``model.pt2``: the fixed GPT as a ``torch.export`` program, token ids (batch, seq) to logits,
with a dynamic batch and a dynamic sequence length up to the block size; fp32, CPU.

A ``.pt2`` archive is read as data (docs/security.md). ``torch.export.load`` would run code
from several places of a crafted archive: weights or constants marked ``use_pickle`` (unpickled
with ``weights_only=False``), pickled custom objects, the pickled sample inputs (which fall
back to ``weights_only=False``), compiled AOTInductor libraries, guard code (Python source,
compiled when the module is built), symbolic shapes (parsed by ``sympy.sympify``, an
``eval``) and graph nodes naming any callable reachable from ``torch``. So
:func:`check_archive` reads the archive first and allows only what :func:`save` writes: raw
weight and constant bytes, JSON configs, and a program whose nodes call ATen tensor operators
from :data:`OPERATORS`, with shape expressions of integers and symbols only and no guard code.
Before any entry is read, the archive's size and layout are bounded (:data:`MAX_FILE`,
:func:`_directory`, :func:`_check_layout`): torch reads every entry the central directory lists
(entries that share their bytes multiply them), and makes an empty weight a tensor of zeros of
the sizes its config claims (:func:`_extent`). The checked bytes themselves are then loaded, so
the file cannot change in between.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch._export.serde.schema import ScalarType
from torch._export.serde.serialize import deserialize_scalar_type
from torch.export import Dim, ExportedProgram

from ..errors import UserError
from ..io import first_line
from ..model import GPT
from .check import Logits

FILE = "model.pt2"
FIX = "export the arch again with `hwgptbench export` (it writes archives that pass this check)"

# the entries of an archive that save() writes, relative to its root folder; the sample inputs
# (a pickle) are written empty
_ENTRIES = re.compile(r"archive_format|archive_version|byteorder|\.data/version|"
                      r"\.data/serialization_id|models/model\.json|data/sample_inputs/model\.pt|"
                      r"data/weights/model_weights_config\.json|data/weights/weight_\d+|"
                      r"data/constants/model_constants_config\.json|data/constants/tensor_\d+")
_PAYLOADS = {"data/weights/model_weights_config.json": ("data/weights/", r"weight_\d+"),
             "data/constants/model_constants_config.json": ("data/constants/", r"tensor_\d+")}
# ATen operators a program may call: those of the GPT families' forward passes, and other
# tensor operators without side effects (no file, process or global state: aten's from_file
# and save, for instance, are left out)
OPERATORS = frozenset({
    "add", "addmm", "alias", "bmm", "cat", "clone", "contiguous", "detach", "div", "embedding",
    "expand", "gelu", "layer_norm", "linear", "matmul", "mean", "mm", "mul", "native_layer_norm",
    "neg", "permute", "pow", "relu", "reshape", "rms_norm", "rsqrt", "scaled_dot_product_attention",
    "select", "sigmoid", "silu", "slice", "softmax", "split", "split_with_sizes", "squeeze",
    "sub", "sum", "sym_size", "t", "tanh", "transpose", "unsqueeze", "view", "_to_copy",
    "_softmax", "_unsafe_view",
})
_TARGET = re.compile(r"torch\.ops\.aten\.(\w+)\.(\w+)")
# a sympy expression of integers and shape symbols, as torch.export writes them:
# Mul(Integer(16), Symbol('s75', positive=True, integer=True))
_SYMPY_FUNCTIONS = ("Symbol", "Integer", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Mod",
                    "PythonMod", "FloorDiv", "CleanDiv", "IntTrueDiv", "CeilToInt", "FloorToInt",
                    "TruncToInt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not")
_EXPRESSION = re.compile(
    r"(?:\s+|[(),]|-?\d+|'[a-z]+\d+'|(?:" + "|".join(_SYMPY_FUNCTIONS) + r")(?=\()|"
    r"(?:positive|negative|nonnegative|nonpositive|integer|real|finite)=(?:True|False))*")
_MAX_EXPRESSION = 2000  # characters: sympy parses each one
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")  # a module path, no dunders
_NAME_KEYS = ("fqn", "parameter_name", "buffer_name", "tensor_constant_name")

# Bounds of an archive (docs/security.md, "Bounds"), checked before any entry is read. The
# largest arch of the published spaces (l: 36 layers of 1280) exports to about 3.1 GB; a
# 36-layer export holds 446 entries, names of at most 48 bytes and a 2.7 MB program.
MAX_FILE = 16 * 2**30
MAX_ENTRIES = 4096
MAX_DIRECTORY = MAX_ENTRIES * 256  # bytes of central directory: 46, a name, extra fields each
MAX_JSON = 32 * 2**20  # bytes of one JSON entry: json.loads takes several times that
# the records of a zip archive: the end of central directory record (signature, disk, disk of
# the directory, entries on this disk, entries, directory size, directory offset, comment
# length); the zip64 locator (signature, disk of the record, record offset, disks) and record
# (signature, record size, two versions, two disks, entries on this disk, entries, directory
# size, directory offset); a local file header, whose last fields are the lengths of the name
# and the extra field that precede the entry's bytes
_END = struct.Struct("<4s4H2LH")
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_PLAIN_FLAGS = 0x808  # an entry's flags: names in UTF-8, sizes after the bytes (torch writes)


class Pt2ArchiveError(UserError, ValueError):
    """A ``.pt2`` file that is not a plain program of ours, or cannot be read."""


def trace(model: GPT) -> ExportedProgram:
    """The ``torch.export`` program of model (CPU, fp32): ids (batch, seq <= block_size) to
    logits."""
    block_size = model.config.block_size
    example = torch.zeros((2, min(8, block_size)), dtype=torch.long)
    dims = {0: Dim("batch", min=1), 1: Dim("seq", min=1, max=block_size)}
    with torch.no_grad():
        return torch.export.export(model.eval(), (example,), dynamic_shapes=(dims,))


def save(program: ExportedProgram, folder: Path) -> list[Path]:
    """Write ``model.pt2`` (weights as raw bytes, no pickled sample inputs: the archive passes
    :func:`check_archive`); the files written."""
    path = folder / FILE
    example_inputs = program.example_inputs
    program.example_inputs = None  # torch.save'd into the archive otherwise: a pickle
    try:
        from ..outputs import atomic_path

        with atomic_path(path) as tmp:
            torch.export.save(program, tmp)
    finally:
        program.example_inputs = example_inputs
    check_archive(path)
    return [path]


def _refuse(path: Path, what: str) -> Pt2ArchiveError:
    return Pt2ArchiveError(f"{path} refused unread: {what}; a model.pt2 is read as data only "
                           f"(docs/security.md): {FIX}")


def _json(archive: zipfile.ZipFile, name: str, path: Path) -> Any:
    size = archive.getinfo(name).file_size
    if size > MAX_JSON:
        raise _refuse(path, f"{name} is {size} bytes of JSON, over the {MAX_JSON >> 20} MiB "
                            "an export writes")
    try:
        text = archive.read(name)
    except (zipfile.BadZipFile, UnicodeDecodeError) as err:  # a CRC or a local header that
        raise _refuse(path, f"{name} cannot be read ({err})") from None  # disagrees
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise _refuse(path, f"{name} is not JSON ({type(err).__name__})") from None


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) of the mappings in a JSON document, without recursion."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                yield key, value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)


def _check_program(program: Any, name: str, path: Path) -> None:
    """Refuse guard code, a node calling anything but an allowed ATen operator, a shape
    expression that is not integers and symbols, or a module path that is not a name."""
    if not isinstance(program, dict):
        raise _refuse(path, f"{name} is not a program")
    if program.get("guards_code"):
        raise _refuse(path, f"{name} holds guard code (Python source)")
    for key, value in _walk(program):
        if key == "target" and isinstance(value, str):
            match = _TARGET.fullmatch(value)
            if match is None or match.group(1) not in OPERATORS:
                raise _refuse(path, f"{name} calls {value[:80]!r}, not an allowed ATen "
                                    "tensor operator")
        elif key == "target":
            raise _refuse(path, f"{name} has a node target of type {type(value).__name__}")
        elif key == "expr_str" and (not isinstance(value, str) or len(value) > _MAX_EXPRESSION
                                    or not _EXPRESSION.fullmatch(value)):
            raise _refuse(path, f"{name} holds the shape expression {str(value)[:80]!r}, not "
                                "one of integers and symbols")
        elif key in _NAME_KEYS and value not in ("", None) and (
                not isinstance(value, str) or not _NAME.fullmatch(value) or "__" in value):
            raise _refuse(path, f"{name} names the module path {str(value)[:80]!r}")


def _extent(tensor: Any) -> int | None:
    """The bytes of its entry that a payload's ``tensor_meta`` addresses (as torch views them:
    dtype, sizes, strides, storage offset); None if it is not integers of a known dtype."""
    try:
        itemsize = deserialize_scalar_type(ScalarType(tensor["dtype"])).itemsize
        sizes = [size["as_int"] for size in tensor["sizes"]]
        strides = [stride["as_int"] for stride in tensor["strides"]]
        offset = tensor["storage_offset"]["as_int"]
    except (KeyError, TypeError, ValueError):
        return None
    numbers = [*sizes, *strides, offset]
    if len(sizes) != len(strides) or not all(type(n) is int and n >= 0 for n in numbers):
        return None
    if 0 in sizes:
        return 0
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides, strict=True))
    return (last + 1) * itemsize


def _check_payloads(archive: zipfile.ZipFile, root: str, relative: set[str], path: Path) -> None:
    """Every weight and constant is raw bytes (``use_pickle`` false) in an entry of its own
    kind, under a module path, and lies within that entry (torch makes an empty entry a tensor
    of zeros of the sizes it claims)."""
    for config_name, (folder, pattern) in _PAYLOADS.items():
        if config_name not in relative:
            raise _refuse(path, f"it has no {config_name}")
        config = _json(archive, root + config_name, path)
        entries = config.get("config") if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            raise _refuse(path, f"{config_name} is not a payload config")
        for fqn, meta in entries.items():
            if not isinstance(fqn, str) or not _NAME.fullmatch(fqn) or "__" in fqn:
                raise _refuse(path, f"{config_name} names the module path {str(fqn)[:80]!r}")
            if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
                raise _refuse(path, f"{config_name}: {fqn} is stored as a pickle (use_pickle), "
                                    "which torch would unpickle with weights_only=False")
            file = meta.get("path_name")
            if (not isinstance(file, str) or not re.fullmatch(pattern, file)
                    or folder + file not in relative):
                raise _refuse(path, f"{config_name}: {fqn} is stored in {str(file)[:80]!r}, "
                                    f"not a raw {folder} entry of the archive")
            extent = _extent(meta.get("tensor_meta"))
            stored = archive.getinfo(root + folder + file).file_size
            if extent is None:
                raise _refuse(path, f"{config_name}: {fqn} has no tensor_meta of integer "
                                    "sizes, strides and offset and a known dtype")
            if extent > stored:
                raise _refuse(path, f"{config_name}: {fqn} claims {extent} bytes of "
                                    f"{folder + file}, which holds {stored}")


def _read(path: Path) -> bytes:
    """The bytes of the file at path, refused over :data:`MAX_FILE` (bytes appended while it is
    read are left out)."""
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > MAX_FILE:
                raise _refuse(path, f"it is {size} bytes, over the {MAX_FILE >> 30} GiB of "
                                    "the largest archive read")
            return file.read(size)
    except IsADirectoryError:
        raise Pt2ArchiveError(f"{path} is a folder, not a model.pt2 file: {FIX}") from None


def _directory(data: bytes, path: Path) -> tuple[int, int]:
    """The entry count and offset of the central directory that the end record closing data
    declares (its zip64 record's, where a locator precedes it), refused unless the directory
    is within the bounds and ends where the end records begin (as torch reads it; zipfile
    would also accept data before the archive, and so see other offsets)."""
    end = len(data) - _END.size
    if end < 0 or not data.startswith(b"PK\x05\x06", end) or data[-2:] != b"\0\0":
        raise Pt2ArchiveError(f"{path} is not a pt2 archive (it does not end with a zip end "
                              f"record): {FIX}")
    *_, entries, size, offset, _ = _END.unpack_from(data, end)
    locator = end - _END64_LOCATOR.size
    if locator >= 0 and data.startswith(b"PK\x06\x07", locator):
        end = locator - _END64.size
        if (end < 0 or _END64_LOCATOR.unpack_from(data, locator)[2] != end
                or not data.startswith(b"PK\x06\x06", end)):
            raise _refuse(path, "its zip64 end record is not where its locator says")
        entries, size, offset = _END64.unpack_from(data, end)[7:]
    if entries > MAX_ENTRIES or size > MAX_DIRECTORY:
        raise _refuse(path, f"its central directory declares {entries} entries in {size} "
                            f"bytes, over the {MAX_ENTRIES} entries in {MAX_DIRECTORY} bytes "
                            "of the largest archive read")
    if offset + size != end:
        raise _refuse(path, "its central directory does not end where its end record begins")
    return entries, offset


def _check_layout(data: bytes, infos: list[zipfile.ZipInfo], directory: tuple[int, int],
                  path: Path) -> None:
    """Refuse, before any entry is read, a central directory that lists other entries than its
    end record counts, a compressed or encrypted entry, one whose declared sizes disagree, or
    one whose local header and bytes overlap the entry before it or run past the entries' end
    (the central directory): so the entries' sizes add up to at most the file's."""
    entries, entries_end = directory
    if len(infos) != entries:
        raise _refuse(path, f"its central directory lists {len(infos)} entries, its end record "
                            f"{entries}")
    previous_end = 0
    for info in sorted(infos, key=lambda info: info.header_offset):
        name, start = info.filename, info.header_offset
        if info.compress_type != zipfile.ZIP_STORED:
            raise _refuse(path, f"its entry {name!r} is compressed")
        if info.flag_bits & ~_PLAIN_FLAGS:
            raise _refuse(path, f"its entry {name!r} has the flags {info.flag_bits:#x} "
                                "(encrypted or patched data)")
        if info.file_size != info.compress_size:
            raise _refuse(path, f"its entry {name!r} declares {info.file_size} bytes but "
                                f"stores {info.compress_size}")
        if start < previous_end:
            raise _refuse(path, f"its entry {name!r} overlaps the entry before it")
        previous_end = start + _LOCAL.size
        if previous_end <= entries_end:
            *_, name_length, extra_length = _LOCAL.unpack_from(data, start)
            previous_end += name_length + extra_length + info.compress_size
        if previous_end > entries_end:
            raise _refuse(path, f"its entry {name!r} ({info.compress_size} bytes) runs past "
                                "the end of the entries (the central directory)")


def check_archive(path: str | Path) -> bytes:
    """The bytes of the ``.pt2`` file at path, checked to hold nothing but what :func:`save`
    writes (module doc); :class:`Pt2ArchiveError` names the file, what it holds and the fix."""
    path = Path(path)
    data = _read(path)
    directory = _directory(data, path)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as err:
        raise Pt2ArchiveError(f"{path} is not a pt2 archive ({err}): {FIX}") from None
    _check_layout(data, infos, directory, path)
    names = [info.filename for info in infos]
    roots = {name.split("/", 1)[0] for name in names}
    if not names or len(roots) != 1 or len(set(names)) != len(names):
        raise _refuse(path, "its entries are not one archive folder of distinct files")
    root = roots.pop() + "/"
    relative = {name[len(root):] for name in names}
    for name in names:
        if not name.startswith(root) or not _ENTRIES.fullmatch(name[len(root):]):
            raise _refuse(path, f"it holds {name!r}, not an entry of a plain torch.export "
                                "archive (pickled objects, compiled code and extra files are "
                                "refused)")
    sample_inputs = root + "data/sample_inputs/model.pt"
    if sample_inputs in names and archive.getinfo(sample_inputs).file_size:
        raise _refuse(path, "it holds pickled sample inputs (data/sample_inputs/model.pt)")
    if "models/model.json" not in relative:
        raise _refuse(path, "it holds no program (models/model.json)")
    _check_payloads(archive, root, relative, path)
    _check_program(_json(archive, root + "models/model.json", path), "models/model.json", path)
    return data


def load(folder: Path) -> Logits:
    """ids -> logits of the ``model.pt2`` in folder, once :func:`check_archive` has passed it
    (the checked bytes are what is loaded)."""
    path = folder / FILE
    data = check_archive(path)
    try:
        module = torch.export.load(io.BytesIO(data)).module()
    except Exception as err:  # a plain archive that torch cannot read: bad input all the same
        raise Pt2ArchiveError(f"{path} cannot be read ({first_line(err)}): {FIX}") from err

    @torch.no_grad()
    def run(ids: Tensor) -> Tensor:
        return module(ids)

    return run
