#!/usr/bin/env python
"""Point every reference to the external specification files at their condensed copies in docs/.

``python scripts/rewrite_doc_refs.py [--write] [--diff] [ROOT]``

Without ``--write`` nothing is changed (dry run): the script lists the files it would rewrite,
then runs ``scripts/check_doc_refs.py``'s checks on the rewritten text (against the ``docs/`` files
as they are) and prints what would still fail. ``--diff`` also prints a unified diff. Exit status:
0 when the rewritten tree passes the checks, 1 when it would not, 2 on a usage error.

What it rewrites (the citation convention is in ``scripts/check_doc_refs.py``):

* a spec name in any spelling (``/work/shared/docs/scr_spec.md``, ``../../shared/docs/...``,
  ``shared/docs/...``, ``docs/scr_spec.md``, ``scr_spec.md``, and ``scr_spec`` right before a
  ``§``) becomes ``docs/scr.md``; likewise ``exact_cache_spec`` -> ``docs/exact.md``,
  ``eval_spec`` -> ``docs/eval.md``, ``model_spec`` -> ``docs/model.md``, ``sglang_internals``
  -> ``docs/sglang.md``, and both CPU studies -> ``docs/cpu.md``;
* the 0.5.16 CPU study's numbers move to where ``docs/cpu.md`` keeps them: ``§2`` -> ``§4``,
  ``B<n>`` -> ``§4 B<n>``; the 0.5.23 study's ``blocker <n>`` -> ``§3 blocker <n>``;
* a citation keeps the doc it meant. It used to bind to the nearest spec named before it on its
  line, else to a spec named at the end of the line above when its line starts with a citation
  (a sentence broken after the name), else
  to the file's main spec: of the specs it names and the one its path implies, the one with
  headings for most of its bare citations. When the new rule would bind a citation elsewhere,
  ``docs/<name>.md`` is written in front of it;
* a file that still has citations with no doc on their line gets a ``Spec: docs/<name>.md`` line
  (a ``#`` comment below the module docstring in Python, below the title in markdown, at the top
  elsewhere).

Running it twice changes nothing the second time.
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_doc_refs as check  # noqa: E402

STEM_TO_DOC = {
    "scr" + "_spec": "scr",
    "exact_cache" + "_spec": "exact",
    "eval" + "_spec": "eval",
    "model" + "_spec": "model",
    "sglang" + "_internals": "sglang",
    "sglang" + "_cpu": "cpu",
    "sglang516" + "_cpu": "cpu",
}
OLD_CPU_516 = "sglang516" + "_cpu"
OLD_CPU_523 = "sglang" + "_cpu"
# The 0.5.16 study's section numbers inside docs/cpu.md (the 0.5.23 study keeps its own).
CPU_516_SECTIONS = {"2": "4"}
DOC_NAMES = set(STEM_TO_DOC.values())
# Which doc a file means when it names none: first matching path prefix wins.
PATH_DEFAULTS = (
    ("scr/", "scr"), ("patches/scr", "scr"), ("tests/engine/test_scr", "scr"),
    ("tests/unit/test_scr", "scr"), ("tests/reference/scr", "scr"), ("tests/integration/test_scr", "scr"),
    ("exact_cache/", "exact"), ("patches/exact", "exact"), ("tests/unit/test_exact", "exact"),
    ("eval/bcp/", "eval"), ("eval/accounting/", "eval"), ("tests/unit/test_bcp", "eval"),
    ("eval/tiny_model", "model"), ("tests/reference/hybrid", "model"),
)

_STEMS = "|".join(sorted(STEM_TO_DOC, key=len, reverse=True))
# Longest spelling first: an optional folder, the stem, ``.md`` (or a ``§`` right after the stem).
MENTION_RE = re.compile(
    rf"(?:/work/|(?:\.\./)+)?(?:shared/)?(?:docs/)?(?<![\w])(?P<stem>{_STEMS})"
    rf"(?:\.md\b|(?=[`'\"]*\s*§))"
    rf"|(?<![\w/])(?:\.\./)*docs/(?P<doc>{'|'.join(sorted(DOC_NAMES))})\.md\b"
)
# A line that starts (after comment marks) with a citation continues the sentence above.
STARTS_WITH_CITATION_RE = re.compile(r"\A[\s#/*\"'`(>-]*§")
# A line without any of these has nothing to rewrite (a cheap test before the regexes above).
TRIGGER_RE = re.compile(r"§|_spec|_internals|_cpu|docs/")
CPU_ITEM_RE = re.compile(r"\A([`'\"]*\s*)(B\d+(?:\s*[-–]\s*B\d+)?|blocker \d+)")


def doc_of(match: re.Match) -> str:
    """The docs/ name a mention points to."""
    return match.group("doc") or STEM_TO_DOC[match.group("stem")]


def main_doc(path: str, text: str, headings: dict[str, set[str]]) -> str | None:
    """The doc a bare citation in this file meant: its Spec line if it has one; otherwise, of the
    docs it names and the one its path implies, the doc with headings for most of its bare
    citations (ties: the path's doc, then the doc named most often)."""
    declared = check.default_doc(path, text)
    if declared:
        return declared
    counts: dict[str, int] = {}
    for match in MENTION_RE.finditer(text) if TRIGGER_RE.search(text) else ():
        counts[doc_of(match)] = counts.get(doc_of(match), 0) + 1
    by_path = next((doc for prefix, doc in PATH_DEFAULTS if path.startswith(prefix)), None)
    candidates = set(counts) | ({by_path} if by_path else set())
    if not candidates:
        return None
    bare = bare_citations(text)

    def score(doc: str) -> tuple[int, bool, int]:
        resolved = sum(1 for number in bare if number in headings.get(doc, ()))
        return resolved, doc == by_path, counts.get(doc, 0)

    return max(sorted(candidates), key=score)


def bare_citations(text: str) -> list[str]:
    """Section numbers cited with no spec named before them on their line or dangling above."""
    found, carried = [], None
    for line in text.split("\n"):
        if not TRIGGER_RE.search(line):
            carried = None
            continue
        first_mention = next(iter(MENTION_RE.finditer(line)), None)
        carried = carried_into(line, carried)
        for match in check.CITATION_RE.finditer(line):
            if carried is None and (first_mention is None or first_mention.start() > match.start()):
                found.extend(n for n in match.groups() if n)
        carried = dangling_mention(line)
    return found


def dangling_mention(line: str) -> re.Match | None:
    """A spec named after the line's last citation: a sentence that may continue on the next line
    (it binds that line only when the line starts with a citation, see ``carried_into``)."""
    mentions = list(MENTION_RE.finditer(line)) if TRIGGER_RE.search(line) else []
    if not mentions:
        return None
    last_citation = max((m.start() for m in check.CITATION_RE.finditer(line)), default=-1)
    return mentions[-1] if mentions[-1].start() > last_citation else None


def carried_into(line: str, dangling: re.Match | None) -> re.Match | None:
    """The previous line's dangling spec, if this line continues its sentence with a citation."""
    return dangling if dangling is not None and STARTS_WITH_CITATION_RE.match(line) else None


def rewrite_line(line: str, carried: re.Match | None, default: str | None) -> str:
    """One line with its mentions renamed and its citations bound as before.

    ``carried`` is a mention dangling at the end of the previous line; ``default`` the file's doc.
    """
    mentions = [(m.start(), "m", m) for m in MENTION_RE.finditer(line)]
    cited = [(c.start(), "c", c) for c in check.CITATION_RE.finditer(line)]
    out, pos = [], 0
    events = sorted(mentions + cited, key=lambda e: e[0])
    old_bound, new_bound = carried, None
    for start, kind, match in events:
        out.append(line[pos:start])
        if kind == "m":
            out.append(f"docs/{doc_of(match)}.md")
            pos = match.end()
            pos, item = _cpu_item(line, pos, match)
            out.append(item)
            old_bound = new_bound = match
            continue
        old_doc = doc_of(old_bound) if old_bound else default
        new_doc = doc_of(new_bound) if new_bound else default
        if old_doc and old_doc != new_doc:
            out.append(f"docs/{old_doc}.md ")
        out.append(_renumbered(match, old_bound))
        pos = match.end()
    out.append(line[pos:])
    return "".join(out)


def _cpu_item(line: str, pos: int, mention: re.Match) -> tuple[int, str]:
    """A CPU-study item right after its mention (``B4-B7``, ``blocker 10``), moved under its section."""
    if mention.group("stem") not in (OLD_CPU_516, OLD_CPU_523):
        return pos, ""
    found = CPU_ITEM_RE.match(line[pos:])
    if not found:
        return pos, ""
    section = "4" if found.group(2).startswith("B") else "3"
    return pos + found.end(), f"{found.group(1)}§{section} {found.group(2)}"


def _renumbered(citation: re.Match, bound: re.Match | None) -> str:
    """The citation's text, with the 0.5.16 CPU study's numbers mapped to docs/cpu.md's."""
    text = citation.group(0)
    if bound is None or bound.group("stem") != OLD_CPU_516:
        return text
    return re.sub(r"(?<=§)\d+(?![\d.])", lambda m: CPU_516_SECTIONS.get(m.group(0), m.group(0)), text)


def rewrite_text(path: str, text: str, headings: dict[str, set[str]]) -> str:
    """The whole file rewritten; unchanged when it has nothing to rewrite. ``headings``: the
    section numbers of each docs/ file, by name (they decide a file's doc when it has no Spec line)."""
    default = main_doc(path, text, headings)
    lines = text.split("\n")
    new_lines, carried = [], None
    for line in lines:
        new_lines.append(rewrite_line(line, carried_into(line, carried), default) if TRIGGER_RE.search(line) else line)
        carried = dangling_mention(line)
    new_text = "\n".join(new_lines)
    if default and _needs_spec_line(path, new_text):
        new_text = add_spec_line(path, new_text, default)
    return new_text


def _needs_spec_line(path: str, text: str) -> bool:
    if check.default_doc(path, text):
        return False
    return any(doc is None for line in text.splitlines() for doc, _ in check.citations(line, None))


def add_spec_line(path: str, text: str, doc: str) -> str:
    """``text`` with a ``Spec: docs/<doc>.md`` line where a reader looks first."""
    lines = text.split("\n")
    if path.endswith(".py"):
        at, line = _after_docstring(text), f"# Spec: docs/{doc}.md"
    elif path.endswith(".md"):
        at = 1 if lines and lines[0].startswith("#") else 0
        line = f"\nSpec: docs/{doc}.md" if at else f"Spec: docs/{doc}.md\n"
    else:
        at = 1 if lines and lines[0].startswith("#!") else 0
        line = f"# Spec: docs/{doc}.md"
    return "\n".join(lines[:at] + [line] + lines[at:])


def _after_docstring(text: str) -> int:
    """Index of the line after the module docstring (after a shebang/encoding line without one)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        body = []
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno
    lines = text.split("\n")
    at = 0
    while at < len(lines) and lines[at].startswith("#"):
        at += 1
    return at


def rewritten_tree(texts: dict[str, str]) -> dict[str, str]:
    """Every file's new text (docs/ and the exempt reference files are left as they are)."""
    headings = check.doc_headings(texts)
    kept = {path for path in texts if path.startswith("docs/") or path in check.EXEMPT_FROM_OUTSIDE}
    return {path: text if path in kept else rewrite_text(path, text, headings) for path, text in texts.items()}


USAGE = "usage: python scripts/rewrite_doc_refs.py [--write] [--diff] [ROOT]  (--help explains)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    flags = {a for a in args if a.startswith("-")}
    rest = [a for a in args if not a.startswith("-")]
    if flags - {"--write", "--diff"} or len(rest) > 1:
        print(USAGE, file=sys.stderr)
        return 2
    root = Path(rest[0]).resolve() if rest else check.ROOT
    before = check.read_texts(root)
    after = rewritten_tree(before)
    changed = sorted(p for p in before if after[p] != before[p])
    for path in changed:
        matcher = difflib.SequenceMatcher(a=before[path].split("\n"), b=after[path].split("\n"), autojunk=False)
        num_lines = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")
        print(f"{'rewrote' if '--write' in flags else 'would rewrite'} {path} ({num_lines} line(s) differ)")
        if "--diff" in flags:
            diff = difflib.unified_diff(before[path].splitlines(), after[path].splitlines(), path, path, lineterm="")
            print("\n".join(diff))
        if "--write" in flags:
            (root / path).write_text(after[path], encoding="utf-8")
    problems = check.check_texts(after)
    for problem in problems:
        print(problem)
    print(f"{len(changed)} file(s); after the rewrite: "
          + (f"{len(problems)} problem(s)" if problems else "doc references ok"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
