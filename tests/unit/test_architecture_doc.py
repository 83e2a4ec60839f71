"""docs/ARCHITECTURE.md stays true of the code where a machine can check it: every repository path
it names exists, every ``path.py`` followed by a name defines that name, and every dotted name
(``patches.request_book.request_event``) resolves to a module and something defined in it. Read
from the source (``ast``), nothing is imported."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TOP = ("policy", "serving", "scr", "exact_cache", "patches", "eval", "scripts", "tests", "docs", "requirements")
TEXT = DOC.read_text()

PATHS = sorted(set(re.findall(r"`((?:%s)/[\w./-]*)`" % "|".join(TOP), TEXT)))
# `path.py` `name` (a table cell naming a file and what in it), and `path.py` (`name`, `name`, ...):
# the names in parentheses up to the first plain word ("via", "the", a § citation).
_FILE = r"`((?:%s)/[\w/]+\.py)`" % "|".join(TOP)
PAIRS = sorted(set(re.findall(_FILE + r" `(\w+(?:\.\w+)?)`", TEXT))
               | {(path, name) for path, names in re.findall(_FILE + r" \(((?:`\w+(?:\.\w+)?`(?:, |; |\)|$))+)", TEXT)
                  for name in re.findall(r"`(\w+(?:\.\w+)?)`", names)})
# Dotted names of a module (``patches.request_book.request_event``); ``policy.release`` (the policy
# object's method) and fault points (``scr.place_rows``) name no module, and are not checked here.
DOTTED = sorted(name for name in set(re.findall(r"`((?:policy|serving|scr|exact_cache|patches|eval)(?:\.\w+)+)`", TEXT))
                if ROOT.joinpath(*name.split(".")[:2]).with_suffix(".py").is_file()
                or ROOT.joinpath(*name.split(".")[:2]).is_dir())


@lru_cache(maxsize=None)
def defined(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, and each class's members: ``{"": names, "Class": members}``."""
    tree = ast.parse(path.read_text())
    names: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[""].add(node.name)
        if isinstance(node, ast.ClassDef):
            members = names.setdefault(node.name, set())
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Assign):
            names[""].update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[""].add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names[""].update(alias.asname or alias.name for alias in node.names)
    return names


def has(path: Path, name: str) -> bool:
    """``name`` (or ``Class.member``) is defined in ``path``; a bare name may be a class's member."""
    owner, _, member = name.rpartition(".")
    names = defined(path)
    if owner:
        return member in names.get(owner, set())
    return any(name in members for members in names.values())


def test_the_doc_names_paths_names_and_modules():
    assert len(PATHS) > 40 and len(PAIRS) > 20 and len(DOTTED) > 5


@pytest.mark.parametrize("path", PATHS)
def test_every_path_exists(path):
    assert (ROOT / path).exists(), f"docs/ARCHITECTURE.md names {path}, which does not exist"


@pytest.mark.parametrize("path, name", PAIRS)
def test_every_named_thing_is_defined_where_the_doc_says(path, name):
    assert has(ROOT / path, name), f"docs/ARCHITECTURE.md: {path} does not define {name}"


@pytest.mark.parametrize("dotted", DOTTED)
def test_every_dotted_name_resolves(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ROOT.joinpath(*parts[:cut])
        for candidate in (module.with_suffix(".py"), module / "__init__.py"):
            if candidate.is_file():
                rest = ".".join(parts[cut:])
                assert not rest or has(candidate, rest), f"{candidate.relative_to(ROOT)} does not define {rest}"
                return
    pytest.fail(f"docs/ARCHITECTURE.md names {dotted}, which is no module")


def test_a_wrong_path_or_name_would_be_seen(tmp_path):
    """The checks themselves: a name a file does not define, and a class member, are told apart."""
    module = tmp_path / "m.py"
    module.write_text("class A:\n    x: int = 1\n    def f(self): ...\nB = 2\n")
    assert has(module, "A") and has(module, "A.f") and has(module, "A.x") and has(module, "B")
    assert has(module, "f") and not has(module, "C") and not has(module, "A.g")
