"""Both install modes install every third-party module the test suite imports (issue: a GPU
install failed at collection because ``hypothesis`` was only on the CPU list).

The suite's imports are read from the source (``ast``: every ``import`` in ``tests/`` and in the
packages the tests run, function-level ones included), mapped to distributions with this venv's
metadata, and held against what each mode of ``scripts/setup_env.sh`` installs:

* CPU: torch plus the pinned lists it installs with ``--no-deps`` (``cpu-top``, ``cpu-deps``,
  ``eval``, ``overlay``, ``test``), so each distribution must be named in one of them.
* GPU: ``sglang==0.5.16`` with its declared dependencies, ``eval``, ``overlay`` and ``test`` with
  theirs; a distribution counts when it is one of those or a dependency of one (followed through
  the metadata of what this venv has installed).
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup_env.sh"
OUR_PACKAGES = ("policy", "serving", "patches", "exact_cache", "scr", "eval", "tests", "scripts")
# Imports that only run where the module exists (each behind a guard in the code), never on this suite's path.
OPTIONAL = {"torchvision": "patches/cpu/preimport.py stands in for it when it is absent",
            "vllm": "patches/cpu/platform.py installs a stand-in module"}
MODES = {"cpu": ("cpu-top", "cpu-deps", "eval", "overlay", "test"), "gpu": ("eval", "overlay", "test")}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(list_name: str) -> set[str]:
    """The distributions a ``requirements/<list>.txt`` names."""
    names = set()
    for line in (ROOT / "requirements" / f"{list_name}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalize(re.split(r"[\[<>=!~; ]", line, maxsplit=1)[0]))
    return names


def suite_imports() -> dict[str, str]:
    """Top-level third-party module -> one file importing it, over the tests and our packages."""
    scripts = {path.stem for path in (ROOT / "scripts").glob("*.py")}  # tests put scripts/ on sys.path
    found: dict[str, str] = {}
    for package in OUR_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OUR_PACKAGES and top not in scripts:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def distribution_of(module: str) -> str:
    owners = metadata.packages_distributions().get(module)
    assert owners, f"no installed distribution provides {module!r}"
    return normalize(owners[0])


def requires(dist: str) -> set[str]:
    """``dist``'s declared dependencies on this platform (Linux x86_64), without extras."""
    from packaging.requirements import Requirement

    names = set()
    for line in metadata.requires(dist) or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            names.add(normalize(requirement.name))
    return names


def closure(roots: set[str]) -> set[str]:
    """``roots`` and everything they depend on, as far as this venv has the metadata."""
    seen, todo = set(), list(roots)
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            todo.extend(requires(dist))
        except metadata.PackageNotFoundError:
            pass  # a GPU-only dependency this CPU venv lacks: nothing the suite imports comes from it
    return seen


def installed_by(mode: str) -> set[str]:
    lists = set().union(*(requirement_names(name) for name in MODES[mode]))
    if mode == "cpu":
        return lists | {"torch"}
    return closure(lists | {"sglang"} | requires("sglang"))


def test_the_set_up_installs_the_lists_each_mode_is_checked_against():
    text = SETUP.read_text()
    cpu, _, rest = text.partition('if [ "$MODE" = cpu ]; then')[2].partition("\nelse\n")
    gpu = rest.partition("\nfi\n")[0]
    after = rest.partition("\nfi\n")[2]
    assert "sglang==0.5.16" in gpu and "--no-deps" not in gpu
    for name in ("cpu-top", "cpu-deps", "eval"):
        assert f"requirements/{name}.txt" in cpu
    assert "requirements/eval.txt" in gpu
    for name in ("overlay", "test"):  # installed after the mode's own block, in both modes
        assert f"requirements/{name}.txt" in after


def test_the_test_list_is_the_only_place_the_test_tools_are_named():
    assert {"pytest", "hypothesis"} <= requirement_names("test")
    for other in ("cpu-top", "cpu-deps", "eval", "overlay"):
        assert not {"pytest", "hypothesis"} & requirement_names(other), other


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_third_party_import_of_the_suite_is_installed(mode):
    installed = installed_by(mode)
    missing = {}
    for module, where in sorted(suite_imports().items()):
        if module in OPTIONAL:
            continue
        dist = distribution_of(module)
        if dist not in installed:
            missing[module] = f"{dist} (imported by {where})"
    assert not missing, f"the {mode} install lacks: {missing}"


def test_the_scan_sees_what_the_suite_really_imports():
    """The check cannot pass vacuously: the imports that made the GPU install fail are seen."""
    imports = suite_imports()
    assert {"pytest", "hypothesis", "torch", "sglang", "transformers"} <= set(imports)
    assert distribution_of("hypothesis") == "hypothesis" and "hypothesis" not in closure({"sglang"} | requires("sglang"))
