"""The landing page keeps its promises (issue 24, point 6).

``README.md`` is the landing page; the manual it used to be lives in ``docs/`` (serving, accounting,
soak, benchmark, cluster). Checked here, from the text alone plus one ``--help`` per command:

* every relative markdown link in the README and in those five pages points at a file that exists
  (``#anchors`` into a markdown file must name one of its headings, GitHub's slug rules);
* the README's map of ``docs/`` lists every ``docs/*.md``;
* every command shown in a fenced ``bash`` block of those pages (``python -m MODULE`` and
  ``scripts/X``) still runs: ``--help`` exits 0 within 60 s. The README must keep showing its two
  commands (``./scripts/demo.sh``, ``./scripts/test.sh``).

Shell scripts: none of ``scripts/*.sh`` has a ``--help`` of its own (see ``SCRIPTS``). ``demo.sh``,
``bench.sh`` and ``test.sh`` run ``scripts/setup_env.sh`` (an install when anything changed)
before they exec a python entry point, so the test checks that each script still execs the module
named here and runs that module's ``--help``. ``gpu_check.sh`` installs nothing and passes its
arguments to ``python -m eval.gpu_check``: it is run itself. ``setup_env.sh`` has no help at all;
its dry run (``SETUP_ENV_DRY_RUN=1``: the checks only, nothing installed) stands in, in CPU mode,
since GPU mode needs ``nvidia-smi``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MOVED = tuple(ROOT / "docs" / f"{name}.md" for name in ("serving", "accounting", "soak", "benchmark", "cluster"))
PAGES = (README, *MOVED)
TIMEOUT_S = 60

# script name -> how to check it runs: ("module", M) = the script execs `python -m M` after the
# set-up, test M's --help; ("self", args, env) = run the script itself with these args and env.
SCRIPTS: dict[str, tuple] = {
    "demo.sh": ("module", "eval.demo"),
    "bench.sh": ("module", "eval.bench_policies"),
    "test.sh": ("module", "pytest"),
    "gpu_check.sh": ("self", ["--help"], {}),
    "setup_env.sh": ("self", [], {"SETUP_ENV_DRY_RUN": "1", "GPU": "0"}),
}

FENCE_RE = re.compile(r"^```([\w-]*)\s*$")
LINK_RE = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE_RE = re.compile(r"`[^`]*`")
PYTHON_RE = re.compile(r"(?:^|/)python(?:3(?:\.\d+)?)?$")
SCRIPT_RE = re.compile(r"^(?:\./)?scripts/([\w.-]+)$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SUBCOMMAND_RE = re.compile(r"^[a-z][a-z_-]*$")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(the lines outside fenced blocks, [(language, lines) for each fenced block])."""
    prose, blocks, current = [], [], None
    for line in text.splitlines():
        fence = FENCE_RE.match(line.strip())
        if current is None and fence:
            current = (fence.group(1).lower(), [])
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current[1].append(line)
        else:
            prose.append(line)
    assert current is None, "unclosed code fence"
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_fences(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def links(path: Path) -> list[str]:
    """Every link target in the page's prose (fenced blocks skipped, links inside `code` too)."""
    prose, _ = split_fences(path.read_text())
    targets = []
    for line in prose:
        # A link whose text is code is a link; code that contains brackets is not.
        masked = INLINE_CODE_RE.sub(lambda m: m.group(0) if "](" not in m.group(0) else "``", line)
        targets.extend(m.group(1) for m in LINK_RE.finditer(masked))
    return targets


def relative_links() -> list[tuple[Path, str]]:
    """(page, target) for each distinct relative link of each page (http(s):, mailto: ... skipped)."""
    return [
        (page, target)
        for page in PAGES
        for target in dict.fromkeys(links(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)
    ]


def commands(path: Path) -> list[list[str]]:
    """argv of every command line in the page's fenced bash/sh blocks (continuations joined)."""
    _, blocks = split_fences(path.read_text())
    found = []
    for language, lines in blocks:
        if language not in ("bash", "sh", "shell", "console"):
            continue
        joined, pending = [], ""
        for line in lines:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            joined.append(pending + line)
            pending = ""
        for line in joined:
            argv = shlex.split(line.lstrip("$ "), comments=True)
            while argv and ENV_RE.match(argv[0]):
                argv.pop(0)
            if argv:
                found.append(argv)
    return found


def check_of(argv: list[str]) -> tuple[str, tuple]:
    """(a readable id, what to run) for one shown command; unknown kinds fail the test."""
    if PYTHON_RE.search(argv[0]) and len(argv) > 2 and argv[1] == "-m":
        module, rest = argv[2], argv[3:]
        sub = [rest[0]] if rest and SUBCOMMAND_RE.match(rest[0]) else []
        return " ".join(["python -m", module, *sub]), ("module", module, tuple(sub))
    script = SCRIPT_RE.match(argv[0])
    if script:
        return f"scripts/{script.group(1)}", ("script", script.group(1))
    return " ".join(argv[:2]), ("unknown", tuple(argv))


def shown_checks() -> dict[str, tuple]:
    checks = {}
    for page in PAGES:
        for argv in commands(page):
            name, check = check_of(argv)
            checks.setdefault(name, check)
    return checks


CHECKS = shown_checks()


def run(argv: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **(extra_env or {}))
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def assert_ran(result: subprocess.CompletedProcess, what: str) -> None:
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
    )


@pytest.mark.parametrize("page, target", relative_links(), ids=lambda v: rel(v) if isinstance(v, Path) else v)
def test_relative_link_resolves(page: Path, target: str):
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    assert destination.exists(), f"{rel(page)} links to {target!r}: {destination} does not exist"
    assert destination.is_relative_to(ROOT), f"{rel(page)} links outside the repository: {target!r}"
    if anchor and destination.suffix == ".md":
        assert anchor in anchors(destination), (
            f"{rel(page)} links to {target!r}: {rel(destination)} has no heading with anchor #{anchor}"
        )


def test_pages_exist_and_link_somewhere():
    for page in PAGES:
        assert page.is_file(), f"{rel(page)} is missing"
    assert len(relative_links()) >= 20, "the link check found almost no links: is the parser broken?"


def test_readme_maps_every_doc():
    targets = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    unmapped = [rel(doc) for doc in sorted((ROOT / "docs").glob("*.md")) if doc.resolve() not in targets]
    assert unmapped == [], f"README.md's map of docs/ does not link {unmapped}"


def test_readme_shows_the_two_commands():
    shown = {check_of(argv)[0] for argv in commands(README)}
    assert {"scripts/demo.sh", "scripts/test.sh"} <= shown, f"README.md's commands: {sorted(shown)}"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_shown_command_runs(name: str):
    check = CHECKS[name]
    kind = check[0]
    assert kind != "unknown", f"{name!r}: a command this test does not know how to check; add it here"
    if kind == "module":
        _, module, sub = check
        assert_ran(run([sys.executable, "-m", module, *sub, "--help"]), f"python -m {' '.join((module, *sub))} --help")
        return
    script_name = check[1]
    script = ROOT / "scripts" / script_name
    assert script.is_file() and os.access(script, os.X_OK), f"{rel(script)} is missing or not executable"
    assert script_name in SCRIPTS, f"scripts/{script_name}: say in SCRIPTS how to check it runs"
    how = SCRIPTS[script_name]
    if how[0] == "module":
        module = how[1]
        assert re.search(rf"-m {re.escape(module)}\b", script.read_text()), (
            f"{rel(script)} no longer runs `python -m {module}`; update SCRIPTS"
        )
        assert_ran(run([sys.executable, "-m", module, "--help"]), f"python -m {module} --help (for {rel(script)})")
        return
    _, args, env = how
    if sys.prefix != sys.base_prefix:  # the venv running the tests is the one the scripts use
        env = {"VENV": sys.prefix, **env}
    assert_ran(run([str(script), *args], env), f"{rel(script)} {' '.join(args)}".strip())
