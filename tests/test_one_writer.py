"""One writer (docs/security.md, "One writer"): every file or folder the package writes goes
through the output module (``hwgptbench/outputs.py`` and ``io.py``'s atomic writers), and the
module's checks hold whatever flag named the path.

The scan reads the package's source with ``ast`` and fails, naming file:line, on any other call
that writes, moves or deletes a path. A write is the output module's when its target is rooted
at a path the module yields (``with atomic_path(...) as tmp``, ``atomic_dir``, ``replace_dir``,
``temp_dir``) or at an in-memory buffer (``io.BytesIO()``).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import polars as pl
import pytest

from conftest import REPO_ROOT
from hwgptbench import cli, layout, outputs
from hwgptbench.io import atomic_write_json, atomic_write_text, write_parquet
from hwgptbench.outputs import (
    MARKER,
    STAGING_MARKER,
    OutputPathError,
    atomic_dir,
    check_output_dir,
    copy_file,
    make_own_dir,
    remove_file,
    remove_own_dir,
    remove_stale_staging,
    replace_dir,
)

PACKAGE = REPO_ROOT / "src" / "hwgptbench"
# the output module: outputs.py whole, and io.py's atomic writers (by function)
ALLOWED: dict[str, frozenset[str] | None] = {
    "outputs.py": None,
    "io.py": frozenset({"atomic_write_bytes", "write_parquet", "save_torch"})}
# context managers of the output module whose `as` name is a path it owns while it is written
OWNED_CONTEXTS = {"atomic_path", "atomic_dir", "atomic_files", "replace_dir", "temp_dir"}
BUFFERS = {"io.BytesIO", "BytesIO", "io.StringIO", "StringIO"}

# module functions that write: dotted name -> index of the argument that is the written path
MODULE_WRITES = {
    **{f"shutil.{name}": 1 for name in ("copy", "copy2", "copyfile", "copytree", "move")},
    "shutil.rmtree": 0,
    **{f"os.{name}": 0 for name in ("remove", "unlink", "rmdir", "removedirs", "makedirs",
                                    "mkdir", "truncate", "mkfifo", "mknod")},
    **{f"os.{name}": 1 for name in ("rename", "renames", "replace", "symlink", "link")},
    "torch.save": 1, "torch.export.save": 1, "onnx.save": 1, "onnx.save_model": 1,
    "json.dump": 1, "pickle.dump": 1, "yaml.dump": 1, "yaml.safe_dump": 1,
    "numpy.save": 0, "numpy.savez": 0, "numpy.savez_compressed": 0, "numpy.savetxt": 0,
    **{f"tempfile.{name}": -1 for name in ("mkstemp", "mkdtemp", "TemporaryDirectory",
                                           "NamedTemporaryFile", "TemporaryFile",
                                           "SpooledTemporaryFile")},
}
# methods that always write: name -> whose path (the receiver, or the first argument)
RECEIVER_WRITES = {"write_text", "write_bytes", "touch", "mkdir", "rmdir", "unlink",
                   "symlink_to", "hardlink_to", "link_to"}
ARGUMENT_WRITES = {"tofile", "savefig", "save_model", "save_pretrained", "extractall"}
# methods that write a file when given one, and return text otherwise (polars, pandas)
FILE_OR_TEXT = {"write_parquet", "write_csv", "write_ipc", "write_ipc_stream", "write_json",
                "write_ndjson", "write_avro", "write_excel", "write_delta", "sink_parquet",
                "sink_csv", "sink_ipc", "sink_ndjson", "to_csv", "to_parquet", "to_json",
                "to_pickle", "to_feather", "to_excel", "to_hdf"}
WRITE_MODES = set("wax+")


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` of a name or attribute chain, its first name resolved through the imports."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _mode(call: ast.Call, position: int) -> str | None:
    """The mode a call passes (positional at ``position`` or ``mode=``): its text, "" when
    absent, None when not a constant (any mode)."""
    for keyword in call.keywords:
        if keyword.arg == "mode":
            value = keyword.value
            return value.value if isinstance(value, ast.Constant) and isinstance(
                value.value, str) else None
    if len(call.args) > position:
        value = call.args[position]
        return value.value if isinstance(value, ast.Constant) and isinstance(
            value.value, str) else None
    return ""


class _Scan(ast.NodeVisitor):
    """The write calls of one module outside the output module."""

    def __init__(self, allowed_functions: frozenset[str] | set[str]) -> None:
        self.allowed = allowed_functions
        self.aliases: dict[str, str] = {"np": "numpy"}
        self.found: list[tuple[int, str]] = []
        self.owned: list[set[str]] = [set()]
        self.functions: list[str] = []

    # names and scopes
    def visit_Import(self, node: ast.Import) -> None:
        for name in node.names:
            self.aliases[name.asname or name.name.split(".")[0]] = (
                name.name if name.asname else name.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:  # the package's own: checked where it is defined
            module = "hwgptbench" + (f".{module}" if module else "")
        for name in node.names:
            alias = name.asname or name.name
            self.aliases[alias] = f"{module}.{name.name}" if module else name.name

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.owned.append(set(self.owned[-1]))
        self._bind(node)
        self.generic_visit(node)
        self.owned.pop()
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _bind(self, scope: ast.AST) -> None:
        """Names of scope bound to a path the output module owns, or to a buffer (and names
        assigned from such a path), to a fixed point."""
        owned = self.owned[-1]
        while True:
            before = len(owned)
            for node in ast.walk(scope):
                if isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        callee = item.context_expr
                        name = (_dotted(callee.func, self.aliases)
                                if isinstance(callee, ast.Call) else None)
                        if name and name.split(".")[-1] in OWNED_CONTEXTS \
                                and isinstance(item.optional_vars, ast.Name):
                            owned.add(item.optional_vars.id)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    value = node.value
                    if (isinstance(value, ast.Call)
                            and _dotted(value.func, self.aliases) in BUFFERS) \
                            or self._rooted(value):
                        owned.add(node.targets[0].id)
            if len(owned) == before:
                return

    def _rooted(self, node: ast.AST | None) -> bool:
        """Whether a path expression is rooted at an owned name."""
        if isinstance(node, ast.Name):
            return node.id in self.owned[-1]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return self._rooted(node.left)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in {"str", "Path", "os.fspath"} and node.args:
            return self._rooted(node.args[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in {"joinpath", "with_suffix", "with_name"}:
            return self._rooted(node.func.value)
        return False

    # write calls
    def visit_Module(self, node: ast.Module) -> None:
        self._bind(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        what = self._write(node)
        if what and not set(self.functions) & self.allowed:
            self.found.append((node.lineno, what))
        self.generic_visit(node)

    def _argument(self, node: ast.Call, index: int) -> ast.AST | None:
        return node.args[index] if 0 <= index < len(node.args) else None

    def _write(self, node: ast.Call) -> str | None:
        """What a call writes (a short description), or None."""
        func = node.func
        name = _dotted(func, self.aliases)
        if name and name.startswith("hwgptbench."):
            return None  # a function of the package: its own writes are scanned
        if name in {"open", "io.open", "codecs.open", "os.fdopen", "builtins.open"}:
            mode = _mode(node, 1)
            if mode is None or set(mode) & WRITE_MODES:
                return None if self._rooted(self._argument(node, 0)) else f"{name}(mode={mode!r})"
            return None
        if name == "os.open":
            target = self._argument(node, 0)
            flags = ast.unparse(self._argument(node, 1) or ast.Constant(0))
            if any(f in flags for f in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND")):
                if target is not None and _dotted(target, self.aliases) == "os.devnull":
                    return None  # the null device: nothing is stored
                return None if self._rooted(target) else "os.open for writing"
            return None
        if name in {"zipfile.ZipFile", "tarfile.open"}:
            mode = _mode(node, 1)
            if mode is None or set(mode) & WRITE_MODES:
                return None if self._rooted(self._argument(node, 0)) else f"{name}(mode={mode!r})"
            return None
        if name in MODULE_WRITES:
            index = MODULE_WRITES[name]
            return None if self._rooted(self._argument(node, index)) else name
        if name in {"torch.onnx.export"} and (len(node.args) > 2
                                              or any(k.arg == "f" for k in node.keywords)):
            return None if self._rooted(self._argument(node, 2)) else name
        if not isinstance(func, ast.Attribute):
            return None
        method, receiver = func.attr, func.value
        if name and name.split(".")[0] in {"dataclasses", "str", "re"}:
            return None
        if method == "open":
            mode = _mode(node, 0)
            if mode and set(mode) & WRITE_MODES:
                return None if self._rooted(receiver) else f".open({mode!r})"
            return None
        if method in RECEIVER_WRITES:
            return None if self._rooted(receiver) else f".{method}()"
        if method in {"rename", "replace"} and len(node.args) == 1 and not node.keywords \
                and not isinstance(node.args[0], (ast.Dict, ast.DictComp, ast.Lambda)) \
                and not isinstance(receiver, ast.Constant):
            return None if self._rooted(receiver) else f".{method}()"
        if method in ARGUMENT_WRITES:
            return None if self._rooted(self._argument(node, 0)) else f".{method}()"
        if method in FILE_OR_TEXT and (node.args or any(k.arg in {"file", "path", "path_or_buf"}
                                                        for k in node.keywords)):
            target = self._argument(node, 0)
            return None if self._rooted(target) else f".{method}()"
        if method == "save" and node.args and isinstance(
                node.args[0], (ast.BinOp, ast.JoinedStr, ast.Constant)) or (
                method == "save" and node.args and isinstance(node.args[0], ast.Call)
                and isinstance(node.args[0].func, ast.Name)
                and node.args[0].func.id in {"str", "Path"}):
            return None if self._rooted(node.args[0]) else ".save(path)"
        return None


WHOLE = None  # allowed_functions of a module that is the output module as a whole


def find_writes(source: str, allowed_functions: frozenset[str] | set[str] | None = frozenset(),
                ) -> list[tuple[int, str]]:
    """(line, what) of every call in a module's source that writes, moves or deletes a path
    other than through the output module (``allowed_functions``: names of functions whose
    writes are the output module's; None: the whole module is)."""
    if allowed_functions is WHOLE:
        return []
    scan = _Scan(allowed_functions)
    scan.visit(ast.parse(source))
    return sorted(scan.found)


def test_the_package_writes_only_through_the_output_module() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        allowed = ALLOWED.get(relative, frozenset())
        for line, what in find_writes(path.read_text(encoding="utf-8"), allowed):
            problems.append(f"src/hwgptbench/{relative}:{line}: {what}")
    assert not problems, ("writes outside the output module (route them through "
                          "hwgptbench.outputs or io's atomic writers):\n" + "\n".join(problems))


PLANTED = '''
import os, shutil, json, tempfile
from pathlib import Path
from shutil import rmtree as wipe
import numpy as np
import torch
import polars as pl


def bad(path, table, fig, booster, model):
    open(path, "w").write("x")                      # planted
    Path(path).write_text("x")                      # planted
    path.open("ab")                                 # planted
    table.write_parquet(path)                       # planted
    table.to_csv(path)                              # planted
    fig.savefig(path)                               # planted
    torch.save({}, path)                            # planted
    shutil.copyfile(path, path)                     # planted
    wipe(path)                                      # planted
    os.replace(path, path)                          # planted
    path.unlink()                                   # planted
    path.mkdir(parents=True)                        # planted
    json.dump({}, open(path, mode="x"))             # planted twice
    tempfile.mkdtemp()                              # planted
    path.rename(path.with_suffix(".old"))           # planted
    np.save(path, [1])                              # planted
    booster.save_model(path)                        # planted
    model.save(path / "x")                          # planted
    os.makedirs(path)                               # planted
'''

CLEAN = '''
import io
import json
import torch
from hwgptbench.outputs import atomic_path, replace_dir, temp_dir


def good(dest, table, fig, text):
    with atomic_path(dest) as tmp:
        table.write_parquet(tmp)
        fig.savefig(tmp, format="png")
    with replace_dir(dest, "cmd") as staging:
        (staging / "a.json").write_text("{}")
        inner = staging / "sub"
        inner.mkdir()
        table.write_csv(inner / "t.csv")
    with temp_dir() as scratch:
        (scratch / "x").write_bytes(b"")
    buffer = io.BytesIO()
    torch.save({}, buffer)
    open(dest, "rb").read()
    dest.open().read()
    table.rename({"a": "b"})
    text.replace("a", "b")
    csv_text = table.write_csv()
    return json.dumps({}), csv_text
'''


def test_the_scan_finds_a_planted_write_of_each_kind() -> None:
    found = find_writes(PLANTED)
    lines = [line for line, _ in found]
    planted = [n for n, text in enumerate(PLANTED.splitlines(), 1) if "# planted" in text]
    assert sorted(set(lines)) == planted and len(planted) == 19, found
    twice = next(n for n, text in enumerate(PLANTED.splitlines(), 1) if "twice" in text)
    assert lines.count(twice) == 2  # json.dump and the open for writing
    assert find_writes(CLEAN) == []
    assert find_writes(PLANTED, None) == []  # the output module itself


def test_the_output_module_names_the_results_folder_of_layout() -> None:
    assert outputs.RESULTS == layout.RESULTS


# --- every path component is resolved ----------------------------------------------------------

@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder (the working directory) holding ``linkout``, a link to a folder
    outside it (and outside the temporary folder's allowed root: under the home folder's
    place in the test, a sibling of the project, reached only through the link)."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "linkout").symlink_to(outside)
    # the temporary folder is an allowed root: point it inside the project for the test
    monkeypatch.setattr(outputs.tempfile, "gettempdir", lambda: str(root / ".tmp"))
    return root


def _outside(project: Path) -> list[str]:
    return sorted(p.name for p in (project.parent / "outside").rglob("*"))


def test_no_write_through_a_link_out_of_the_project(project: Path) -> None:
    for write in (lambda: atomic_write_text("linkout/x.txt", "x"),
                  lambda: write_parquet(pl.DataFrame({"a": [1]}), "linkout/sub/x.parquet"),
                  lambda: copy_file(__file__, "linkout/copy.py"),
                  lambda: outputs.make_dirs("linkout/new/deeper"),
                  lambda: atomic_dir("linkout/folder").__enter__()):
        with pytest.raises(OutputPathError, match="symbolic link out of the project"):
            write()
    assert _outside(project) == []
    (project / "inside").mkdir()
    (project / "linkin").symlink_to(project / "inside")
    atomic_write_text("linkin/x.txt", "x")  # a link inside the project is followed
    assert (project / "inside" / "x.txt").read_text() == "x"


def test_no_write_inside_git(project: Path) -> None:
    (project / ".git" / "refs" / "tags").mkdir(parents=True)
    for write in (lambda: atomic_write_text(".git/config", "x"),
                  lambda: atomic_dir(".git/refs/tags").__enter__(),
                  lambda: check_output_dir(".git/refs/tags", "export"),
                  lambda: check_output_dir(".git", "export")):
        with pytest.raises(OutputPathError, match="git folder"):
            write()
    assert (project / ".git" / "refs" / "tags").is_dir()


@pytest.mark.parametrize(("argv", "flag"), [
    (["query", "--metric", "latency_ms", "--arch", "e128-l3-h4_2_4-r4_3_2-b1"], "--out"),
    (["export", "--checkpoint", "c.pt", "--arch", "e128-l3-h4_2_4-r4_3_2-b1"], "--out"),
    (["ship-tables", "--params", str(REPO_ROOT / "params.yaml"), "--scale", "s"], "--folder"),
])
@pytest.mark.parametrize("target", ["linkout/new", ".git/refs/tags"])
def test_the_cli_refuses_links_out_and_git(argv: list[str], flag: str, target: str,
                                           project: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (project / ".git" / "refs" / "tags").mkdir(parents=True)
    if argv[0] == "query":
        target += ".parquet"
    assert cli.main([*argv, flag, target]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag} {target}:" in err, err
    assert ("symbolic link" in err) if target.startswith("linkout") else ("git folder" in err)
    assert _outside(project) == [] and (project / ".git" / "refs" / "tags").is_dir()


def test_paper_docs_copies_no_figure_through_a_link(project: Path) -> None:
    from hwgptbench.figures import paper_docs

    source = project / "fig.png"
    source.write_bytes(b"png")
    (project / "docs" / "img").mkdir(parents=True)
    (project / "docs" / "img" / "paper").symlink_to(project.parent / "outside")
    with pytest.raises(OutputPathError, match="symbolic link out of the project"):
        copy_file(source, project / "docs" / "img" / "paper" / "fig.png", owned=True)
    assert "copy_file" in Path(paper_docs.__file__).read_text()
    assert _outside(project) == []


def test_an_absolute_path_outside_the_project_without_links_is_written(
        project: Path) -> None:
    dest = project.parent / "elsewhere" / "x.json"
    atomic_write_json(dest, {"a": 1})
    assert json.loads(dest.read_text()) == {"a": 1}


# --- an existing file is replaced only when this package wrote it ------------------------------

def test_a_file_the_package_did_not_write_is_never_replaced(project: Path) -> None:
    mine = project / "NOTES.md"
    mine.write_text("mine")
    for write in (lambda: atomic_write_text(mine, "x"), lambda: atomic_write_json(mine, {}),
                  lambda: write_parquet(pl.DataFrame({"a": [1]}), mine),
                  lambda: copy_file(__file__, mine), lambda: remove_file(mine)):
        with pytest.raises(OutputPathError, match="not written by hwgptbench"):
            write()
    assert mine.read_text() == "mine"
    atomic_write_json(project / "ours.json", {"a": 1})  # recorded in the folder's ledger
    atomic_write_json(project / "ours.json", {"a": 2})
    assert json.loads((project / "ours.json").read_text()) == {"a": 2}
    assert json.loads((project / MARKER).read_text())["files"] == ["ours.json"]
    remove_file(project / "ours.json")
    assert json.loads((project / MARKER).read_text())["files"] == []


def test_the_results_folder_belongs_to_the_workflow(project: Path) -> None:
    stage = project / layout.RESULTS / "s" / "metrics.json"
    stage.parent.mkdir(parents=True)
    stage.write_text("{}")  # e.g. pulled by DVC: the stage that writes it replaces it
    atomic_write_json(stage, {"a": 1})
    assert not (stage.parent / MARKER).exists()


def _quality_input(project: Path) -> str:
    folder = project / "q"
    folder.mkdir()
    row = {"metric": ["latency_ms"], "device": ["cpu"], "condition": ["b1"], "family": ["x"],
           "status": ["failed"]}
    pl.DataFrame(row).write_parquet(folder / "quality.parquet")
    pl.DataFrame({"arch_id": ["a"]}).write_parquet(folder / "predictions.parquet")
    return str(folder / "quality.parquet")


@pytest.mark.parametrize(("argv", "mine"), [
    (["paper-surrogates", "--scale", "s", "--out", "NOTES.md"], ["NOTES.md"]),
    (["merge-quality", "--out", "mine.parquet", "--metrics-out", "thesis.json", "QUALITY"],
     ["mine.parquet", "thesis.json"]),
    (["merge-quality", "--out", "new.parquet", "--metrics-out", "thesis.json", "QUALITY"],
     ["thesis.json"]),
    (["transfer-external", "--params", str(REPO_ROOT / "params.yaml"), "--out-dir", "."],
     ["external.md"]),
])
def test_commands_refuse_a_users_file_whatever_the_flag(
        argv: list[str], mine: list[str], project: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from hwgptbench.published import surrogates

    monkeypatch.setattr(surrogates, "ensure_surrogates", lambda scale, results: project)
    argv = [_quality_input(project) if a == "QUALITY" else a for a in argv]
    for name in mine:
        (project / name).write_text("mine")
    before = sorted(p.name for p in project.iterdir())
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "exists and was not written by hwgptbench" in err, err
    assert all((project / name).read_text() == "mine" for name in mine)
    assert sorted(p.name for p in project.iterdir()) == before  # nothing written


# --- a rerun deletes only what it wrote; staging names never match a user's file ---------------

def test_a_rerun_keeps_a_file_a_user_added_to_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with replace_dir(out, "data") as staging:
        (staging / "a").write_text("1")
        (staging / "sub").mkdir()
        (staging / "sub" / "b").write_text("2")
    assert json.loads((out / MARKER).read_text())["files"] == ["a", "sub/b"]
    with replace_dir(out, "data") as staging:  # all its own: replaced
        (staging / "a").write_text("3")
    (out / "thesis.txt").write_text("mine")
    with pytest.raises(OutputPathError, match=r"did not write \(thesis.txt"), \
            replace_dir(out, "data"):
        pass
    assert (out / "thesis.txt").read_text() == "mine" and (out / "a").read_text() == "3"


def test_an_own_folder_is_removed_file_by_file(tmp_path: Path) -> None:
    parts = make_own_dir(tmp_path / "x.parts", "measure")
    atomic_write_json(parts / "plan.json", {})
    (parts / "notes.txt").write_text("mine")
    remove_own_dir(parts, "measure")
    assert sorted(p.name for p in parts.iterdir()) == [MARKER, "notes.txt"]
    make_own_dir(parts, "measure")  # still the command's folder, listing nothing
    atomic_write_json(parts / "plan.json", {})
    remove_own_dir(parts, "measure")
    assert sorted(p.name for p in parts.iterdir()) == [MARKER, "notes.txt"]
    (parts / "notes.txt").unlink()
    make_own_dir(parts, "measure")
    atomic_write_json(parts / "plan.json", {})
    remove_own_dir(parts, "measure")
    assert not parts.exists()


@pytest.mark.parametrize("name", ["*", "?", "[n]*", "out"])
def test_staging_clean_up_never_deletes_a_users_file(name: str, tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    keep = [folder / ".notes.tmp-keep", folder / f".{name}.tmp-keep"]
    for path in keep:
        path.write_text("mine")
    (folder / f".{name}.tmp-dir").mkdir()  # a folder without the staging marker
    remove_stale_staging(folder / name)
    with replace_dir(folder / name, "data") as staging:
        (staging / "a").write_text("1")
    assert all(p.read_text() == "mine" for p in keep)
    assert (folder / f".{name}.tmp-dir").is_dir()


def test_a_killed_write_leaves_staging_that_the_next_write_removes(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    holder = tmp_path / f".out{outputs._TMP_MARK}dead"
    holder.mkdir()
    (holder / STAGING_MARKER).write_text(json.dumps(
        {"format": "hwgptbench-staging", "dest": "out", "pid": 2**22 + 1,
         "host": outputs.socket.gethostname()}))
    live = tmp_path / f".out{outputs._TMP_MARK}live"
    live.mkdir()
    (live / STAGING_MARKER).write_text(json.dumps(
        {"format": "hwgptbench-staging", "dest": "out", "pid": os.getpid(),
         "host": outputs.socket.gethostname()}))
    with atomic_dir(dest) as staging:
        (staging / "a").write_text("1")
    assert not holder.exists() and live.exists()  # a running write's staging is kept


def test_data_out_with_a_pattern_keeps_a_sibling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / ".notes.tmp-keep").write_text("mine")
    cli.main(["data", "--params", str(REPO_ROOT / "params.yaml"), "--out", "dir/*"])
    assert (tmp_path / "dir" / ".notes.tmp-keep").read_text() == "mine"
