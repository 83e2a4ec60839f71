"""The workload driver (``eval.workload.run``) with a scripted endpoint, and the demo's plumbing
that needs no server (its script, the refusal of a policy the registry does not know)."""

from __future__ import annotations

import json

from eval import demo, workload
from policy import registry


class Endpoint:
    def __init__(self):
        self.payloads = []

    def __call__(self, path, payload):
        assert path == "/v1/chat/completions"
        self.payloads.append(payload)
        n = sum(len(m["content"]) for m in payload["messages"])
        return {"choices": [{"message": {"content": f"reply {len(self.payloads)}"}}],
                "usage": {"prompt_tokens": n, "completion_tokens": 3, "total_tokens": n + 3}}


def test_agent_workload_rids_kinds_and_client_log(tmp_path):
    endpoint = Endpoint()
    records = workload.run(endpoint, tmp_path, conversations=2, max_tokens=5, run_name="t", progress=False)
    assert [r["rid"] for r in records] == [f"t.c{c}.{t}" for c in range(2) for t in range(5)]
    assert [r["kind"] for r in records[:5]] == list(workload.TURN_KINDS)
    assert [(r["conversation"], r["turn"]) for r in records[5:7]] == [(1, 0), (1, 1)]
    assert all(p["max_tokens"] == 5 and p["temperature"] == 0.0 for p in endpoint.payloads)
    # Turn 1 carries the assistant's reply to turn 0 (with its reasoning), as an agent would.
    assert "reply 1" in endpoint.payloads[1]["messages"][2]["content"]
    lines = [json.loads(line) for line in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert [line["rid"] for line in lines] == [r["rid"] for r in records]
    assert lines[0]["usage"]["completion_tokens"] == 3


def test_a_script_and_extra_fields(tmp_path):
    endpoint = Endpoint()
    records = workload.run(endpoint, tmp_path, conversations=1, run_name="demo-x", progress=False,
                           script=demo.DEMO_SCRIPT, extra={"ignore_eos": True})
    assert [r["kind"] for r in records] == ["first", "append", "edited", "append"]
    assert [p["messages"] for p in endpoint.payloads] == [m for _, _, m in demo.conversation_turns()]
    assert all(p["ignore_eos"] is True for p in endpoint.payloads)
    assert [r["rid"] for r in records] == [f"demo-x.c0.{t}" for t in range(4)]


def test_demo_conversation_deletes_a_middle_section():
    turns = [m for _, _, m in demo.conversation_turns()]
    before, after = turns[1][1]["content"], turns[2][1]["content"]
    deleted = demo.SECTIONS[demo.DELETED]
    assert deleted in before and deleted not in after
    assert before.replace(deleted + "\n\n", "") == after  # only that section went
    assert 0 < demo.DELETED < len(demo.SECTIONS) - 1  # in the middle: text survives after it


def test_demo_refuses_a_policy_the_registry_does_not_know(monkeypatch, capsys):
    monkeypatch.setattr(registry, "names", lambda: ("radix", "exact"))
    assert demo.unavailable("scr").startswith("policy 'scr' is not registered in policy/registry.py")
    assert demo.unavailable("radix") is None
    assert demo.main(["--policy", "radix", "--policy", "scr"]) == 2  # no server started
    err = capsys.readouterr().err
    assert "[demo] error: policy 'scr' is not registered" in err
    assert demo.POLICIES == ("radix", "exact", "scr") and set(demo.POLICY_ARGS) == set(demo.POLICIES)
