"""The demo: a short multi-turn conversation with an edit in the middle, served by the patched
server on the tiny model under each cache policy, and what the prefix cache did side by side.

``python -m eval.demo [--policies radix,exact,scr] [--out DIR] [--model DIR]`` (``scripts/demo.sh``
runs it after set-up; every policy in ``POLICIES`` by default, one server after the other).
The conversation is agent-like: a long first message with several sections, a turn that only
appends, a turn where the agent deletes a section from the middle of its context, and a final
append. It is sent through the workload driver (``eval.workload.run`` with ``DEMO_SCRIPT``); each
policy's server log, events file and ``client.jsonl`` are ingested (``eval.report ingest --log
--events --client``, all checks) and the runs compared (``eval.report compare``). Per request the
first table shows prompt = reused (prefix cache) + moved + read; the second is the comparison.

Layout under ``--out``: ``<policy>/{server.log, events.jsonl, server_trace.jsonl, trace.jsonl,
client.jsonl, report/}`` (``server_trace.jsonl``: the server's ``--cache-trace``; ``trace.jsonl``: the
conversation as a replayable trace, ``eval/traces/format.py``) and
``compare/{table.md, table.csv, table.json, provenance_stack.png, read_cdf.png}``. A policy that
``policy/registry.py`` does not know (or cannot import) stops the demo before any server starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval import report, workload
from eval.accounting import compare
from eval.cli_types import Parser, existing_dir, name_list
from eval.server import ServerProcess, wait_for_events
from eval.tiny_model import cached_build
from policy import registry

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = [
    "## Task\nFind which configuration change made the nightly build slower and propose a fix.",
    "## Notes from yesterday\n" + " ".join([
        "The cache directory moved to a network disk.", "Two workers were added.", "The linker flags did not change.",
        "The test shards were rebalanced by file size.", "The nightly job now starts at 02:00 instead of 01:00.",
        "Disk usage on the build host is at 71 percent.", "The compiler cache hit rate was 93 percent last week."]),
    "## Constraints\nDo not change the compiler version. Keep the total build under ten minutes.",
    "## Build log excerpt\n" + "\n".join(
        f"step {i:02d}: compiled module_{i} in {0.4 + 0.13 * (i % 5):.2f}s, cache {'hit' if i % 3 else 'miss'}"
        for i in range(1, 9)
    ),
    "## Test report\n" + "\n".join(
        f"shard {i:02d}: {40 + 7 * (i % 4)} tests passed in {12 + 3 * (i % 5)}s on worker {i % 3}"
        for i in range(1, 13)
    ),
]
DELETED = 3  # the build log: deleted from the middle of the context at turn 3

POLICIES = ("radix", "exact", "scr")
SERVER_ARGS = ["--max-total-tokens", "8192", "--max-mamba-cache-size", "64",
               "--chunked-prefill-size", "64", "--max-running-requests", "2",
               # Finish: lines for the log ingestion; no warm-up request (it would be a server row
               # without a client request, which the join check C1 rejects).
               "--log-requests", "--log-requests-level", "0", "--skip-server-warmup"]
# Per-policy launcher arguments, scaled to the tiny model's short prompts (exact: B must equal
# the chunk size above).
POLICY_ARGS = {
    "radix": [],
    "exact": ["--cache-policy-set", "piece_tokens=64", "--cache-policy-set", "retain_every=256"],
    # Sessions match on a 256-token common prefix (the authors' 1,024 is longer than these prompts).
    # side_sessions = max_sessions: the fidelity run after the conversation opens a dozen sessions.
    "scr": ["--cache-policy-set", "match_min_tokens=256", "--cache-policy-set", "side_sessions=16",
            "--cache-policy-set", "side_tokens=4096"],
}
MAX_TOKENS = 12


def conversation_turns():
    """(label, kind, messages) for each request; kind says how the prompt changed."""
    system = {"role": "system", "content": "You are a careful build engineer. Answer briefly."}
    user = {"role": "user", "content": "\n\n".join(SECTIONS)}
    yield "turn 1", "first", [system, user]
    reply = {"role": "assistant", "content": "The cache misses line up with the moved cache directory."}
    follow = {"role": "user", "content": "Which steps missed the cache?"}
    yield "turn 2", "append", [system, user, reply, follow]
    # The agent edits its context: the build log is deleted from the middle; the test report
    # after it is unchanged (what scr can move instead of reading again).
    edited_user = {"role": "user", "content": "\n\n".join(SECTIONS[:DELETED] + SECTIONS[DELETED + 1:])}
    reply2 = {"role": "assistant", "content": "Steps 3 and 6 missed."}
    yield "turn 3", "edited", [system, edited_user, reply, follow, reply2,
                               {"role": "user", "content": "Summarise the cause in one line."}]
    reply3 = {"role": "assistant", "content": "The cache moved to a slow network disk."}
    yield "turn 4", "append", [system, edited_user, reply, follow, reply2,
                               {"role": "user", "content": "Summarise the cause in one line."}, reply3,
                               {"role": "user", "content": "And the fix?"}]


DEMO_SCRIPT = workload.Script(
    kinds=("first", "append", "edited", "append"),
    messages=lambda conversation, turn, replies: list(conversation_turns())[turn][2],
)


def format_table(rows_by_policy: dict[str, list[dict]]) -> str:
    """One line per request; for each policy: reused (prefix cache) / moved / read, and seconds."""
    policies = list(rows_by_policy)
    first = rows_by_policy[policies[0]]
    head = f"{'request':<8} {'prompt change':<14} {'prompt':>6}"
    sub = " " * len(head)
    for policy in policies:
        head += f" | {policy:^29}"
        sub += f" | {'reused':>6} {'moved':>5} {'read':>5} {'seconds':>9}"
    lines = [head, sub, "-" * len(sub)]
    for index, row in enumerate(first):
        line = f"{row['label']:<8} {row['kind']:<14} {row['prompt_tokens']:>6}"
        for policy in policies:
            cell = rows_by_policy[policy][index]
            line += f" | {cell['prefix_reused']:>6} {cell['moved']:>5} {cell['read']:>5} {cell['seconds']:>9.2f}"
        lines.append(line)
    return "\n".join(line.rstrip() for line in lines)


def unavailable(policy: str) -> str | None:
    """Why ``policy`` cannot be served (not registered, or its implementation does not import), or None."""
    if policy not in registry.names():
        return f"policy {policy!r} is not registered in policy/registry.py (registered: {', '.join(registry.names())})"
    try:
        registry.policy_class(policy)
    except Exception as exc:  # any import failure of an in-progress policy
        return f"policy {policy!r} is registered but does not import: {type(exc).__name__}: {exc}"
    return None


def run(model_dir: Path, out_dir: Path, policy: str = "radix", max_tokens: int = MAX_TOKENS) -> dict:
    """Serve ``policy``, send the demo conversation through the workload driver, ingest the run.

    Returns ``{"rows": [...], "report": DIR, "failures": [...]}``; a row per request has its
    label, kind, rid, seconds and the ingested prompt/prefix_reused/moved/read/decode/class.
    """
    run_dir = out_dir / policy
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: run_dir / name
             for name in ("server.log", "events.jsonl", "server_trace.jsonl", "trace.jsonl", "client.jsonl")}
    for path in paths.values():
        path.unlink(missing_ok=True)
    server = ServerProcess(
        model_path=str(model_dir), log_path=paths["server.log"],
        extra_args=[*SERVER_ARGS, "--cache-policy", policy, *POLICY_ARGS.get(policy, []),
                    "--cache-events", str(paths["events.jsonl"]),
                    "--cache-trace", str(paths["server_trace.jsonl"])],
    )
    print(f"[demo] starting the patched server (policy {policy}) on {model_dir.name}; log: {server.log_path}",
          flush=True)
    with server:
        records = workload.run(server.post, run_dir, conversations=1, max_tokens=max_tokens,
                               run_name=f"demo-{policy}", progress=False, script=DEMO_SCRIPT,
                               extra={"ignore_eos": True})
        for record in records:
            print(f"[demo] turn {record['turn'] + 1} ({record['kind']}) done in {record['seconds']:.1f}s", flush=True)
        wait_for_events(paths["events.jsonl"], [record["rid"] for record in records])
        workload.write_run_trace(records, paths["server_trace.jsonl"], run_dir)
        # Ingested before anything else is sent: the join check wants only the workload's requests.
        ingested, failures = report.ingest(paths["events.jsonl"], run_dir / "report", log_path=paths["server.log"],
                                           client_path=paths["client.jsonl"], policy=policy)
        fidelity_summary = run_demo_fidelity(server.url, run_dir / "fidelity", paths["events.jsonl"]) \
            if policy == "scr" else None
    fatal = server.fatal_lines()
    if fatal:
        raise RuntimeError("server reported errors:\n" + "\n".join(fatal))
    by_rid = {row.rid: row for row in ingested}
    rows = []
    for record in records:
        row = by_rid.get(record["rid"])
        if row is None:
            raise RuntimeError(f"no Finish line for {record['rid']} in {paths['server.log']}")
        rows.append({"label": f"turn {record['turn'] + 1}", "kind": record["kind"], "rid": record["rid"],
                     "seconds": record["seconds"], "prompt_tokens": row.prompt_tokens,
                     "prefix_reused": row.prefix_reused, "moved": row.moved, "read": row.read,
                     "decode": row.decode, "class": row.klass})
    if fidelity_summary is not None:
        failures = [*failures, *(f"fidelity: {c}" for c in fidelity_summary.get("checks_failed", []))]
    return {"rows": rows, "report": run_dir / "report", "failures": failures, "fidelity": fidelity_summary}


# The edited turn of the fidelity check: a 1,000-token conversation whose second turn deletes
# [500, 700) and appends 40 tokens (sessions match on 256 common tokens here), under the three arms.
FIDELITY_SPEC = {"scenarios": [{"name": "demo-edit", "seed": 7, "first": 1000,
                                "edits": [{"delete": [[500, 700]], "append": 40}]}]}


def run_demo_fidelity(url: str, out_dir: Path, events: Path) -> dict:
    """``python -m eval.fidelity`` on the scr server: the edited turn served by scr vs read cold."""
    from eval.fidelity import run_fidelity
    from eval.fidelity.scenarios import parse_spec

    print("[demo] fidelity: the edited turn under scr (fork, none, no re-rotation) vs a cold read", flush=True)
    return run_fidelity(url, out_dir, scenarios=parse_spec(FIDELITY_SPEC, "eval.demo"), events_path=events,
                        tokens=16, top=20)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m eval.demo", description=" ".join(__doc__.split("\n\n")[0].split()) +
                    "\n\nExit status: 0 every check passed, 1 a check failed, 2 a usage error (or a policy the "
                    "registry does not know).")
    parser.add_argument("--policies", type=name_list(POLICIES), default=None, metavar="LIST",
                        help=f"comma-separated policies to run, in order (default: {','.join(POLICIES)})")
    parser.add_argument("--policy", action="append", choices=POLICIES, help=argparse.SUPPRESS)  # older spelling
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "demo", metavar="DIR",
                        help="output directory")
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: build the tiny model, once, under .artifacts)")
    args = parser.parse_args(argv)
    policies = list(args.policies or args.policy or POLICIES)
    problems = [reason for reason in map(unavailable, policies) if reason]
    if problems:
        # A side-by-side table missing a column would be read as complete: refuse instead.
        for reason in problems:
            print(f"[demo] error: {reason}", file=sys.stderr)
        return 2
    model_dir = args.model or cached_build(ROOT / ".artifacts")
    results = {policy: run(model_dir, args.out, policy) for policy in policies}
    comparison = compare.compare({p: r["report"] for p, r in results.items()}, args.out / "compare")
    print()
    print("What the prefix cache did per request (prompt = reused + moved + read; read = run through the model):")
    print(format_table({p: r["rows"] for p, r in results.items()}))
    print()
    print(f"Side by side (python -m eval.report compare; PFLOPs as if the model were Qwen3.6-27B; "
          f"ratios to {comparison['baseline']}):")
    print(comparison["markdown"])
    fidelity = results.get("scr", {}).get("fidelity")
    if fidelity is not None:
        print()
        print("How far scr's answers are from a cold read of the same prompt (python -m eval.fidelity):")
        print(fidelity["markdown"] if "markdown" in fidelity else (args.out / "scr" / "fidelity" / "table.md").read_text())
    print(f"\nFiles: {args.out}/<policy>/report/requests.csv, {args.out / 'compare'}/table.md and plots")
    failed = False
    for policy, result in results.items():
        for failure in result["failures"]:
            print(f"[demo] CHECK FAILED [{policy}] {failure}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
