"""No circle of imports in the production packages: every module can be read after the ones it
imports. A circle is a strongly connected component of the module graph (``import_graph.graph``,
read from the source; an import inside a function is an arrow too). ``patches/`` keeps its bottom
(``targets.py``, ``process.py``) below the hook modules and ``plugin.install`` on top."""

from __future__ import annotations

import pytest

from tests.unit import import_graph

PACKAGES = ("patches", "scr", "policy", "serving", "exact_cache")
GRAPH = import_graph.graph(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_circle(package):
    circles = [c for c in import_graph.circles(GRAPH) if any(m.split(".")[0] == package for m in c)]
    assert circles == []


def test_the_bottom_of_patches_imports_nothing_of_patches_and_nothing_imports_the_plugin():
    for bottom in ("patches.targets", "patches.process"):
        assert not {m for m in GRAPH[bottom] if m.startswith("patches.")}, bottom
    assert [m for m, arrows in GRAPH.items() if "patches.plugin" in arrows] == []


def test_the_graph_has_every_module_and_its_arrows():
    assert {"patches.plugin", "patches.cpu.platform", "scr.steps", "policy.api", "policy.faults"} <= set(GRAPH)
    assert {"patches.hook_sets", "patches.process", "patches.cpu.platform"} <= GRAPH["patches.plugin"]


@pytest.mark.parametrize(
    "files, expected",
    [
        pytest.param({"a.py": "from p import b", "b.py": "def f():\n    from p.a import x\n"}, [["p.a", "p.b"]],
                     id="function-level-import-closes-a-circle"),
        pytest.param({"a.py": "from . import b", "b.py": "from .c import y", "c.py": "import p.a"},
                     [["p.a", "p.b", "p.c"]], id="relative-and-dotted-imports"),
        pytest.param({"a.py": "from p import b", "b.py": "import os"}, [], id="a-line-is-no-circle"),
        pytest.param({"__init__.py": "from p.a import x", "a.py": "from p import b", "b.py": ""}, [],
                     id="a-module-of-a-package-is-not-an-arrow-to-its-init"),
    ],
)
def test_circles_are_found(tmp_path, files, expected):
    """The graph and the component search themselves, on a package ``p`` written here."""
    (tmp_path / "p").mkdir()
    for name, source in files.items():
        (tmp_path / "p" / name).write_text(source)
    assert import_graph.circles(import_graph.graph(("p",), tmp_path)) == expected
