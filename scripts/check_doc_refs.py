#!/usr/bin/env python
"""Check that the repository's documentation references stay inside the repository.

``python scripts/check_doc_refs.py [ROOT]`` prints one line per problem and exits 1 when there is
any (0 when clean, 2 on a usage error). Two kinds of problem:

(a) **outside reference**: a file names a document that is not in the repository (the external
    specification files the project started from, or the folder that held them). Everything a
    reader needs is condensed under ``docs/``.
(b) **dangling citation**: a section citation ``§N`` does not resolve to a heading of the
    ``docs/`` file it cites.

The citation convention (the same text is in ``docs/ARCHITECTURE.md``):

* A **doc reference** is a path ``docs/<name>.md`` (leading ``../`` segments allowed), for example
  ``docs/scr.md``.
* A **citation** is ``§`` followed by a dotted number: ``§7``, ``§7.5``, ``§2.6.3``. In a range
  (``§6.1-§6.3``, ``§5.6-5.7``, en dash allowed) both ends are citations.
* A citation **binds** to the nearest doc reference before it on the same line. A citation with
  no doc reference before it on its line binds to the file's **default doc**, set by one line that
  starts (after comment marks) with ``Spec: docs/<name>.md``, e.g. ``# Spec: docs/scr.md`` below
  a module docstring, or ``Spec: docs/scr.md`` inside it. A file under ``docs/`` is its own default.
* A citation **resolves** when the bound doc has a markdown heading whose text starts with
  ``§<number>``, e.g. ``## §7.5 Splice``.

Scanned: the files git lists (tracked, and untracked but not ignored), or every file when git is
not available, minus ``.venv/``, ``runs/``, ``.artifacts/`` and binary files. The two reference
scripts and their test spell the external names and sample citations on purpose: they are exempt.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS_DIR = "docs"
SKIPPED_DIRS = (".venv/", "runs/", ".artifacts/", ".git/", ".hypothesis/", ".pytest_cache/")
# These files are about the references: they spell external names and sample citations.
EXEMPT_FROM_OUTSIDE = frozenset(
    {"scripts/check_doc_refs.py", "scripts/rewrite_doc_refs.py", "tests/unit/test_doc_refs.py"}
)

# Spelled in pieces so that a plain-text search of the repository finds no external name here.
_SPEC_STEMS = ("scr" + "_spec", "exact_cache" + "_spec", "eval" + "_spec", "model" + "_spec",
               "sglang" + "_internals", "sglang" + "_cpu", "sglang516" + "_cpu")
_STEMS_RE = "|".join(_SPEC_STEMS)
OUTSIDE_RE = re.compile(
    rf"shared/docs|\b(?:{_STEMS_RE}|style)\.md\b|\b(?:{_STEMS_RE})\b(?=[`'\"]*\s*§)"
)
DOC_REF_RE = re.compile(r"(?<![\w/])(?:\.\./)*docs/([A-Za-z0-9_]+)\.md")
NUMBER = r"\d+(?:\.\d+)*"
CITATION_RE = re.compile(rf"§({NUMBER})(?:\s*[-–]\s*§?({NUMBER}))?")
SPEC_LINE_RE = re.compile(r"^[\s#/*\"'`>-]*Spec:\s*[`'\"]*(?:\.\./)*docs/([A-Za-z0-9_]+)\.md")
HEADING_RE = re.compile(rf"^#+\s+§({NUMBER})(?=[\s.:]|$)", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    """One finding: ``path:line: message``."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def section_headings(doc_text: str) -> set[str]:
    """The section numbers a docs file defines: headings that start with ``§<number>``."""
    return set(HEADING_RE.findall(doc_text))


def default_doc(path: str, text: str) -> str | None:
    """The doc a bare citation in ``text`` binds to: its ``Spec:`` line, or itself under docs/."""
    for line in text.splitlines():
        found = SPEC_LINE_RE.match(line)
        if found:
            return found.group(1)
    if path.startswith(f"{DOCS_DIR}/") and path.endswith(".md"):
        return Path(path).stem
    return None


def citations(line: str, default: str | None) -> list[tuple[str | None, str]]:
    """``(doc, number)`` for every citation on ``line``; doc is None when nothing binds it.

    >>> citations("see docs/eval.md §5.6-5.7 and §2 (docs/scr.md §7.5)", "model")
    [('eval', '5.6'), ('eval', '5.7'), ('eval', '2'), ('scr', '7.5')]
    """
    refs = [(m.start(), m.group(1)) for m in DOC_REF_RE.finditer(line)]
    found = []
    for match in CITATION_RE.finditer(line):
        doc = default
        for start, name in refs:
            if start < match.start():
                doc = name
        found.extend((doc, number) for number in match.groups() if number)
    return found


def check_text(path: str, text: str, headings: dict[str, set[str]]) -> list[Problem]:
    """Problems (a) and (b) in one file's text; ``headings`` maps a doc name to its sections."""
    problems = []
    default = default_doc(path, text)
    if path in EXEMPT_FROM_OUTSIDE:
        return problems
    for number, line in enumerate(text.splitlines(), start=1):
        # Every problem needs one of these substrings; most lines have none (a cheap test first).
        if "§" not in line and ".md" not in line and "shared/docs" not in line:
            continue
        outside = OUTSIDE_RE.search(line)
        if outside:
            problems.append(Problem(path, number, f"reference outside the repository: {outside.group(0)!r}"))
        for doc, section in citations(line, default):
            if doc is None:
                problems.append(Problem(path, number, f"§{section} cites no doc (add a 'Spec: docs/<name>.md' line)"))
            elif doc not in headings:
                problems.append(Problem(path, number, f"§{section} cites docs/{doc}.md, which does not exist"))
            elif section not in headings[doc]:
                problems.append(Problem(path, number, f"§{section} has no heading in docs/{doc}.md"))
    return problems


def doc_headings(texts: dict[str, str]) -> dict[str, set[str]]:
    """Section headings of every ``docs/<name>.md`` in ``texts``, by name."""
    return {
        Path(path).stem: section_headings(text)
        for path, text in texts.items()
        if path.startswith(f"{DOCS_DIR}/") and path.endswith(".md") and path.count("/") == 1
    }


def check_texts(texts: dict[str, str]) -> list[Problem]:
    """All problems in a tree given as ``{relative path: text}`` (docs included)."""
    headings = doc_headings(texts)
    return [problem for path in sorted(texts) for problem in check_text(path, texts[path], headings)]


def listed_files(root: Path) -> list[str]:
    """Relative paths of the files to scan: git's view when available, else a walk."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=root, capture_output=True, check=True,
        ).stdout.decode()
        paths = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return sorted(p for p in paths if not p.startswith(SKIPPED_DIRS) and (root / p).is_file())


def read_texts(root: Path) -> dict[str, str]:
    """``{relative path: text}`` for every scanned text file (binary and undecodable files skipped)."""
    texts = {}
    for path in listed_files(root):
        data = (root / path).read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[path] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


USAGE = "usage: python scripts/check_doc_refs.py [ROOT]  (--help explains)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(args[0]).resolve() if args else ROOT
    problems = check_texts(read_texts(root))
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "doc references ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
