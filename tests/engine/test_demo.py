"""The demo end to end (what ``./scripts/demo.sh`` prints: per-request table, ingested logs with all
checks, the compare table and plots), with the radix and exact numbers derived independently.

Under ``radix`` with ``no_buffer`` and 64-token prefill chunks, SGLang keeps recurrent states at
every multiple of 64 inside a prompt and at the prompt's end, and a prompt may resume at the
deepest such state on a cached prompt that is not past the shared prefix nor past len - 1.
"""

from __future__ import annotations

import csv
import json

import pytest
from transformers import AutoTokenizer

from eval import demo
from eval.replay.run import run_replay
from eval.server import ServerProcess
from eval.traces import read_trace
from exact_cache.replay import replay

pytestmark = pytest.mark.engine

CHUNK = 64  # --chunked-prefill-size in eval.demo.SERVER_ARGS


def expected_reuse(prompt: list[int], earlier: list[list[int]]) -> int:
    best = 0
    for old in earlier:
        shared = next((i for i, (a, b) in enumerate(zip(old, prompt)) if a != b), min(len(old), len(prompt)))
        limit = min(shared, len(prompt) - 1)
        states = [c for c in range(CHUNK, len(old), CHUNK)] + [len(old)]
        best = max([best] + [c for c in states if c <= limit])
    return best


def chat_prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for _, _, messages in demo.conversation_turns()
    ]


def check_rows(rows, prompts, expected_reused):
    assert [row["class"] for row in rows] == ["first", "append", "edited", "append"]
    for row, prompt, reused in zip(rows, prompts, expected_reused):
        assert int(row["prompt_tokens"]) == len(prompt)
        assert int(row["prefix_reused"]) == reused, row["rid"]
        assert int(row["moved"]) == 0
        assert int(row["read"]) == len(prompt) - reused
        assert int(row["decode"]) == 12
        assert int(row["cached_tokens"]) == reused  # the Finish line's count


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_demo_end_to_end(tiny_model_dir, tmp_path, capsys):
    assert "--chunked-prefill-size" in demo.SERVER_ARGS and str(CHUNK) in demo.SERVER_ARGS
    assert demo.POLICY_ARGS["exact"] == ["--cache-policy-set", f"piece_tokens={CHUNK}",
                                         "--cache-policy-set", "retain_every=256"]
    assert demo.POLICIES == ("radix", "exact", "scr")
    ran = [policy for policy in demo.POLICIES if demo.unavailable(policy) is None]
    assert ran[:2] == ["radix", "exact"]
    prompts = chat_prompts(tiny_model_dir)

    assert demo.main(["--model", str(tiny_model_dir), "--out", str(tmp_path)]) == 0  # every check passed
    out = capsys.readouterr().out

    rows = {policy: read_rows(tmp_path / policy / "report" / "requests.csv") for policy in ran}
    assert [row["rid"] for row in rows["radix"]] == [f"demo-radix.c0.{t}" for t in range(4)]
    check_rows(rows["radix"], prompts, [expected_reuse(p, prompts[:i]) for i, p in enumerate(prompts)])
    check_rows(rows["exact"], prompts, replay(prompts, piece=CHUNK, retain_every=256))
    radix_cached = [int(row["cached_tokens"]) for row in rows["radix"]]
    radix = [int(row["prefix_reused"]) for row in rows["radix"]]
    assert radix[0] == 0 and radix[1] > 0 and radix[2] < radix[1] and radix[3] > 0
    for policy in ran[2:]:  # scr, once registered: consistent, same prompts, classes as built
        assert [int(r["prompt_tokens"]) for r in rows[policy]] == [len(p) for p in prompts]
        assert [r["class"] for r in rows[policy]][:2] == ["first", "append"]
    for policy in ran:
        summary = json.loads((tmp_path / policy / "report" / "summary.json").read_text())
        assert summary["checks_failed"] == [] and summary["sources"]["client"].endswith("client.jsonl")
        client = (tmp_path / policy / "client.jsonl").read_text().splitlines()
        assert [json.loads(line)["kind"] for line in client] == ["first", "append", "edited", "append"]

    # The printed per-request table, then the comparison.
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("request "))
    table = lines[at:at + 3 + len(prompts)]
    assert table[0].split() == ["request", "prompt", "change", "prompt", *sum((["|", p] for p in ran), [])]
    assert table[1].split() == ["|", "reused", "moved", "read", "seconds"] * len(ran)
    assert table[3].split()[:3] == ["turn", "1", "first"]
    assert [line.split()[2] for line in table[3:]] == ["first", "append", "edited", "append"]
    assert "| metric | " + " | ".join(ran) + " |" in out
    # The fidelity check on scr's edited turn: each arm relocated, and a missing re-rotation is
    # visibly worse than the rotated arms (first-token KL against the cold read).
    assert "How far scr's answers are from a cold read" in out and "tiny random model" in out
    fidelity = json.loads((tmp_path / "scr" / "fidelity" / "summary.json").read_text())
    assert fidelity["checks_failed"] == []
    lines = (tmp_path / "scr" / "fidelity" / "fidelity.jsonl").read_text().splitlines()
    rows = {row["arm"]: row for row in map(json.loads, lines)}
    assert set(rows) == {"fork", "none", "norerot"} and all(row["moved"] > 0 for row in rows.values())
    assert rows["norerot"]["kl_first"] > 10 * max(rows["fork"]["kl_first"], rows["none"]["kl_first"])
    compare = json.loads((tmp_path / "compare" / "table.json").read_text())
    assert compare["baseline"] == "radix" and compare["table"]["radix"]["pflops_per_request_ratio"] == 1.0
    for name in ("table.md", "table.csv", "provenance_stack.png", "read_cdf.png"):
        assert (tmp_path / "compare" / name).stat().st_size > 0

    # The demo recorded each policy's run as a trace; replayed with forced decoding on a fresh
    # radix server with the demo's flags, it reproduces the radix run's cached_tokens per request.
    trace = read_trace(tmp_path / "radix" / "trace.jsonl")
    assert [len(c.prompt_ids) for c in trace] == [len(p) for p in prompts]
    assert [c.prompt_ids for c in trace] == prompts
    server = ServerProcess(model_path=str(tiny_model_dir), log_path=tmp_path / "replay" / "server.log",
                           extra_args=[*demo.SERVER_ARGS, "--cache-policy", "radix", *demo.POLICY_ARGS["radix"]])
    with server:
        run_replay(server.url, tmp_path / "radix" / "trace.jsonl", tmp_path / "replay", run="again", progress=None)
    assert server.fatal_lines() == []
    replayed = [json.loads(line) for line in (tmp_path / "replay" / "client.jsonl").read_text().splitlines()]
    recorded = [json.loads(line) for line in (tmp_path / "radix" / "client.jsonl").read_text().splitlines()]
    assert [r["cached_tokens"] for r in replayed] == radix_cached
    assert [r["usage"]["completion_tokens"] for r in replayed] == [r["usage"]["completion_tokens"] for r in recorded]
