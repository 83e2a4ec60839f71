"""The demo: a short multi-turn conversation with an edit in the middle, served by the patched
server on the tiny model, and a table of what the prefix cache did for each request.

``python -m eval.demo [--policy radix --policy exact] [--out DIR]`` (``scripts/demo.sh`` runs it
after set-up; both policies by default, one server after the other, then one side-by-side table).
The conversation is agent-like: a long first message with several sections, a turn that only
appends, a turn where the agent deletes a section from the middle of its context, and a final
append. Per request the table shows prompt = reused (prefix cache) + moved + read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eval.server import ServerProcess, wait_for_events
from eval.tiny_model import cached_build

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = [
    "## Task\nFind which configuration change made the nightly build slower and propose a fix.",
    "## Build log excerpt\n" + "\n".join(
        f"step {i:02d}: compiled module_{i} in {0.4 + 0.13 * (i % 5):.2f}s, cache {'hit' if i % 3 else 'miss'}"
        for i in range(1, 19)
    ),
    "## Notes from yesterday\nThe cache directory moved to a network disk. Two workers were added. "
    "The linker flags did not change. The test shards were rebalanced by file size.",
    "## Constraints\nDo not change the compiler version. Keep the total build under ten minutes.",
]

SERVER_ARGS = ["--max-total-tokens", "8192", "--max-mamba-cache-size", "64",
               "--chunked-prefill-size", "64", "--max-running-requests", "2"]
# Policy settings scaled to the tiny model's short prompts (B must equal the chunk size above).
POLICY_ARGS = {
    "radix": [],
    "exact": ["--cache-policy-set", "piece_tokens=64", "--cache-policy-set", "retain_every=256"],
}


def conversation_turns():
    """(label, kind, messages) for each request; kind says how the prompt changed."""
    system = {"role": "system", "content": "You are a careful build engineer. Answer briefly."}
    user = {"role": "user", "content": "\n\n".join(SECTIONS)}
    yield "turn 1", "first", [system, user]
    reply = {"role": "assistant", "content": "The cache misses line up with the moved cache directory."}
    follow = {"role": "user", "content": "Which steps missed the cache?"}
    yield "turn 2", "append", [system, user, reply, follow]
    # The agent edits its context: the long build log (section 2) is deleted from the middle.
    edited_user = {"role": "user", "content": "\n\n".join(SECTIONS[:1] + SECTIONS[2:])}
    reply2 = {"role": "assistant", "content": "Steps 3, 6, 9, 12, 15 and 18 missed."}
    yield "turn 3", "edited", [system, edited_user, reply, follow, reply2,
                               {"role": "user", "content": "Summarise the cause in one line."}]
    reply3 = {"role": "assistant", "content": "The cache moved to a slow network disk."}
    yield "turn 4", "append", [system, edited_user, reply, follow, reply2,
                               {"role": "user", "content": "Summarise the cause in one line."}, reply3,
                               {"role": "user", "content": "And the fix?"}]


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
    return "\n".join(lines)


def run(model_dir: Path, out_dir: Path, policy: str = "radix", max_tokens: int = 12) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    events_path = out_dir / f"events-{policy}.jsonl"
    events_path.unlink(missing_ok=True)
    server = ServerProcess(
        model_path=str(model_dir),
        log_path=out_dir / f"server-{policy}.log",
        extra_args=[*SERVER_ARGS, "--cache-policy", policy, *POLICY_ARGS.get(policy, []),
                    "--cache-events", str(events_path)],
    )
    print(f"[demo] starting the patched server (policy {policy}) on {model_dir.name}; log: {server.log_path}",
          flush=True)
    rows = []
    with server:
        for number, (label, kind, messages) in enumerate(conversation_turns(), 1):
            rid = f"demo-{policy}.{number}"  # conversation.turn (eval.accounting.provenance)
            started = time.monotonic()
            server.chat(messages, max_tokens=max_tokens, rid=rid, ignore_eos=True)
            rows.append({"label": label, "kind": kind, "rid": rid, "seconds": time.monotonic() - started})
            print(f"[demo] {label} ({kind}) done in {rows[-1]['seconds']:.1f}s", flush=True)
        events = wait_for_events(events_path, [row["rid"] for row in rows])
    failures = server.fatal_lines()
    if failures:
        raise RuntimeError("server reported errors:\n" + "\n".join(failures))
    for row in rows:
        if row["rid"] not in events:
            raise RuntimeError(f"no event for {row['rid']} in {events_path}")
        row.update(events[row["rid"]])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", choices=sorted(POLICY_ARGS),
                        help="policy to run (repeatable; default: radix and exact)")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "demo")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: build the tiny model)")
    args = parser.parse_args(argv)
    model_dir = args.model or cached_build(ROOT / ".artifacts")
    policies = args.policy or ["radix", "exact"]
    rows = {policy: run(model_dir, args.out, policy) for policy in policies}
    print()
    print("What the prefix cache did per request (prompt = reused + moved + read; read = run through the model):")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
