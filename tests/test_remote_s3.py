"""The project's artifacts on an S3-compatible DVC remote, against a local S3 server (moto).

The remote is configured with plain `dvc remote` commands and credentials from the
environment, as docs/remotes.md tells a user to; the artifact is the data stage's real output.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.client import BaseClient

from conftest import CREDENTIALS, make_project, run

pytestmark = pytest.mark.e2e  # spawns snakemake or dvc

BUCKET = "hwgptbench-artifacts"
PREFIX = "dvc"
REMOTE = "s3"
DATA_OUT = Path("results") / "data" / "shakespeare"


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def object_key(digest: str) -> str:
    """Key of a DVC 3 object in the bucket."""
    return f"{PREFIX}/files/md5/{digest[:2]}/{digest[2:]}"


@pytest.fixture(scope="module")
def bucket(s3_endpoint: str) -> BaseClient:
    """The S3 client, with the project's bucket created."""
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture(scope="module")
def pushed(s3_endpoint: str, bucket: BaseClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project with an S3 default remote, the data stage run and pushed, all committed."""
    repo = make_project(tmp_path_factory.mktemp("s3"))
    run(["dvc", "remote", "add", "-d", REMOTE, f"s3://{BUCKET}/{PREFIX}"], repo)
    run(["dvc", "remote", "modify", REMOTE, "endpointurl", s3_endpoint], repo)
    run(["dvc", "remote", "modify", REMOTE, "verify", "true"], repo)
    run(["dvc", "repro", "data"], repo)
    run(["dvc", "push", "data"], repo)
    run(["git", "add", ".dvc/config", "dvc.lock"], repo)
    run(["git", "commit", "-qm", "data on the S3 remote"], repo)
    return repo


def clone(pushed: Path, dest: Path) -> Path:
    run(["git", "clone", "-q", str(pushed), str(dest)], pushed.parent)
    return dest


def lock_out(repo: Path) -> dict:
    """dvc.lock's entry for the data stage's output."""
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"]["data"]["outs"][0]


def test_committed_remote_verifies_and_holds_no_secret(pushed: Path, tmp_path: Path) -> None:
    repo = clone(pushed, tmp_path / "clone")
    assert run(["dvc", "config", "--project", "core.remote"], repo).stdout.strip() == REMOTE
    assert run(["dvc", "config", "--project", f"remote.{REMOTE}.verify"], repo
               ).stdout.strip() == "true"
    committed = (repo / ".dvc" / "config").read_text()
    assert f"s3://{BUCKET}/{PREFIX}" in committed
    assert not any(value in committed for value in CREDENTIALS.values())
    assert "access_key" not in committed and "secret" not in committed


def test_pull_from_s3_matches_dvc_lock(pushed: Path, bucket: BaseClient, tmp_path: Path
                                       ) -> None:
    repo = clone(pushed, tmp_path / "clone")
    run(["dvc", "pull", "data"], repo)
    out = lock_out(repo)
    assert out["path"] == DATA_OUT.as_posix()
    tree_digest = out["md5"].removesuffix(".dir")
    # the .dir manifest: its bytes hash to what dvc.lock records, and it lists every file
    manifest = repo / ".dvc" / "cache" / "files" / "md5" / tree_digest[:2] / (
        tree_digest[2:] + ".dir")
    assert md5(manifest) == tree_digest
    entries = {e["relpath"]: e["md5"] for e in json.loads(manifest.read_text())}
    stored = {o["Key"] for o in bucket.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]}
    assert stored == {object_key(d) for d in entries.values()} | {object_key(out["md5"])}
    pulled = repo / DATA_OUT
    files = {p.relative_to(pulled).as_posix() for p in pulled.rglob("*") if p.is_file()}
    assert files == set(entries) and len(files) == out["nfiles"]
    assert {"tokenizer.json", "train_000.bin", "val_000.bin", "manifest.json"} <= files
    assert sum((pulled / name).stat().st_size for name in files) == out["size"]
    for name, digest in entries.items():
        assert md5(pulled / name) == digest, name
        assert (pulled / name).read_bytes() == (pushed / DATA_OUT / name).read_bytes(), name
    assert json.loads(run(["dvc", "status", "--json", "data"], repo).stdout or "{}") == {}


def test_corrupted_object_in_bucket_fails_the_pull(pushed: Path, bucket: BaseClient,
                                                   tmp_path: Path) -> None:
    shard = "train_000.bin"
    digest = md5(pushed / DATA_OUT / shard)
    key, tree_key = object_key(digest), object_key(lock_out(pushed)["md5"])
    stored = {k: bucket.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in (key, tree_key)}
    corrupted = bytearray(stored[key])
    corrupted[100] ^= 0xFF  # same size, different bytes
    bucket.put_object(Bucket=BUCKET, Key=key, Body=bytes(corrupted))
    try:
        repo = clone(pushed, tmp_path / "clone")
        result = run(["dvc", "pull", "-v", "data"], repo, check=False)
        output = result.stdout + result.stderr
        assert result.returncode != 0
        assert "failed to pull data from the cloud" in output
        assert f"Checkout failed for following targets:\n{DATA_OUT.as_posix()}" in output
        cached = repo / ".dvc" / "cache" / "files" / "md5" / digest[:2] / digest[2:]
        assert f"corrupted cache file '{cached}'" in output
        assert not (repo / DATA_OUT / shard).exists()
        assert not cached.exists()

        # recovery (docs/remotes.md): delete the object and its directory's .dir, push again
        for k in (key, tree_key):
            bucket.delete_object(Bucket=BUCKET, Key=k)
        run(["dvc", "push", "data"], pushed)
        run(["dvc", "pull", "data"], repo)
        assert md5(repo / DATA_OUT / shard) == digest
    finally:
        for k, body in stored.items():
            bucket.put_object(Bucket=BUCKET, Key=k, Body=body)
