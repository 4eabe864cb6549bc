"""``model.pt2`` archives are bounded before any entry is read (docs/security.md, "Bounds"):
declared sizes that disagree or run past the file, overlapping entries, too many entries, too
large a central directory, JSON or file, and a directory torch and zipfile would read at
different offsets are refused, quickly and in little memory."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hwgptbench.export import pt2

ROOT = "model/"
# the entries of the smallest archive that passes the check: an empty program and payloads
PLAIN = {"data/weights/weight_0": b"\0" * 64, "models/model.json": b"{}",
         "data/weights/model_weights_config.json": b'{"config": {}}',
         "data/constants/model_constants_config.json": b'{"config": {}}'}
END = struct.Struct("<4s4H2LH")  # end of central directory record
CENTRAL = struct.Struct("<4s4B4HL2L5H2L")  # central directory record, before its name
FLAGS, CRC, COMPRESS_SIZE, FILE_SIZE, NAME_LENGTH, HEADER_OFFSET = 5, 9, 10, 11, 12, 18
END64 = struct.Struct("<4sQ2H2L4Q")
END64_LOCATOR = struct.Struct("<4sLQL")


def archive(entries: dict[str, bytes] = PLAIN) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as writer:
        for name, data in entries.items():
            writer.writestr(ROOT + name, data)
    return buffer.getvalue()


def split(data: bytes) -> tuple[bytes, list[bytes]]:
    """The entries' bytes of an archive, and its central directory's records."""
    *_, count, _, offset, _ = END.unpack_from(data, len(data) - END.size)
    records, at = [], offset
    for _ in range(count):
        fields = CENTRAL.unpack_from(data, at)
        length = CENTRAL.size + sum(fields[NAME_LENGTH:NAME_LENGTH + 3])
        records.append(data[at:at + length])
        at += length
    return data[:offset], records


def join(entries: bytes, records: list[bytes], count: int | None = None) -> bytes:
    """The archive of entries and records (count: what the end record declares)."""
    directory = b"".join(records)
    count = len(records) if count is None else count
    return entries + directory + END.pack(b"PK\x05\x06", 0, 0, count, count, len(directory),
                                          len(entries), 0)


def record(base: bytes, name: str | None = None, comment: bytes = b"", **fields: int) -> bytes:
    """base, a central directory record, renamed, with comment instead of its extra field and
    comment, and with fields (by index name) changed."""
    values = list(CENTRAL.unpack_from(base))
    old_name = base[CENTRAL.size:CENTRAL.size + values[NAME_LENGTH]]
    new_name = old_name if name is None else (ROOT + name).encode()
    values[NAME_LENGTH:NAME_LENGTH + 3] = len(new_name), 0, len(comment)
    for field, value in fields.items():
        values[globals()[field]] = value
    return CENTRAL.pack(*values) + new_name + comment


def with_weight(**fields: int) -> bytes:
    """The plain archive with the central directory's fields of its weight changed."""
    entries, records = split(archive())
    return join(entries, [record(records[0], None, b"", **fields), *records[1:]])


def with_program(**fields: int) -> bytes:
    """The plain archive with the central directory's fields of its program changed."""
    entries, records = split(archive())
    return join(entries, [record(r, None, b"", **fields) if r.endswith(b"/model.json") else r
                          for r in records])


def overlapping(count: int) -> bytes:
    """count weights in the central directory, all at the one weight's local header."""
    entries, records = split(archive())
    weights = [record(records[0], f"data/weights/weight_{i}") for i in range(count)]
    return join(entries, [*weights, *records[1:]])


def nested() -> bytes:
    """A second weight whose local header lies inside the first one's bytes."""
    entries, records = split(archive({**PLAIN, "data/weights/weight_0": b"\0" * 4096}))
    inner = record(records[0], "data/weights/weight_1", HEADER_OFFSET=100, FILE_SIZE=64,
                   COMPRESS_SIZE=64)
    return join(entries, [*records, inner])


def with_zip64(data: bytes, locator_offset: int | None = None,
               directory_size: int | None = None) -> bytes:
    """data with a zip64 end record and its locator before its end record."""
    entries, records = split(data)
    directory = b"".join(records)
    at = len(entries) + len(directory)
    record64 = END64.pack(b"PK\x06\x06", END64.size - 12, 45, 45, 0, 0, len(records),
                          len(records), len(directory) if directory_size is None
                          else directory_size, len(entries))
    locator = END64_LOCATOR.pack(b"PK\x06\x07", 0, at if locator_offset is None
                                 else locator_offset, 1)
    end = END.pack(b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return entries + directory + record64 + locator + end


def big_directory() -> bytes:
    """20 entries whose records' comments make a central directory over the bound."""
    entries, records = split(archive())
    return join(entries, [record(records[0], f"data/weights/weight_{i}", b"c" * 0xFFFF)
                          for i in range(20)])


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "zero-byte-weight-claims-1.6-GB": (lambda: with_weight(FILE_SIZE=1_600_000_000,
                                                           COMPRESS_SIZE=1_600_000_000),
                                       "1600000000 bytes) runs past the end"),
    "sizes-disagree": (lambda: with_weight(FILE_SIZE=1_600_000_000), "declares 1600000000"),
    "data-past-the-end-of-file": (lambda: with_weight(FILE_SIZE=10_000, COMPRESS_SIZE=10_000),
                                  "runs past the end"),
    "local-header-past-the-end": (lambda: with_weight(HEADER_OFFSET=10**6),
                                  "runs past the end"),
    "2000-entries-on-one-local-header": (lambda: overlapping(2000), "overlaps"),
    "entry-inside-another": (nested, "overlaps"),
    "too-many-entries": (lambda: overlapping(pt2.MAX_ENTRIES - 2),  # and 3 other entries
                         f"declares {pt2.MAX_ENTRIES + 1} entries"),
    "too-large-a-directory": (big_directory, "over the 4096 entries in 1048576 bytes"),
    "program-fails-its-crc": (lambda: with_program(CRC=0), "cannot be read (Bad CRC-32"),
    "encrypted-program": (lambda: with_program(FLAGS=1), "the flags 0x1"),
    "end-record-miscounts": (lambda: join(*split(archive()), count=3), "lists 4 entries"),
    "data-before-the-archive": (lambda: b"MZ" + archive(), "does not end where"),
    "comment-after-the-end-record": (lambda: archive()[:-2] + b"\x01\0!",
                                     "does not end with a zip end record"),
    "zip64-locator-elsewhere": (lambda: with_zip64(archive(), locator_offset=0),
                                "not where its locator says"),
    "zip64-directory-too-large": (lambda: with_zip64(archive(), directory_size=2**40),
                                  "in 1099511627776 bytes"),
}


def refusal(path: Path) -> str:
    with pytest.raises(pt2.Pt2ArchiveError) as refused:
        pt2.check_archive(path)
    return str(refused.value)


def test_the_smallest_plain_archive_passes(tmp_path: Path) -> None:
    """The hostile archives below are edits of one that passes, so each refusal is its edit's."""
    for name, data in (("plain", archive()), ("zip64", with_zip64(archive()))):
        path = tmp_path / f"{name}.pt2"
        path.write_bytes(data)
        assert pt2.check_archive(path) == data


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_layout_is_refused_quickly_in_little_memory(tmp_path: Path,
                                                               case: str) -> None:
    build, why = HOSTILE[case]
    path = tmp_path / pt2.FILE
    path.write_bytes(build())
    tracemalloc.start()
    start = time.perf_counter()
    try:
        message = refusal(path)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert why in message and str(path) in message and "hwgptbench export" in message
    assert seconds < 2 and peak < 3 * path.stat().st_size + 2**20


def test_a_program_over_the_json_bound_is_refused_unparsed(tmp_path: Path) -> None:
    path = tmp_path / pt2.FILE
    path.write_bytes(archive({**PLAIN, "models/model.json": b" " * pt2.MAX_JSON + b"{}"}))
    assert f"models/model.json is {pt2.MAX_JSON + 2} bytes of JSON" in refusal(path)


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / pt2.FILE
    with path.open("wb") as file:  # sparse: no disk taken
        file.truncate(pt2.MAX_FILE + 1)
    start = time.perf_counter()
    assert f"it is {pt2.MAX_FILE + 1} bytes, over the 16 GiB" in refusal(path)
    assert time.perf_counter() - start < 1


# -- edits of a real export, as torch.export.load reads it ------------------------------------

CLAIM = 1_600_000_000  # bytes a hostile weight claims (torch 2.13 allocates them)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of a linear layer (256 x 256: a 256 KiB weight) exported by pt2.save."""
    folder = tmp_path_factory.mktemp("linear")
    layer = torch.nn.Linear(256, 256).eval()
    pt2.save(torch.export.export(layer, (torch.zeros(1, 256),)), folder)
    return folder


def rewritten(data: bytes, edit: Callable[[dict[str, bytes]], None]) -> bytes:
    """The archive data with edit applied to its entries (names relative to its root)."""
    with zipfile.ZipFile(io.BytesIO(data)) as reader:
        entries = {name.removeprefix(ROOT): reader.read(name) for name in reader.namelist()}
    edit(entries)
    return archive(entries)


def _weights(entries: dict[str, bytes]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(entries[WEIGHTS])["config"]
    return config


def _claimed_by_its_sizes(entries: dict[str, bytes]) -> None:
    """weight_0 emptied, its tensor_meta claiming CLAIM bytes of float32."""
    config = _weights(entries)
    meta = next(meta for meta in config.values() if meta["path_name"] == "weight_0")
    meta["tensor_meta"]["sizes"] = [{"as_int": CLAIM // 4}]
    meta["tensor_meta"]["strides"] = [{"as_int": 1}]
    entries["data/weights/weight_0"] = b""
    entries[WEIGHTS] = json.dumps({"config": config}).encode()


def _listed_2000_times(entries: dict[str, bytes]) -> None:
    """2000 weights, weight_0 ... weight_1999, each a copy of the one in weight_0."""
    config = _weights(entries)
    meta = next(meta for meta in config.values() if meta["path_name"] == "weight_0")
    config.update({f"copy{i}": {**meta, "path_name": f"weight_{i}"} for i in range(2000)})
    entries[WEIGHTS] = json.dumps({"config": config}).encode()


def on_one_local_header(data: bytes) -> bytes:
    """data, its entries weight_1 ... weight_1999 dropped and listed in its central directory
    at weight_0's local header instead."""
    entries, records = split(rewritten(data, _listed_2000_times))
    weight = next(r for r in records if r[CENTRAL.size:].endswith(b"/weight_0"))
    copies = [record(weight, f"data/weights/weight_{i}") for i in range(2000)]
    return join(entries, [*copies, *(r for r in records if b"/weight_" not in r)])


def claimed_by_the_directory(data: bytes) -> bytes:
    """data, its central directory claiming CLAIM bytes of weight_0."""
    entries, records = split(data)
    return join(entries, [record(r, FILE_SIZE=CLAIM, COMPRESS_SIZE=CLAIM)
                          if r.endswith(b"/weight_0") else r for r in records])


WEIGHTS = "data/weights/model_weights_config.json"
# in the order of what torch.export.load takes for them: miniz refuses the first one
HOSTILE_EXPORTS: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "central-directory-claim": (claimed_by_the_directory, f"({CLAIM} bytes) runs past"),
    "2000-weights-on-one-local-header": (on_one_local_header, "overlaps"),
    "tensor-meta-claim": (lambda data: rewritten(data, _claimed_by_its_sizes),
                          f"claims {CLAIM} bytes of data/weights/weight_0, which holds 0"),
}


def test_the_export_and_its_rewrite_pass_and_load(exported: Path, tmp_path: Path) -> None:
    """The edits below start from archives that pass, so each refusal is its edit's."""
    data = (exported / pt2.FILE).read_bytes()
    (tmp_path / pt2.FILE).write_bytes(rewritten(data, lambda entries: None))
    for folder in (exported, tmp_path):
        assert pt2.load(folder)(torch.zeros(1, 256)).shape == (1, 256)


@pytest.mark.parametrize("case", list(HOSTILE_EXPORTS))
def test_a_hostile_export_is_refused_before_torch_reads_it(exported: Path, tmp_path: Path,
                                                           case: str) -> None:
    edit, why = HOSTILE_EXPORTS[case]
    (tmp_path / pt2.FILE).write_bytes(edit((exported / pt2.FILE).read_bytes()))
    with pytest.raises(pt2.Pt2ArchiveError) as refused:
        pt2.load(tmp_path)
    assert why in str(refused.value) and "refused unread" in str(refused.value)


@pytest.mark.slow
def test_the_hostile_exports_take_little_memory_and_gigabytes_without_the_check(
        exported: Path, tmp_path: Path) -> None:
    """In a fresh process (so that no earlier peak hides it): pt2.load refuses each hostile
    export growing the process by little; torch.export.load of the same files (in increasing
    order of their peaks) takes what they claim (torch 2.13: the threat is real)."""
    folders = []
    for case, (edit, _) in HOSTILE_EXPORTS.items():
        (tmp_path / case).mkdir()
        (tmp_path / case / pt2.FILE).write_bytes(edit((exported / pt2.FILE).read_bytes()))
        folders.append(str(tmp_path / case))
    script = textwrap.dedent(f"""
        import contextlib, json, resource, sys, torch
        from pathlib import Path
        from hwgptbench.export import pt2
        def peak():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        pt2.load(Path({str(exported)!r}))
        grown = []
        for loader in (pt2.load, lambda folder: torch.export.load(folder / pt2.FILE)):
            grown.append([])
            for folder in map(Path, sys.argv[1:]):
                before = peak()
                with contextlib.suppress(Exception):
                    loader(folder)
                grown[-1].append(peak() - before)
        print(json.dumps(grown))
    """)
    done = subprocess.run([sys.executable, "-c", script, *folders], capture_output=True,
                          text=True, timeout=300, check=True)
    checked, unchecked = json.loads(done.stdout.splitlines()[-1])
    _, overlapping, claimed = unchecked
    assert max(checked) < 32 * 2**20 and overlapping > 2000 * 2**18 // 2 and claimed > CLAIM // 2, (
        checked, unchecked)
