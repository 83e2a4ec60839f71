"""docs/ARCHITECTURE.md stays true of the code where a machine can check it: every repository path
it names exists, every ``path.py`` followed by a name defines that name, and every dotted name
(``patches.request_book.request_event``) resolves to a module and something defined in it. Read
from the source (``ast``), nothing is imported. Its tables "Packages and their direction" (which
package may import which, which libraries, the engine code outside ``patches/``) are the rules of
``tests/unit/test_import_rules.py``: the two are compared, arrow for arrow, so neither can change
alone."""

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


# ---------------------------------------------------------------------- the package directions

SECTION = "## Packages and their direction"


def tables(text: str) -> dict[str, list[list[str]]]:
    """The markdown tables of the doc's section "Packages and their direction", by their header
    row (cells joined with ``|``): each a list of rows of stripped cells."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found: dict[str, list[list[str]]] = {}
    rows: list[list[str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if rows:
            found["|".join(rows[0])] = [row for row in rows[2:]]  # past the header and the |---| line
            rows = []
    return found


def _names(cell: str) -> frozenset[str]:
    """``"`policy/`, torch"`` -> ``{"policy", "torch"}``; ``"none"`` -> nothing."""
    if cell == "none":
        return frozenset()
    return frozenset(part.strip().strip("`").rstrip("/") for part in cell.split(","))


def doc_rules(text: str) -> tuple[dict[str, tuple[frozenset[str], str]], dict[str, frozenset[str]]]:
    """The doc's package table as {package: (may import, libraries)} and its exceptions table as
    {file: also imports}."""
    found = tables(text)
    packages = {row[0].strip("`").rstrip("/"): (_names(row[2]), row[3])
                for row in found["package|holds|may import|libraries"]}
    exceptions = {row[0].strip("`"): _names(row[1]) for row in found["file|also imports|why"]}
    return packages, exceptions


def differences(doc: dict, rules: dict) -> list[str]:
    """Each arrow or library rule one side allows and the other does not, in words."""
    said = []
    for package in sorted(set(doc) | set(rules)):
        if package not in rules or package not in doc:
            said.append(f"{package}: only in {'the doc' if package in doc else 'the rules'}")
            continue
        (doc_ours, doc_libraries), (ours, libraries) = doc[package], rules[package]
        said += [f"the doc allows {package} -> {m}, the rules forbid it" for m in sorted(doc_ours - ours)]
        said += [f"the rules allow {package} -> {m}, the doc does not" for m in sorted(ours - doc_ours)]
        if doc_libraries != libraries:
            said.append(f"{package}: libraries {doc_libraries!r} in the doc, {libraries!r} in the rules")
    return said


def test_the_doc_states_the_import_rules():
    """docs/ARCHITECTURE.md's direction table is ``test_import_rules.RULES``, arrow for arrow."""
    from tests.unit.test_import_rules import RULES

    packages, _ = doc_rules(TEXT)
    assert differences(packages, {p: (rule.ours, rule.libraries) for p, rule in RULES.items()}) == []


def test_the_doc_lists_the_exceptions_the_rules_allow():
    from tests.unit.test_import_rules import EXCEPTIONS

    _, exceptions = doc_rules(TEXT)
    assert exceptions == EXCEPTIONS


def test_an_arrow_on_one_side_only_is_seen():
    """The comparison itself: an arrow the doc adds (scr -> serving), one it drops, a libraries
    word that differs."""
    from tests.unit.test_import_rules import RULES

    rules = {p: (rule.ours, rule.libraries) for p, rule in RULES.items()}
    edited = (TEXT.replace("(the decisions while a request is read) | `policy/` |",
                           "(the decisions while a request is read) | `policy/`, `serving/` |")
              .replace("| `policy/`, `serving/` | any |", "| `policy/` | any but the engine |"))
    assert edited.count("`serving/`") == TEXT.count("`serving/`")  # one arrow added, one dropped
    packages, _ = doc_rules(edited)
    assert differences(packages, rules) == [
        "the rules allow patches -> serving, the doc does not",
        "patches: libraries 'any but the engine' in the doc, 'any' in the rules",
        "the doc allows scr -> serving, the rules forbid it",
    ]
