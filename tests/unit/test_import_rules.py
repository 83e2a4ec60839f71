"""The layering, checked on the source: which package may import what.

- SGLang is imported only under ``patches/`` (the fork's overlay); tests outside the unit tier may
  use it too.
- torch only under ``patches/`` and ``eval/tiny_model.py`` (which builds the tiny checkpoint).
- ``policy/`` imports the standard library and itself, nothing else: the seam stays importable
  without an engine. ``serving/`` (request rules) may also use ``policy/``, nothing else.
- ``scr/`` and ``exact_cache/`` import neither each other nor ``patches/``: no policy reaches into
  the other, and planning never touches engine code.
- ``patches/`` imports no policy package (``scr/``, ``exact_cache/``) and nothing of ``eval/``: it
  reaches a policy only through the registry (``policy.registry``), the plan values and the policy
  object's own members (``policy.api.CachePolicy``).

Every ``import`` statement counts, module level or inside a function. The tests parse files
(``ast``), they import nothing, so a violation is found even on a path no test executes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("patches", "policy", "serving", "scr", "exact_cache", "eval", "scripts")
ENGINE_ONLY = {"sglang", "torch", "triton"}
TORCH_ALLOWED = {"eval/tiny_model.py"}  # builds the random checkpoint with transformers + torch
# The GPU check (scripts/gpu_check.sh) runs engine code on the device: the fp32 reference (torch),
# the production re-rotation (patches/rope.py, torch) and SGLang's own rotary kernels.
ENGINE_CHECK = {"eval/gpu_check/reference.py": {"torch"},
                "eval/gpu_check/rotary.py": {"torch", "patches"},
                "eval/gpu_check/rotary_kernels.py": {"torch", "sglang", "patches"}}


def _allowed(f: str, module: str) -> bool:
    return module in ENGINE_CHECK.get(f, set())


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports_by_file(packages: tuple[str, ...]) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _top_level_imports(p) for pkg in packages for p in _files(pkg)}


ALL = _imports_by_file(PACKAGES)


def test_every_package_has_files():
    for package in PACKAGES:
        assert _files(package), package


@pytest.mark.parametrize("module", ["sglang", "triton"])
def test_engine_imported_only_under_patches(module):
    offenders = sorted(f for f, mods in ALL.items()
                       if module in mods and not f.startswith("patches/") and not _allowed(f, module))
    assert offenders == []


def test_torch_imported_only_under_patches_and_the_model_builder():
    offenders = sorted(
        f for f, mods in ALL.items()
        if "torch" in mods and not f.startswith("patches/") and f not in TORCH_ALLOWED and not _allowed(f, "torch")
    )
    assert offenders == []


@pytest.mark.parametrize("package, also", [("policy", set()), ("serving", {"policy"})])
def test_seam_packages_use_only_the_standard_library(package, also):
    allowed = set(sys.stdlib_module_names) | {package, "__future__"} | also
    offenders = {f: sorted(mods - allowed) for f, mods in ALL.items() if f.startswith(f"{package}/") and mods - allowed}
    assert offenders == {}


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("scr", {"exact_cache", "patches", "eval"} | ENGINE_ONLY),
        ("exact_cache", {"scr", "patches", "eval"} | ENGINE_ONLY),
        ("policy", {"scr", "exact_cache", "patches", "eval", "serving"}),
        ("serving", {"scr", "exact_cache", "patches", "eval"}),
        ("eval", {"patches"}),
        ("patches", {"scr", "exact_cache", "eval"}),
    ],
)
def test_no_package_reaches_into_another(package, forbidden):
    offenders = {f: sorted(m for m in mods & forbidden if not _allowed(f, m))
                 for f, mods in ALL.items() if f.startswith(f"{package}/")}
    offenders = {f: mods for f, mods in offenders.items() if mods}
    assert offenders == {}


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import torch", {"torch"}),
        ("import torch.nn as nn, os", {"torch", "os"}),
        ("from sglang.srt import x", {"sglang"}),
        ("def f():\n    from scr.diff import common_prefix\n", {"scr"}),
        ("from . import sibling", set()),
        ("from .sub import x", set()),
    ],
)
def test_import_scanner(tmp_path, source, expected):
    """The scanner itself: function-level imports count, relative imports stay in the package."""
    path = tmp_path / "m.py"
    path.write_text(source)
    assert _top_level_imports(path) == expected
