"""``python -m eval.chaos``: see ``eval/chaos/__init__.py``."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from eval.cli_types import Parser, existing_dir, int_at_least, name_list, run_main, usage

PROG = "python -m eval.chaos"
ROOT = Path(__file__).resolve().parents[2]
SETUPS = ("alone", "router")


def parser() -> Parser:
    p = Parser(prog=PROG, description=(
        "Replay an editing trace through one server or the router with two workers while faults hit it (a "
        "full disk under the events file, a server killed between turns and restarted with a shrunk KV pool, "
        "a worker killed with a call in flight and restarted), then check that every call was answered "
        "once, every event is true and none is lost or doubled, exact still equals its replay and a cold "
        "read, scr relocates only rows it has. Loopback only; stops by itself. Writes OUT/chaos.json and "
        "OUT/table.md. The tiny model is random: the run tests the machinery, not quality.\n\n"
        "Exit status: 0 every check passed, 1 a check failed, 2 a usage error."))
    p.add_argument("--policies", type=name_list(("radix", "exact", "scr")), default="radix,exact,scr", metavar="LIST")
    p.add_argument("--setups", type=name_list(SETUPS), default="alone,router", metavar="LIST",
                   help="alone: one server (disk full, restart, shrunk pool); router: 2 workers (kill, restart)")
    p.add_argument("--conversations", type=int_at_least(2), default=4, metavar="N")
    p.add_argument("--turns", type=int_at_least(3), default=6, metavar="N", help="turns per conversation")
    p.add_argument("--seed", type=int, default=0, metavar="S")
    p.add_argument("--lost-writes", type=int_at_least(1), default=2, metavar="N",
                   help="alone: event writes the full disk takes before it is freed")
    p.add_argument("--no-mount", action="store_true",
                   help="inject ENOSPC in the events writer instead of mounting a small tmpfs")
    p.add_argument("--model", type=existing_dir, default=None, metavar="DIR", help="model directory (default: the tiny model)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "chaos", metavar="DIR")
    return p


def table(results: dict[str, dict]) -> str:
    from eval.chaos.checks import CHECKS

    names = list(results)
    lines = ["| check | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for check in CHECKS:
        lines.append(f"| {check} | " + " | ".join(results[n]["verdicts"][check]["cell"] for n in names) + " |")
    lines.append("| calls retried | " + " | ".join(str(len(results[n]["notes"].get("retried", {}))) for n in names) + " |")
    lines.append("| disk | " + " | ".join(results[n]["notes"].get("disk", "-") for n in names) + " |")
    lines.append("| scr evict-then-retry lines | " + " | ".join(
        str(results[n]["evict_retries"]) if n.startswith("scr") else "" for n in names) + " |")
    lines.append("| wall time, s | " + " | ".join(f"{results[n]['seconds']:.0f}" for n in names) + " |")
    return "\n".join(lines)


def run_one(policy: str, setup: str, calls, args, model: Path) -> dict:
    from eval.chaos.judge import judge
    from eval.chaos.run import Plan, run_alone, run_router

    out = args.out / f"{policy}-{setup}"
    plan = Plan.for_turns(args.turns, lost=args.lost_writes)
    started = time.monotonic()
    print(f"{PROG}: {policy} {setup}", file=sys.stderr, flush=True)
    record = (run_alone(policy, calls, out, model, plan, not args.no_mount) if setup == "alone"
              else run_router(policy, calls, out, model, plan))
    error = record.notes.get("error")
    notes = record.save()
    verdicts = judge(record, calls, error)
    from eval.chaos.judge import evict_retries

    result = {"notes": notes, "seconds": round(time.monotonic() - started, 1), "evict_retries": evict_retries(record.logs),
              "verdicts": {k: {"ok": v.ok, "cell": v.cell, "detail": v.detail} for k, v in verdicts.items()}}
    for name, v in verdicts.items():
        print(f"{PROG}: {policy} {setup}: {name}: {v.cell} ({v.detail})", file=sys.stderr, flush=True)
    return result


def main_body(args) -> int:
    from eval.chaos.trace import chaos_trace
    from eval.tiny_model import cached_build

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    calls = chaos_trace(args.conversations, args.turns, args.seed)
    model = args.model or cached_build(ROOT / ".artifacts")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {f"{p} {s}": run_one(p, s, calls, args, model) for s in args.setups for p in args.policies}
    text = table(results)
    (args.out / "table.md").write_text(text + "\n")
    (args.out / "chaos.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)
    failed = [f"{n}: {k}" for n, r in results.items() for k, v in r["verdicts"].items() if v["ok"] is False]
    for line in failed:
        print(f"{PROG}: CHECK FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_main(PROG, lambda: main_body(args), usage(OSError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
