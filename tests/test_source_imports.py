"""The one import reader (hwgptbench.pipeline.source_imports) on a package tree written here:
what each import statement and module-naming string resolves to."""

from __future__ import annotations

from pathlib import Path

from hwgptbench.pipeline.source_imports import PackageSource, parents

FILES = {
    "__init__.py": 'from .lazy import lazy_exports\n\n'
                   '__getattr__ = lazy_exports(__name__, {"Thing": "core.thing"})\n',
    "lazy.py": "def lazy_exports(name, names):\n    return None\n",
    "core/__init__.py": "",
    "core/thing.py": "VALUE = 1\n",
    "core/util.py": "",
    "user.py": ("from typing import TYPE_CHECKING\n"
                "import os\n"
                "from .core import util, VALUE_NAME\n"
                "from . import Thing\n"
                "if TYPE_CHECKING:\n"
                "    from .core import thing\n"
                "def f():\n"
                "    import pkg.core.util\n"
                'FAMILY = "pkg.core.thing:Thing"\n'
                'LOGGER = "pkg.missing.module"\n'),
}


def _source(tmp_path: Path) -> PackageSource:
    for name, text in FILES.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return PackageSource(tmp_path, "pkg")


def test_imports_resolve_to_the_deepest_module_and_lazy_names_to_theirs(tmp_path: Path) -> None:
    source = _source(tmp_path)
    assert set(source.modules()) == {"pkg", "pkg.lazy", "pkg.core", "pkg.core.thing",
                                     "pkg.core.util", "pkg.user"}
    # a module name, a name defined in a package, a lazily exported name, a nested import;
    # the standard library and the typing-only block are not the package's or never run
    assert sorted(source.imports("pkg.user")) == [(3, "pkg.core"), (3, "pkg.core.util"),
                                                   (4, "pkg.core.thing"), (8, "pkg.core.util")]
    typed = sorted(source.imports("pkg.user", typing=True))
    assert (6, "pkg.core.thing") in typed and len(typed) == 5
    # strings: a module:function of the package, and the deepest module of an unknown name
    assert sorted(source.named("pkg.user")) == [(9, "pkg.core.thing"), (10, "pkg")]
    assert parents("pkg.core.thing") == {"pkg", "pkg.core", "pkg.core.thing"}
    assert source.deepest("os.path") is None and source.module_file("pkg.nothing") is None
