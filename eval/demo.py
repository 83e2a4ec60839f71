"""The demo: a short multi-turn conversation with an edit in the middle, served by the patched
server on the tiny model, and a table of what the prefix cache did for each request.

``python -m eval.demo [--policy radix] [--out DIR]`` (``scripts/demo.sh`` runs it after set-up).
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


def format_table(rows: list[dict]) -> str:
    header = f"{'request':<8} {'prompt change':<14} {'prompt':>6} {'reused':>6} {'moved':>5} {'read':>5} {'decode':>6} {'seconds':>7}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['label']:<8} {row['kind']:<14} {row['prompt_tokens']:>6} {row['prefix_reused']:>6} "
            f"{row['moved']:>5} {row['read']:>5} {row['decode_tokens']:>6} {row['seconds']:>7.2f}"
        )
    return "\n".join(lines)


def run(model_dir: Path, out_dir: Path, policy: str = "radix", max_tokens: int = 12) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    events_path = out_dir / f"events-{policy}.jsonl"
    events_path.unlink(missing_ok=True)
    server = ServerProcess(
        model_path=str(model_dir),
        log_path=out_dir / f"server-{policy}.log",
        extra_args=[*SERVER_ARGS, "--cache-policy", policy, "--cache-events", str(events_path)],
    )
    print(f"[demo] starting the patched server (policy {policy}) on {model_dir.name}; log: {server.log_path}",
          flush=True)
    rows = []
    with server:
        for number, (label, kind, messages) in enumerate(conversation_turns(), 1):
            rid = f"demo-{policy}-{number}"
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
    parser.add_argument("--policy", default="radix")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "demo")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: build the tiny model)")
    args = parser.parse_args(argv)
    model_dir = args.model or cached_build(ROOT / ".artifacts")
    rows = run(model_dir, args.out, args.policy)
    print()
    print(f"What the prefix cache did per request (policy {args.policy}; prompt = reused + moved + read):")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
