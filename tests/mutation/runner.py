"""Run the mutation pass: copy the repository, plant each mutant in the copy, run the tests that
import the mutated module (unit, reference and integration tiers: none starts a server), and
report which mutants survive (``docs/mutation.md``).

The repository itself is never written: every mutant is planted in a copy under ``--workdir``
(one copy per job). Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.mutation.operators import OPERATORS, Mutant, apply, enumerate_mutants

ROOT = Path(__file__).resolve().parents[2]
# What is mutated: packages (every .py file directly in the folder) and single modules. The first
# four were the pass of 2026-12-03; the rest hold the decisions added since (issue 37). Of patches/,
# only the modules that decide something: the rest is SGLang glue that the engine tier tests.
TARGETS = ("policy", "exact_cache", "scr", "eval/accounting",
           "serving", "patches/executor.py", "patches/request_book.py", "patches/exact_tree.py",
           "patches/validation.py", "eval/chaos", "eval/replay/retry.py")
TEST_DIRS = ("tests/unit", "tests/reference", "tests/integration")  # in the order they run; no server in any
# Test files too slow to run once per mutant, and why (they are still run by scripts/test.sh).
SLOW_TESTS = {
    "tests/integration/test_overlay_hooks.py": "starts a fresh SGLang process per scenario (minutes per run)",
}
ENGINE_MODULES = frozenset({"torch", "sglang", "triton"})
COPY_IGNORED = (".venv", ".git", ".artifacts", "runs", "__pycache__", ".hypothesis", ".pytest_cache")
# Small cached test inputs the unit/reference tiers read from .artifacts (built on demand if absent).
ARTIFACT_PATTERNS = ("tiny-model-*", "tiny-tokenizer-*", "scr_reference_distances.json")
ARTIFACT_MAX_BYTES = 8 << 20
PYTEST = ("-m", "pytest", "-x", "-q", "-p", "no:cacheprovider")


@dataclass
class Module:
    name: str  # dotted, e.g. scr.diff
    path: str  # relative to the root, e.g. scr/diff.py
    tests: list[str] = field(default_factory=list)
    skipped: str = ""  # why the module is not mutated
    via: list[str] = field(default_factory=list)  # when no test imports it: the modules the tests reach it by
    engine: list[str] = field(default_factory=list)  # engine packages it imports at import time


def dotted(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` statement names (module level or in a function); for
    ``from pkg import name`` both ``pkg`` and ``pkg.name`` (``name`` may be a submodule); and the
    module named by a string literal in ``pytest.importorskip("...")`` or
    ``importlib.import_module("...")`` (how a test imports a module that needs SGLang)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("importorskip", "import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return found


def engine_imports(source: str) -> list[str]:
    """The engine packages (torch, SGLang, triton) ``source`` imports when it is imported: its
    module-level import statements only (an import inside a function runs when it is called)."""
    tree = ast.parse(source)
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = imported_modules(ast.unparse(ast.Module(body=top, type_ignores=[])))
    return sorted({m.split(".")[0] for m in names} & ENGINE_MODULES)


def importers(root: Path) -> dict[str, set[str]]:
    """dotted name -> imported modules, for every non-test module of the repository."""
    found = {}
    for path in sorted(root.glob("[a-z]*/**/*.py")):
        rel = str(path.relative_to(root))
        if not rel.startswith(("tests/", ".venv/", "runs/")):
            found[dotted(rel)] = imported_modules(path.read_text())
    return found


def test_imports(root: Path) -> dict[str, set[str]]:
    """Test file -> the modules it imports, directly or through a helper module of the test folders
    (a file not named ``test_*``, e.g. ``tests/integration/scr_fake_engine.py``); slow files left out."""
    helpers = {}
    for folder in TEST_DIRS:
        for path in sorted((root / folder).glob("*.py")):
            if not path.name.startswith("test_"):
                helpers[dotted(str(path.relative_to(root)))] = imported_modules(path.read_text())
    tests = {}
    for folder in TEST_DIRS:
        for path in sorted((root / folder).glob("test_*.py")):
            rel = str(path.relative_to(root))
            if rel in SLOW_TESTS:
                continue
            mods = imported_modules(path.read_text())
            for helper in mods & set(helpers):
                mods = mods | helpers[helper]
            tests[rel] = mods
    return tests


def target_files(root: Path, targets: tuple[str, ...]) -> list[Path]:
    """The .py files of ``targets`` (a package folder: its files, not its subpackages; or one file)."""
    files: list[Path] = []
    for target in targets:
        files += [root / target] if target.endswith(".py") else sorted((root / target).glob("*.py"))
    return files


def discover(root: Path, targets: tuple[str, ...] = TARGETS) -> list[Module]:
    """The modules of ``targets`` with the test files importing them. A module that imports torch or
    SGLang when imported is mutated like any other (the pass of 2026-12-03 skipped them): the
    integration tier runs it against SGLang's real objects, without a server."""
    tests = test_imports(root)
    tier = {folder: i for i, folder in enumerate(TEST_DIRS)}
    modules = []
    for path in target_files(root, targets):
        rel = str(path.relative_to(root))
        module = Module(dotted(rel), rel)
        source = path.read_text()
        if not enumerate_mutants(source):
            module.skipped = "no mutable code"
        module.engine = engine_imports(source)
        module.tests = sorted(t for t, mods in tests.items() if module.name in mods)
        if not module.skipped and not module.tests:
            # one hop: the test files that import a repository module importing this one
            module.via = sorted(m for m, mods in importers(root).items() if module.name in mods)
            module.tests = sorted(t for t, mods in tests.items() if mods & set(module.via))
            if not module.tests:
                module.skipped = "no test file imports it"
        # with -x the run stops at the first failure: the module's own test files go first, then
        # the tiers in order (the integration tier imports SGLang: seconds before the first test)
        stem = module.name.rsplit(".", 1)[-1]
        module.tests.sort(key=lambda t: (stem not in Path(t).stem, tier[str(Path(t).parent)], t))
        modules.append(module)
    return modules


def select(mutants: list[Mutant], cap: int | None, seed: int, module: str) -> list[Mutant]:
    if cap is None or len(mutants) <= cap:
        return mutants
    rng = random.Random(f"{seed}:{module}")
    return sorted(rng.sample(mutants, cap), key=lambda m: m.index)


def make_copy(root: Path, target: Path) -> Path:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(root, target, ignore=shutil.ignore_patterns(*COPY_IGNORED), symlinks=True)
    artifacts = root / ".artifacts"
    for pattern in ARTIFACT_PATTERNS:
        for entry in sorted(artifacts.glob(pattern)):
            if entry.name.endswith(".partial"):
                continue
            files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
            if sum(p.stat().st_size for p in files) > ARTIFACT_MAX_BYTES:
                continue
            dest = target / ".artifacts" / entry.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copy2 if entry.is_file() else shutil.copytree)(entry, dest)
    return target


def environment(copy: Path) -> dict[str, str]:
    """The tests' environment in ``copy``. ``PYTHONPATH`` is the copy: the venv's ``.pth`` file
    imports ``patches.cpu.preimport`` at interpreter start (scripts/setup_env.sh), before the
    working folder is on ``sys.path``, and the editable install would resolve ``patches`` (and
    what it imports) to the checkout, so a mutant of ``patches/`` would never be run."""
    env = dict(os.environ)
    env.update(PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(copy))
    return env


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[int | None, float, str]:
    """(exit code or None on timeout, seconds, output tail)."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, *PYTEST, *tests], cwd=copy, env=environment(copy),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, time.monotonic() - start, out[-2000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, time.monotonic() - start, (out or "")[-2000:]


def check_copy_is_imported(copy: Path) -> None:
    """The copy's packages, not the checkout's, are what the tests import."""
    code = ("import sys, policy, scr, exact_cache, serving, patches, eval.chaos as c; "
            "print(*(m.__file__ for name, m in sorted(sys.modules.items()) if name.split('.')[0] in "
            f"{sorted({t.split('/')[0] for t in TARGETS})!r} and getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, env=environment(copy), capture_output=True, text=True,
                         check=True).stdout.split()
    bad = [p for p in out if not Path(p).resolve().is_relative_to(copy.resolve())]
    if bad:
        raise SystemExit(f"the copy at {copy} is shadowed by {bad}: mutants would not be tested")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/mutation_pass.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--modules", nargs="*", help="dotted module names, file paths or package folders "
                                                 f"(default: every module of {', '.join(TARGETS)})")
    p.add_argument("--max-per-module", type=int, default=None, help="sample at most this many mutants per module")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with --max-per-module)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once, one repository copy each")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds per mutant (at least 3x the module's baseline); a timeout counts as killed")
    p.add_argument("--operators", nargs="*", default=list(OPERATORS), choices=OPERATORS)
    p.add_argument("--ids", nargs="*", help="run only these mutants, as module:index (from a results file)")
    p.add_argument("--out", default=str(ROOT / ".artifacts" / "mutation"),
                   help="folder for results.jsonl and report.md")
    p.add_argument("--workdir", default=None, help="where the repository copies go (default: a temp folder)")
    p.add_argument("--list", action="store_true", help="list modules, their tests and mutant counts; run nothing")
    p.add_argument("--render", metavar="RESULTS", help="write report.md from a results.jsonl again; run nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    operators = tuple(args.operators)
    modules = discover(ROOT)
    if args.modules:
        wanted = set()
        for item in args.modules:
            folder = item.rstrip("/")
            if (ROOT / folder).is_dir():  # a package: its modules among the targets'
                wanted |= {m.name for m in modules if str(Path(m.path).parent) == folder}
            else:
                wanted.add(dotted(item) if item.endswith(".py") else item)
        unknown = wanted - {m.name for m in modules}
        if unknown:
            raise SystemExit(f"unknown modules: {sorted(unknown)}")
        modules = [m for m in modules if m.name in wanted]
    ids: dict[str, set[int]] | None = None
    if args.ids:
        ids = {}
        for item in args.ids:
            name, _, index = item.rpartition(":")
            ids.setdefault(name, set()).add(int(index))
        modules = [m for m in modules if m.name in ids]

    plan: list[tuple[Module, list[Mutant], int]] = []
    for module in modules:
        if module.skipped:
            continue
        # numbered over all operators, so that an index means the same mutant with any --operators
        mutants = [m for m in enumerate_mutants((ROOT / module.path).read_text()) if m.operator in operators]
        chosen = select(mutants, args.max_per_module, args.seed, module.name)
        if ids is not None:
            chosen = [m for m in mutants if m.index in ids[module.name]]
        plan.append((module, chosen, len(mutants)))
    if args.render:
        return render_again(Path(args.render), modules, plan, args)
    if args.list:
        for module in modules:
            engine = f"imports {', '.join(module.engine)} at import time" if module.engine else ""
            print(f"{module.name:32} {module.skipped or engine}")
            via = f" (via {', '.join(module.via)})" if module.via else ""
            print(f"{'':32} tests{via}: {' '.join(module.tests) or '-'}")
        for module, chosen, total in plan:
            print(f"{module.name:32} {total:4} mutants, {len(chosen)} chosen")
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="mutation-"))
    copies = [make_copy(ROOT, workdir / f"work-{j}") for j in range(max(1, args.jobs))]
    check_copy_is_imported(copies[0])
    results_path = out / "results.jsonl"
    results: list[dict] = []
    rows: list[dict] = []
    lock = threading.Lock()
    free = list(copies)
    started = time.monotonic()
    total_chosen = sum(len(c) for _, c, _ in plan)
    done = 0

    with results_path.open("w") as sink:
        for module in modules:
            if module.skipped:
                rows.append({"module": module.name, "skipped": module.skipped})
        for module, chosen, total in plan:
            original = (ROOT / module.path).read_text()
            rc, seconds, tail = run_tests(copies[0], module.tests, max(600.0, args.timeout))
            row = {"module": module.name, "total": total, "planted": len(chosen), "tests": module.tests,
                   "via": module.via, "baseline_s": round(seconds, 1)}
            if rc != 0:
                row["skipped"] = f"baseline failed (exit {rc})"
                rows.append(row)
                print(f"[mutation] {module.name}: baseline failed\n{tail}", file=sys.stderr, flush=True)
                continue
            timeout = max(args.timeout, 3 * seconds)

            def one(mutant: Mutant) -> dict:
                with lock:
                    copy = free.pop()
                try:
                    (copy / module.path).write_text(apply(original, mutant))
                    rc, secs, tail = run_tests(copy, module.tests, timeout)
                finally:
                    (copy / module.path).write_text(original)
                    with lock:
                        free.append(copy)
                status = "timeout" if rc is None else ("survived" if rc == 0 else "killed")
                return {"module": module.name, "path": module.path, **mutant.to_dict(), "status": status,
                        "exit": rc, "seconds": round(secs, 2), "tests": module.tests,
                        "source": original.splitlines()[mutant.line - 1].strip()}

            with ThreadPoolExecutor(max_workers=len(copies)) as pool:
                for result in pool.map(one, chosen):
                    results.append(result)
                    sink.write(json.dumps(result) + "\n")
                    sink.flush()
                    done += 1
                    print(f"[mutation] {done}/{total_chosen} {result['status']:8} {module.path}:{result['line']} "
                          f"{result['operator']} {result['original']} -> {result['mutated']}",
                          file=sys.stderr, flush=True)
            counts = {s: sum(1 for r in results if r["module"] == module.name and r["status"] == s)
                      for s in ("killed", "survived", "timeout")}
            rows.append({**row, **counts})
    report = render(rows, results, args, time.monotonic() - started)
    (out / "report.md").write_text(report)
    print(report)
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def render_again(path: Path, modules: list[Module], plan: list, args: argparse.Namespace) -> int:
    """The report of an earlier run (its results file), with the current sources' lines."""
    results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    current = {}  # the texts as the current operators write them (indices are unchanged)
    for module in {r["module"]: r["path"] for r in results}.items():
        current[module[0]] = {m.index: m for m in enumerate_mutants((ROOT / module[1]).read_text())}
    for result in results:
        mutant = current[result["module"]].get(result["index"])
        if mutant is not None and (mutant.line, mutant.operator) == (result["line"], result["operator"]):
            result["original"], result["mutated"] = mutant.original, mutant.mutated
    for result in results:
        if "source" not in result:
            result["source"] = (ROOT / result["path"]).read_text().splitlines()[result["line"] - 1].strip()
    totals = {module.name: total for module, _, total in plan}
    rows = [{"module": m.name, "skipped": m.skipped} for m in modules if m.skipped]
    for name in sorted({r["module"] for r in results}):
        mine = [r for r in results if r["module"] == name]
        rows.append({"module": name, "total": totals.get(name, len(mine)), "planted": len(mine),
                     "via": next((m.via for m in modules if m.name == name), []),
                     **{s: sum(1 for r in mine if r["status"] == s) for s in ("killed", "survived", "timeout")}})
    report = render(rows, results, args, 0.0)
    (path.parent / "report.md").write_text(report)
    print(report)
    return 0


def render(rows: list[dict], results: list[dict], args: argparse.Namespace, seconds: float) -> str:
    took = f", {seconds / 60:.0f} min" if seconds else ""
    lines = [f"Mutation pass: seed {args.seed}, max per module {args.max_per_module or 'all'}, "
             f"operators {' '.join(args.operators)}{took}.", "",
             "| module | mutants | planted | killed | survived | timed out | score |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    totals = dict.fromkeys(("total", "planted", "killed", "survived", "timeout"), 0)
    for row in sorted(rows, key=lambda r: r["module"]):
        if "killed" not in row:
            lines.append(f"| {row['module']} | {row.get('total', '')} | not run: {row['skipped']} | | | | |")
            continue
        for key in totals:
            totals[key] += row[key]
        dead = row["killed"] + row["timeout"]
        score = f"{100 * dead / row['planted']:.0f}%" if row["planted"] else "-"
        via = f" (tests via {', '.join(row['via'])})" if row.get("via") else ""
        lines.append(f"| {row['module']}{via} | {row['total']} | {row['planted']} | {row['killed']} "
                     f"| {row['survived']} | {row['timeout']} | {score} |")
    dead = totals["killed"] + totals["timeout"]
    score = f"{100 * dead / totals['planted']:.0f}%" if totals["planted"] else "-"
    lines.append(f"| **total** | {totals['total']} | {totals['planted']} | {totals['killed']} | {totals['survived']} "
                 f"| {totals['timeout']} | {score} |")
    survivors = [r for r in results if r["status"] == "survived"]
    lines += ["", f"Survivors ({len(survivors)}):", ""]
    for r in survivors:
        lines.append(f"- `{r['path']}:{r['line']}:{r['col']}` {r['module']}:{r['index']} ({r['function']}) "
                     f"{r['operator']}: `{_md(r['original'])}` -> `{_md(r['mutated'])}` "
                     f"in `{_md(r.get('source', ''))}`")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return " ".join(text.split()).replace("`", "'").replace("|", "\\|").replace("\u00a7", "S")
