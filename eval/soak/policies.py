"""``python -m eval.soak.policies``: the soak of every policy on the tiny model, one server at a time.

Starts ``python -m patches.launch_server`` on the tiny built-in model (or ``--model``) for each
policy in turn with the settings below (SGLang's strict idle leak check on, ``--cache-events``),
runs :func:`eval.soak.run_soak` against it, stops it, and prints one table row per policy. This is
how the soak numbers of docs/soak.md are produced; ``tests/engine/test_soak.py`` runs the same servers
with a short load bounded by its request count (no time window: the same quotas on any machine).

Run it alone on the machine: an idle SGLang scheduler busy-polls a core, so anything else running
beside it changes the wall times it prints (the checks themselves do not depend on speed).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eval.server import ServerProcess
from eval.soak import format_table, run_soak

PROG = "python -m eval.soak.policies"
STRICT_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}
COMMON_ARGS = ["--max-total-tokens", "12288", "--max-running-requests", "4", "--max-mamba-cache-size", "32"]
# Prompts of the soak's conversations reach 2,500 tokens: 256-token prefill chunks (radix, scr),
# 128-token pieces and a retained state every 512 tokens (exact), room for 16 scr sessions.
POLICY_ARGS: dict[str, list[str]] = {
    "radix": ["--cache-policy", "radix", "--chunked-prefill-size", "256"],
    "exact": ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=128",
              "--cache-policy-set", "retain_every=512"],
    "scr": ["--cache-policy", "scr", "--chunked-prefill-size", "256",
            "--cache-policy-set", "side_sessions=16", "--cache-policy-set", "side_tokens=4096"],
}


def server_args(policy: str, events: Path) -> list[str]:
    """Launcher arguments of ``policy``'s soak server (after ``--model-path``/``--host``/``--port``)."""
    return [*COMMON_ARGS, *POLICY_ARGS[policy], "--cache-events", str(events)]


def soak_policy(model_dir: Path, out: Path, policy: str, **soak) -> dict:
    """Start ``policy``'s server, soak it, stop it; the report has ``startup_s`` added."""
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events.jsonl"
    events.unlink(missing_ok=True)
    started = time.monotonic()
    server = ServerProcess(model_path=str(model_dir), log_path=out / "server.log",
                           extra_args=server_args(policy, events), env=STRICT_ENV).start()
    startup_s = time.monotonic() - started
    try:
        report = run_soak(server.url, out, events=events, log=server.log_path, policy=policy,
                          admin_key=server.admin_key, **soak)
    finally:
        server.stop()
    report["startup_s"] = round(startup_s, 1)
    return report


def summary_row(policy: str, report: dict) -> dict:
    """The columns of docs/soak.md's table for one policy."""
    counts = report["counts"]
    failed = [name for name, check in report["checks"].items() if check["status"] == "fail"]
    safety = report.get("safety") or {}
    fuzz = (safety.get("fuzz") or {}).get("summary") or {}
    bomb = safety.get("bomb") or {}
    return {"policy": policy, "sent": counts["sent"], "ok": counts["ok"], "aborted": counts["aborted"],
            "malformed": counts["malformed"], "4xx": counts["4xx"], "5xx": counts["5xx"],
            "no_status": counts["no_status"],
            "fuzz": f"{fuzz.get('refused_4xx', 0)}/{fuzz.get('refused_by_schema', 0)}+{fuzz.get('accepted_by_schema', 0)}"
            if fuzz else "-",
            "fuzz_5xx": fuzz.get("5xx", "-"), "bomb_x": bomb.get("bomb_over_plain", "-"),
            "bounds_x": (safety.get("bounds") or {}).get("latency_ratio", "-"),
            "namespaces": report["checks"].get("namespaces", {}).get("status", "-"),
            "load_s": report["load_s"], "wall_s": report["wall_s"],
            "result": "PASS" if report["passed"] else "FAIL " + ",".join(failed)}


def format_summary(rows: list[dict]) -> str:
    columns = ["policy", "sent", "ok", "aborted", "malformed", "4xx", "5xx", "no_status", "fuzz", "fuzz_5xx",
               "bomb_x", "bounds_x", "namespaces", "load_s", "wall_s", "result"]
    lines = ["  ".join(f"{c:>9}" for c in columns)]
    lines += ["  ".join(f"{row[c]!s:>9}" for c in columns) for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, existing_dir, int_at_least, name_list, positive_number
    from eval.tiny_model import cached_build

    root = Path(__file__).resolve().parents[2]
    parser = Parser(prog=PROG, description=(
        "The soak (python -m eval.soak) of every policy on the tiny model, one server at a time: start "
        "python -m patches.launch_server with the policy's settings (POLICY_ARGS in eval/soak/policies.py; SGLang's "
        "strict idle leak check on), run the soak against it, stop it, print one table row per policy. Run it alone "
        "on the machine: an idle SGLang scheduler busy-polls a core, so anything beside it changes the wall times "
        "(the checks do not depend on speed).\n\nExit status: 0 every policy passed, 1 a check failed, "
        "2 a usage error."))
    parser.add_argument("--out", type=Path, default=root / "runs" / "soak", metavar="DIR",
                        help="output directory, one folder per policy")
    parser.add_argument("--policies", type=name_list(tuple(POLICY_ARGS)), default=",".join(POLICY_ARGS), metavar="LIST",
                        help="comma-separated policies")
    parser.add_argument("--requests", type=int_at_least(1), default=1000, metavar="N", help="load requests per policy")
    parser.add_argument("--minutes", type=positive_number, default=None,
                        help="an upper bound on each policy's load phase (default: none, the load is --requests "
                        "requests whatever the machine's speed)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the load")
    parser.add_argument("--concurrency", type=int_at_least(1), default=4, metavar="N", help="parallel conversations")
    parser.add_argument("--tenants", type=int_at_least(1), default=4, metavar="N", help="salts in use")
    parser.add_argument("--exact-sample", type=int_at_least(0), default=8, metavar="N",
                        help="exact: cached answers compared bit for bit with cold ones")
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the tiny model, built once under .artifacts)")
    args = parser.parse_args(argv)
    policies = args.policies
    model_dir = args.model or cached_build(root / ".artifacts")
    rows = []
    for policy in policies:
        report = soak_policy(model_dir, args.out / policy, policy, requests=args.requests, minutes=args.minutes,
                             seed=args.seed, concurrency=args.concurrency, tenants=args.tenants,
                             exact_sample=args.exact_sample, malformed="all")
        print(format_table(report), flush=True)
        rows.append(summary_row(policy, report))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(format_summary(rows))
    print(f"-> {args.out / 'summary.json'}")
    return 0 if all(row["result"] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
