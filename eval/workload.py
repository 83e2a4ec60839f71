"""A scripted, agent-like editing workload for any OpenAI-compatible server.

``python -m eval.workload --server URL --out DIR [--conversations N] [--max-tokens M] [--run-id NAME]
[--server-trace FILE]``

Each conversation is a small agent loop over a task: tool outputs are appended, the assistant's
earlier reasoning is stripped by the chat template (its replies carry ``<think>`` blocks), the
agent deletes a stale tool output from the middle of its context, and one turn only appends.
The conversation's next turn is built from the replies the server actually gave, as an agent
would. Every request has a unique ``rid`` = ``<run>.<conversation>.<turn>`` (the accounting groups
turns into conversations by it). ``DIR/client.jsonl`` gets one line per request: rid, turn kind,
usage and latency. With ``--server-trace FILE`` (the server's ``--cache-trace``), ``DIR/trace.jsonl``
gets the run as a trace (``eval/traces/format.py``): conversation ``c<N>``, the turn, the messages
sent and the exact token ids the server read and wrote (``write_run_trace``).

Other scripted conversations go through the same driver: ``run(..., script=Script(kinds, messages))``
(``eval.demo`` sends its fixed editing conversation this way).
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

TURN_KINDS = ("first", "tool", "tool", "edit", "append")


def tool_output(rng: random.Random, name: str, lines: int) -> str:
    """A deterministic, log-like tool result (search hits or build output)."""
    words = ["cache", "layer", "state", "piece", "token", "prefix", "kernel", "batch", "queue", "shard"]
    body = [f"[{name}:{i:03d}] {rng.choice(words)} {rng.choice(words)} = {rng.randrange(10_000)}" for i in range(lines)]
    return "\n".join(body)


def build_messages(conversation: int, turn: int, replies: list[str], seed: int) -> list[dict]:
    """The messages of ``turn`` (0-based), given the assistant replies to the earlier turns."""
    rng = random.Random(seed * 1000 + conversation)
    task = f"Task {conversation}: find which of the logged values changed between runs and explain why."
    outputs = [tool_output(rng, f"tool{k}", 24) for k in range(3)]
    messages: list[dict] = [
        {"role": "system", "content": "You are a research agent. Think, then answer in one line."},
        {"role": "user", "content": task},
    ]
    if turn == 0:
        return messages
    # Turns 1 and 2 each add an assistant step (reasoning + a tool call) and its tool output.
    for step in range(min(turn, 2)):
        messages.append({"role": "assistant", "content": f"<think>step {step}: {replies[step]}</think>\ncalling tool{step}"})
        if turn >= 3 and step == 0:
            continue  # the edit (turn 3, kept afterwards): the agent deleted the first tool output
        messages.append({"role": "tool", "content": outputs[step]})
    if turn >= 3:
        messages.append({"role": "assistant", "content": f"<think>{replies[2]}</think>\nI removed a stale result."})
        messages.append({"role": "user", "content": "Continue with what is left."})
    if turn >= 4:
        messages.append({"role": "assistant", "content": replies[3]})
        messages.append({"role": "user", "content": "One more line, please."})
    return messages


@dataclass(frozen=True)
class Script:
    """A scripted conversation: the kind of each turn and ``messages(conversation, turn, replies)``
    (``replies`` = the assistant's answers to the earlier turns, trimmed)."""

    kinds: tuple[str, ...]
    messages: Callable[[int, int, list[str]], list[dict]]


def agent_script(seed: int = 0) -> Script:
    """The default agent-like workload (``build_messages``)."""
    return Script(TURN_KINDS, lambda conversation, turn, replies: build_messages(conversation, turn, replies, seed))


def run(post: Callable[[str, dict], dict], out: Path, *, conversations: int = 3, max_tokens: int = 16,
        run_name: str = "w", seed: int = 0, progress: bool = True, script: Script | None = None,
        extra: dict | None = None) -> list[dict]:
    """Drive the workload through ``post(path, payload) -> json``; returns the client records.

    ``script`` defaults to the agent workload; ``extra`` is merged into every request body
    (e.g. ``{"ignore_eos": True}``). Records are appended to ``out/client.jsonl``; the returned
    ones also carry the ``messages`` sent (for ``write_run_trace``; the log leaves them out).
    """
    script = script or agent_script(seed)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    bar = tqdm(total=conversations * len(script.kinds), desc="workload", unit="req", disable=not progress)
    with open(out / "client.jsonl", "a") as log:
        for conversation in range(conversations):
            replies: list[str] = []
            for turn, kind in enumerate(script.kinds):
                rid = f"{run_name}.c{conversation}.{turn}"
                payload = {"model": "default", "messages": script.messages(conversation, turn, replies),
                           "max_tokens": max_tokens, "temperature": 0.0, "rid": rid, **(extra or {})}
                started = time.monotonic()
                response = post("/v1/chat/completions", payload)
                reply = response["choices"][0]["message"]["content"] or ""
                replies.append(reply.strip()[:200] or "(empty)")
                record = {"rid": rid, "conversation": conversation, "turn": turn, "kind": kind,
                          "usage": response["usage"], "seconds": round(time.monotonic() - started, 4)}
                log.write(json.dumps(record) + "\n")
                log.flush()
                records.append({**record, "messages": payload["messages"]})
                bar.update(1)
                bar.set_postfix(tokens=sum(r["usage"]["prompt_tokens"] for r in records))
    bar.close()
    return records


def write_run_trace(records: list[dict], server_trace: Path, out: Path, timeout: float = 30.0) -> Path:
    """``out/trace.jsonl``: the run's requests (``run``'s records) joined with the server's
    ``--cache-trace`` lines by rid; conversation ``c<N>``, turn as sent, kind and messages kept."""
    from eval.traces.record import ClientCall, record_trace

    calls = [ClientCall(rid=r["rid"], conversation=f"c{r['conversation']}", turn=r["turn"],
                        messages=r.get("messages"), kind=r.get("kind")) for r in records]
    path = Path(out) / "trace.jsonl"
    record_trace(server_trace, calls, path, timeout=timeout)
    return path


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, UsageError, failed, int_at_least, run_main

    parser = Parser(prog="python -m eval.workload", description=__doc__.split("\n\n")[0].splitlines()[0])
    parser.add_argument("--server", required=True, metavar="URL", help="base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="output directory (client.jsonl, trace.jsonl)")
    parser.add_argument("--conversations", type=int_at_least(1), default=3, metavar="N", help="conversations to run")
    parser.add_argument("--max-tokens", type=int_at_least(1), default=16, metavar="M", help="max_tokens per request")
    parser.add_argument("--run-id", default="w", metavar="NAME", help="rid prefix for this run")
    parser.add_argument("--server-trace", type=Path, default=None, metavar="FILE",
                        help="the server's --cache-trace file: write the run as a trace to DIR/trace.jsonl")
    args = parser.parse_args(argv)
    from eval import http

    def body() -> int:
        records = run(lambda path, payload: http.post_json(args.server + path, payload), args.out,
                      conversations=args.conversations, max_tokens=args.max_tokens, run_name=args.run_id)
        print(f"{len(records)} requests -> {args.out / 'client.jsonl'}")
        if args.server_trace is not None:
            try:
                print(f"trace -> {write_run_trace(records, args.server_trace, args.out)}")
            except OSError as exc:
                raise UsageError(f"--server-trace {args.server_trace}: {exc.strerror or exc}") from None
        return 0

    return run_main(parser.prog, body, failed(http.HttpError, http.NoResponse, label="server error"))


if __name__ == "__main__":
    sys.exit(main())
