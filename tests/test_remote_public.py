"""Pulling a published DVC remote read-only by its URL (docs/remotes.md, "Publishing a public
remote, pulling read-only"), and the message of a clone that has no remote to pull from.

A tiny DVC project is pushed to a folder, which is then published two ways: served by
``python -m http.server`` (a static HTTP server, read-only) and copied into a local S3 server
(moto). A fresh clone pulls it with ``make pull REMOTE=URL`` / ``hwgptbench pull --remote URL``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from conftest import (
    BIN,
    CREDENTIALS,
    REPO_ROOT,
    free_port,
    local_no_proxy,
    run,
    serving,
    tool_env,
)
from hwgptbench.pipeline.remote import (
    URL_REMOTE,
    RemoteError,
    add_url_remote,
    aws_credentials_set,
    configured_remotes,
    parse_config_list,
    remote_to_push,
    url_remote_options,
)

BUCKET = "hwgptbench-public"
PREFIX = "dvc"
# the published artifacts: a folder output, as dvc.yaml's outputs are
FILES = {"supernet.pt": bytes(range(256)) * 64, "tables/surrogate.json": b'{"r2": 0.9}\n'}


def dvc_project(path: Path) -> Path:
    """A git repository with DVC initialised at ``path``, committed."""
    path.mkdir(parents=True)
    run(["git", "init", "-q", "-b", "main"], path)
    run(["dvc", "init", "-q"], path)
    run(["git", "commit", "-qm", "dvc init"], path)
    return path


def clone(source: Path, dest: Path) -> Path:
    run(["git", "clone", "-q", str(source), str(dest)], source.parent)
    return dest


def pulled_files(repo: Path) -> dict[str, bytes]:
    return {p.relative_to(repo / "artifacts").as_posix(): p.read_bytes()
            for p in (repo / "artifacts").rglob("*") if p.is_file()}


def local_remote_section(repo: Path) -> str:
    return (repo / ".dvc" / "config.local").read_text()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DVC project whose ``artifacts/`` is pushed to the folder ``store`` beside it."""
    top = tmp_path_factory.mktemp("published")
    repo = dvc_project(top / "project")
    for name, data in FILES.items():
        (repo / "artifacts" / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / "artifacts" / name).write_bytes(data)
    run(["dvc", "add", "-q", "artifacts"], repo)
    run(["dvc", "remote", "add", "store", str(top / "store")], repo)
    run(["dvc", "remote", "modify", "store", "verify", "true"], repo)
    run(["dvc", "push", "-r", "store"], repo)
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "artifacts"], repo)
    # the same remote with one object corrupted (same size, other bytes)
    shutil.copytree(top / "store", top / "corrupted")
    obj = next(p for p in (top / "corrupted").rglob("*") if p.is_file()
               and p.stat().st_size == len(FILES["supernet.pt"]))
    obj.chmod(0o644)
    raw = bytearray(obj.read_bytes())
    raw[100] ^= 0xFF
    obj.write_bytes(bytes(raw))
    return repo


@pytest.fixture(scope="module")
def http_root(published: Path) -> Iterator[str]:
    """The folder holding ``store`` and ``corrupted``, served read-only over HTTP."""
    port = free_port()
    with pytest.MonkeyPatch.context() as env:
        local_no_proxy(env)
        with serving([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                      "--directory", str(published.parent)], f"http://127.0.0.1:{port}/",
                     published.parent / "http.log") as url:
            yield url


# -- no subprocess: the config parsing and the options of a URL remote --

def test_config_list_is_parsed_with_origins_and_shadowing() -> None:
    settings = parse_config_list(
        ".dvc/config\tremote.local.url=/srv/hwgptbench-dvc-remote\n"
        ".dvc/config\tremote.local.verify=true\n"
        ".dvc/config\tcore.analytics=false\n"
        ".dvc/config.local\tremote.local.url=/mnt/shared/dvc\n"
        ".dvc/config.local\tremote.public.url=https://example.org/a=b\n"
        ".dvc/config.local\tcore.remote=local\n")
    assert settings.default == "local"
    assert settings.remotes["local"].url == "/mnt/shared/dvc"
    assert settings.remotes["local"].origin == ".dvc/config.local"
    assert settings.remotes["local"].verifies and not settings.remotes["public"].verifies
    assert settings.remotes["public"].url == "https://example.org/a=b"
    assert settings.remotes["public"].local_path is None
    assert settings.remotes["local"].files == (".dvc/config", ".dvc/config.local")
    assert parse_config_list("").remotes == {} and parse_config_list("").default is None


def test_url_remote_options() -> None:
    signed = {**CREDENTIALS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert url_remote_options("https://example.org/dvc", environ={}) == {"verify": "true"}
    assert url_remote_options("s3://bucket/dvc", environ=signed) == {
        "verify": "true", "endpointurl": "http://127.0.0.1:9000"}
    anonymous = url_remote_options("s3://bucket/dvc", "https://minio.example.org",
                                   environ={"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"})
    assert anonymous == {"verify": "true", "endpointurl": "https://minio.example.org",
                         "allow_anonymous_login": "true"}
    for url, endpoint, words in [
            ("gs://bucket/dvc", None, "s3://, http:// and https:// URLs only"),
            ("s3:///dvc", None, "names no bucket or host"),
            ("https://example.org/dvc", "http://127.0.0.1:9000", "s3:// URL only"),
            ("s3://bucket/dvc", "127.0.0.1:9000", "expected http(s)://HOST")]:
        with pytest.raises(RemoteError, match=words.replace("(", r"\(").replace(")", r"\)")):
            url_remote_options(url, endpoint, environ={})


def test_aws_credentials_are_found_in_the_environment_or_a_file(tmp_path: Path) -> None:
    assert not aws_credentials_set({}, home=tmp_path)
    assert aws_credentials_set({"AWS_PROFILE": "team"}, home=tmp_path)
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert aws_credentials_set({}, home=tmp_path)
    assert not aws_credentials_set({"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")},
                                   home=tmp_path)


# -- dvc subprocesses --

@pytest.mark.e2e
def test_url_remote_is_written_to_config_local_only(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    repo = dvc_project(tmp_path / "repo")
    shutil.copyfile(REPO_ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    run(["git", "commit", "-qam", "the project's DVC config"], repo)
    committed = (repo / ".dvc" / "config").read_bytes()
    monkeypatch.chdir(repo)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")

    assert add_url_remote("https://example.org/old") == URL_REMOTE
    assert add_url_remote("https://example.org/hwgptbench/dvc") == URL_REMOTE  # replaces it
    settings = configured_remotes()
    public = settings.remotes[URL_REMOTE]
    assert public.url == "https://example.org/hwgptbench/dvc"
    assert Path(public.origin).name == "config.local" and public.verifies
    assert settings.default is None  # never the default: no dvc push goes there
    assert (repo / ".dvc" / "config").read_bytes() == committed
    assert run(["dvc", "config", "--local", f"remote.{URL_REMOTE}.verify"], repo
               ).stdout.strip() == "true"
    assert "example.org" not in run(["dvc", "config", "--list", "--project"], repo).stdout
    assert run(["git", "status", "--porcelain"], repo).stdout == ""  # config.local is ignored
    with pytest.raises(RemoteError, match="read-only"):
        remote_to_push(URL_REMOTE)
    with pytest.raises(RemoteError, match="give its name"):
        remote_to_push("https://example.org/hwgptbench/dvc")

    # an s3:// URL: the endpoint given, requests signed with the credentials of the environment
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    add_url_remote("s3://bucket/dvc", endpoint_url="http://127.0.0.1:9")
    options = configured_remotes().remotes[URL_REMOTE].options
    assert options == {"verify": "true", "endpointurl": "http://127.0.0.1:9"}
    assert (repo / ".dvc" / "config").read_bytes() == committed

    # a committed remote of that name is not overwritten
    run(["dvc", "remote", "add", URL_REMOTE, "https://example.org/team"], repo)
    with pytest.raises(RemoteError, match=r"already set in \.dvc/config;"):
        add_url_remote("https://example.org/other")


@pytest.mark.e2e
def test_make_pull_by_http_url(published: Path, http_root: str, tmp_path: Path) -> None:
    repo = clone(published, tmp_path / "clone")
    committed = (repo / ".dvc" / "config").read_bytes()
    url = f"{http_root}store"
    venv = BIN.parent
    result = run(["make", "-f", str(REPO_ROOT / "Makefile"), "-o", f"{venv}/.installed",
                  f"VENV={venv}", "pull", f"REMOTE={url}"], repo)
    assert "hwgptbench pull" in result.stdout  # the URL reaches it through the environment
    assert pulled_files(repo) == {name: data for name, data in FILES.items()}
    assert (repo / ".dvc" / "config").read_bytes() == committed
    section = local_remote_section(repo)
    assert f"['remote \"{URL_REMOTE}\"']" in section and f"url = {url}" in section
    assert "verify = true" in section
    assert run(["git", "status", "--porcelain"], repo).stdout == ""
    # a second pull, by the name the URL was given: nothing to fetch, all current
    again = run(["hwgptbench", "pull", "--remote", URL_REMOTE], repo)
    assert "Everything is up to date" in again.stdout + again.stderr


@pytest.mark.e2e
def test_corrupted_object_behind_http_url_fails_the_pull(published: Path, http_root: str,
                                                         tmp_path: Path) -> None:
    repo = clone(published, tmp_path / "clone")
    result = run(["hwgptbench", "pull", "--remote", f"{http_root}corrupted"], repo, check=False)
    assert result.returncode == 2
    assert "dvc pull from remote 'public' exited with 1" in result.stderr
    assert "failed to pull data from the cloud - Checkout failed" in result.stderr  # verify
    assert "Traceback" not in result.stderr
    assert not (repo / "artifacts" / "supernet.pt").exists()


@pytest.mark.e2e
def test_pull_by_s3_url_anonymously(published: Path, s3_endpoint: str, tmp_path: Path) -> None:
    # publish: the folder remote's objects, copied into the bucket under PREFIX, public-read
    bucket = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket.create_bucket(Bucket=BUCKET, ACL="public-read")
    store = published.parent / "store"
    for path in (p for p in store.rglob("*") if p.is_file()):
        bucket.upload_file(str(path), BUCKET, f"{PREFIX}/{path.relative_to(store).as_posix()}",
                           ExtraArgs={"ACL": "public-read"})

    repo = clone(published, tmp_path / "clone")
    committed = (repo / ".dvc" / "config").read_bytes()
    # a user with no AWS credentials at all: the bucket is read unsigned
    env = {k: v for k, v in tool_env().items() if not k.startswith("AWS_")}
    env["HOME"] = str(tmp_path / "home")
    url = f"s3://{BUCKET}/{PREFIX}"
    run(["hwgptbench", "pull", "--remote", url, "--endpoint-url", s3_endpoint], repo, env=env)
    assert pulled_files(repo) == FILES
    assert (repo / ".dvc" / "config").read_bytes() == committed
    section = local_remote_section(repo)
    for line in (f"url = {url}", "verify = true", f"endpointurl = {s3_endpoint}",
                 "allow_anonymous_login = true"):
        assert line in section
    assert not any(value in section for value in CREDENTIALS.values())


@pytest.mark.e2e
def test_fresh_clone_without_a_reachable_remote_says_what_to_do(tmp_path: Path) -> None:
    """The project's committed .dvc/config in a fresh clone: no default remote, and the
    ``local`` folder is not on this machine."""
    origin = dvc_project(tmp_path / "origin")
    shutil.copyfile(REPO_ROOT / ".dvc" / "config", origin / ".dvc" / "config")
    run(["git", "commit", "-qam", "the project's DVC config"], origin)
    repo = clone(origin, tmp_path / "clone")
    assert not (tmp_path / "hwgptbench-dvc-remote").exists()

    result = run([str(BIN / "hwgptbench"), "pull"], repo, check=False)
    assert result.returncode == 2
    message = result.stderr
    assert "Traceback" not in message + result.stdout
    assert message.count("error:") == 1
    assert "no DVC remote to pull from: none is given" in message
    assert f"local: {tmp_path / 'hwgptbench-dvc-remote'}" in message
    assert "no such folder on this machine" in message
    for hint in ("src/hwgptbench/published/", "hwgptbench query --scale s",
                 "make pull REMOTE=https://", "s3://", "make run", "make hwgptbench"):
        assert hint in message, hint

    venv = BIN.parent
    named = run(["make", "-f", str(REPO_ROOT / "Makefile"), "-o", f"{venv}/.installed",
                 f"VENV={venv}", "pull", "REMOTE=local"], repo, check=False)
    assert named.returncode != 0 and "Traceback" not in named.stderr
    assert "remote 'local' is the folder" in named.stderr
    assert "not on this machine" in named.stderr

