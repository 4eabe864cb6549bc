"""Mutated model archives (hypothesis, bounded): a `.pt2` whose bytes were flipped, cut,
duplicated or patched with hostile zip numbers is refused by the archive check with one error,
or passes it and loads as a model; never another exception, a signal, or a write."""

from __future__ import annotations

import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwgptbench.export import pt2
from hwgptbench.export.write import export_arch
from hwgptbench.model import SuperGPT
from hwgptbench.space import SearchSpace

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [32], "n_layer": [1], "n_head": [2], "mlp_ratio": [2], "bias": [True],
    "head_size": 16, "block_size": 16, "rotary_fraction": 0.5})
VOCAB = 64
HOSTILE_U32 = (0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 30)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real export's model.pt2."""
    torch.manual_seed(0)
    model = SuperGPT(SPACE, VOCAB).eval()
    folder = tmp_path_factory.mktemp("export") / "out"
    export_arch(model.extract(SPACE.sample(1, seed=0)[0]).float().eval(), folder, ["pt2"])
    return (folder / pt2.FILE).read_bytes()


def _central_fields(data: bytes) -> list[int]:
    """Offsets of the size and offset fields of every central-directory header."""
    fields, start = [], 0
    while (at := data.find(b"PK\x01\x02", start)) >= 0:
        fields += [at + 20, at + 24, at + 42]  # compressed size, size, local header offset
        start = at + 4
    return fields


@st.composite
def mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """One hostile variant of ``data``."""
    kind = draw(st.sampled_from(["flip", "cut", "repeat", "zip-number"]))
    if kind == "flip":
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if kind == "cut":
        return data[:draw(st.integers(0, len(data) - 1))]
    if kind == "repeat":
        at = draw(st.integers(0, len(data) - 64))
        return data[:at] + data[at:at + 64] * draw(st.integers(2, 50)) + data[at:]
    fields = _central_fields(data)
    at = draw(st.sampled_from(fields))
    return data[:at] + struct.pack("<I", draw(st.sampled_from(HOSTILE_U32))) + data[at + 4:]


CHECK = """
import sys
from pathlib import Path
from hwgptbench.errors import UserError
from hwgptbench.export import pt2
for name in sys.argv[1:]:
    try:
        pt2.check_archive(Path(name))
    except UserError:
        pass
# the peak of this program (VmHWM; ru_maxrss keeps the parent's across exec)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


def _variant(data: bytes, rng: random.Random) -> bytes:
    """A random hostile variant of ``data``, as :func:`mutations` draws them."""
    kind = rng.choice(["flip", "cut", "repeat", "zip-number"])
    if kind == "flip":
        at = rng.randrange(len(data))
        return data[:at] + bytes([data[at] ^ rng.randrange(1, 256)]) + data[at + 1:]
    if kind == "cut":
        return data[:rng.randrange(len(data))]
    if kind == "repeat":
        at = rng.randrange(len(data) - 64)
        return data[:at] + data[at:at + 64] * rng.randrange(2, 51) + data[at:]
    at = rng.choice(_central_fields(data))
    return data[:at] + struct.pack("<I", rng.choice(HOSTILE_U32)) + data[at + 4:]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_archives_are_refused_or_pass(archive: bytes, data: st.DataObject,
                                              tmp_path: Path) -> None:
    variant = data.draw(mutations(archive))
    path = tmp_path / "model.pt2"
    path.write_bytes(variant)
    try:
        pt2.check_archive(path)
    except pt2.Pt2ArchiveError as err:
        assert str(path) in str(err)


def test_mutated_archives_never_crash_or_blow_up_the_process(archive: bytes,
                                                             tmp_path: Path) -> None:
    """Such mutations checked in a child process: a crash shows as its exit status, and the
    bounds keep its peak memory near that of importing torch."""
    rng = random.Random(0)
    names = []
    for index in range(60):
        path = tmp_path / f"m{index}.pt2"
        path.write_bytes(_variant(archive, rng) if index else archive)
        names.append(str(path))
    done = subprocess.run([sys.executable, "-c", CHECK, *names], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    peak_mb = int(done.stdout.split()[-1]) / 1024
    assert peak_mb < 1024, f"peak memory {peak_mb:.0f} MB checking {len(names)} archives"
