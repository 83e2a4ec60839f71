"""The layering, checked on the source: which package may import which, and which libraries.

``RULES`` is the table "Packages and their direction" of docs/ARCHITECTURE.md as code, and
``EXCEPTIONS`` its table of files that touch the engine outside ``patches/``;
``tests/unit/test_architecture_doc.py`` parses both tables and compares them with these, so the
doc and the rules cannot move apart. In words:

- ``policy/`` imports the standard library and itself, nothing else: the seam stays importable
  without an engine. ``serving/`` (request rules), ``scr/`` and ``exact_cache/`` (the policies)
  may also use ``policy/``, nothing else: no policy reaches into the other or into ``serving/``,
  and planning never touches engine code.
- ``patches/`` may use ``policy/``, ``serving/`` and any library; it is the only package with the
  engine (SGLang, torch, triton). It imports no policy package (``scr/``, ``exact_cache/``): it
  reaches a policy only through the registry (``policy.registry``), the plan values and the policy
  object's own members (``policy.api.CachePolicy``).
- ``eval/`` and ``scripts/`` may use any library but the engine; the files in ``EXCEPTIONS`` are
  the engine code outside ``patches/``, each with what it may import besides its package's rule.

Every ``import`` statement counts, module level or inside a function. The tests parse files
(``ast``, ``tests/unit/import_graph.py``), they import nothing, so a violation is found even on a
path no test executes. Tests themselves (``tests/``) may import anything.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.unit.import_graph import ROOT, imported_names, module_name, top_level

ENGINE = frozenset({"sglang", "torch", "triton"})
# What a package may import of the libraries that are not ours (one of these words, as the doc says them).
STANDARD_LIBRARY, ANY, ANY_BUT_THE_ENGINE = "standard library", "any", "any but the engine"


class Rule(NamedTuple):
    ours: frozenset[str]  # our packages it may import besides itself
    libraries: str  # STANDARD_LIBRARY, ANY or ANY_BUT_THE_ENGINE


RULES: dict[str, Rule] = {
    "policy": Rule(frozenset(), STANDARD_LIBRARY),
    "exact_cache": Rule(frozenset({"policy"}), STANDARD_LIBRARY),
    "scr": Rule(frozenset({"policy"}), STANDARD_LIBRARY),
    "serving": Rule(frozenset({"policy"}), STANDARD_LIBRARY),
    "patches": Rule(frozenset({"policy", "serving"}), ANY),
    "eval": Rule(frozenset({"policy", "serving", "scr", "exact_cache"}), ANY_BUT_THE_ENGINE),
    "scripts": Rule(frozenset({"eval", "tests"}), ANY_BUT_THE_ENGINE),
}
OURS = frozenset(RULES) | {"tests"}
# Engine code outside patches/: file -> what it may import beyond its package's rule.
EXCEPTIONS: dict[str, frozenset[str]] = {
    "eval/tiny_model.py": frozenset({"torch"}),  # builds the tiny random checkpoint with transformers + torch
    # The GPU check (scripts/gpu_check.sh) runs engine code on the device: the fp32 reference
    # (torch), the production re-rotation (patches/rope.py, torch) and SGLang's own rotary kernels.
    "eval/gpu_check/reference.py": frozenset({"torch"}),
    "eval/gpu_check/rotary.py": frozenset({"torch", "patches"}),
    "eval/gpu_check/rotary_kernels.py": frozenset({"torch", "sglang", "patches"}),
}


def _imports(path: Path) -> set[str]:
    """The packages and libraries ``path`` imports (relative imports stay in its package)."""
    names = imported_names(path.read_text(), module_name(path), path.name == "__init__.py")
    return top_level(names) - {"__future__"}


ALL = {str(p.relative_to(ROOT)): _imports(p) for pkg in RULES for p in sorted((ROOT / pkg).rglob("*.py"))}


def forbidden(f: str, imported: set[str], exceptions: dict[str, frozenset[str]] = EXCEPTIONS) -> set[str]:
    """What of ``imported`` file ``f`` may not import under ``RULES`` and ``exceptions``."""
    package = f.split("/")[0]
    ours, libraries = RULES[package]
    allowed_ours = ours | {package}
    bad = {m for m in imported & OURS if m not in allowed_ours}
    theirs = imported - OURS
    if libraries == STANDARD_LIBRARY:
        bad |= theirs - set(sys.stdlib_module_names)
    elif libraries == ANY_BUT_THE_ENGINE:
        bad |= theirs & ENGINE
    return bad - exceptions.get(f, frozenset())


def test_every_package_has_files():
    for package in RULES:
        assert any(f.startswith(f"{package}/") for f in ALL), package


@pytest.mark.parametrize("package", sorted(RULES))
def test_each_package_imports_what_its_rule_allows(package):
    offenders = {f: sorted(forbidden(f, mods)) for f, mods in ALL.items() if f.startswith(f"{package}/")}
    assert {f: mods for f, mods in offenders.items() if mods} == {}


@pytest.mark.parametrize("f", sorted(EXCEPTIONS))
def test_every_exception_is_still_needed(f):
    """An exception names only what its file imports and its package's rule forbids: one that
    stopped being needed comes off the list (and off the doc's table)."""
    assert EXCEPTIONS[f] <= forbidden(f, ALL[f], exceptions={})


@pytest.mark.parametrize(
    "f, imported, expected",
    [
        pytest.param("scr/x.py", {"policy", "dataclasses"}, set(), id="scr-policy-and-stdlib"),
        pytest.param("scr/x.py", {"serving"}, {"serving"}, id="scr-no-serving"),
        pytest.param("scr/x.py", {"numpy"}, {"numpy"}, id="scr-stdlib-only"),
        pytest.param("patches/x.py", {"sglang", "torch", "serving", "policy"}, set(), id="patches-engine"),
        pytest.param("patches/x.py", {"scr"}, {"scr"}, id="patches-no-policy-package"),
        pytest.param("eval/x.py", {"torch", "numpy", "scr"}, {"torch"}, id="eval-no-engine"),
        pytest.param("eval/tiny_model.py", {"torch"}, set(), id="eval-exception"),
        pytest.param("eval/gpu_check/rotary.py", {"sglang"}, {"sglang"}, id="exception-names-what-it-allows"),
    ],
)
def test_the_rules_themselves(f, imported, expected):
    assert forbidden(f, imported) == expected


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import torch", {"torch"}),
        ("import torch.nn as nn, os", {"torch", "os"}),
        ("from sglang.srt import x", {"sglang"}),
        ("def f():\n    from scr.diff import common_prefix\n", {"scr"}),
        ("from . import sibling", {"p"}),
        ("from .sub import x", {"p"}),
    ],
)
def test_import_scanner(tmp_path, source, expected):
    """The scanner itself: function-level imports count, relative imports stay in the package."""
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "m.py"
    path.write_text(source)
    assert top_level(imported_names(source, module_name(path, tmp_path))) == expected
