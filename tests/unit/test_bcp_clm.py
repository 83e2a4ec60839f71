"""CLM-style context editing: mirror and parse-back, the edit gate, nudges, rollback."""

from __future__ import annotations

import json

import pytest

from eval.bcp import clm
from eval.bcp.agent import Agent
from eval.bcp.client import ChatClient
from eval.bcp.config import AgentConfig
from tests.unit.test_bcp_agent import ANSWER, FakeEndpoint, native_call

MESSAGES = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "the task"},
    {"role": "assistant", "content": "step one", "reasoning_content": "hidden",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query": "a"}'}}]},
    {"role": "tool", "content": "result one\nsecond line", "tool_call_id": "c1"},
    {"role": "assistant", "content": "step two",
     "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "search", "arguments": '{"query": "b"}'}}]},
    {"role": "tool", "content": "result two", "tool_call_id": "c2"},
]


def test_mirror_round_trips_unchanged_messages_exactly():
    text = clm.render_mirror(MESSAGES)
    assert text.startswith("[[CTX_TURN 0 role=system]]\nsys\n[[CTX_TURN 1 role=user]]\nthe task\n")
    assert '[[CTX_TURN 2 role=assistant]]\nstep one\n[[TOOL_CALL search]] {"query": "a"}\n' in text
    back = clm.parse_back(text, MESSAGES)
    assert back == MESSAGES and all(a is b for a, b in zip(back, MESSAGES))  # originals kept whole


def test_edits_parse_back_into_messages():
    text = clm.render_mirror(MESSAGES).replace("result one\nsecond line", "summary: a -> 11")
    back = clm.parse_back(text, MESSAGES)
    assert back[3] == {"role": "tool", "content": "summary: a -> 11", "tool_call_id": "c1"}
    assert back[:3] == MESSAGES[:3] and back[4:] == MESSAGES[4:]
    # An edited assistant turn keeps its (unchanged) tool call and loses its hidden reasoning.
    text = clm.render_mirror(MESSAGES).replace("step one", "s1")
    edited = clm.parse_back(text, MESSAGES)[2]
    assert edited["content"] == "s1" and "reasoning_content" not in edited
    assert edited["tool_calls"] == MESSAGES[2]["tool_calls"]
    # delete turns 2-3 through the tool's action
    back = clm.apply_edit(MESSAGES, {"action": "delete", "turns": [2, 3]})
    assert back == MESSAGES[:2] + MESSAGES[4:]
    back = clm.apply_edit(MESSAGES, {"action": "replace", "old": "result two", "new": "r2"})
    assert back[5]["content"] == "r2"


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("the task", "another task"), "protected"),
    (lambda t: t.replace("[[CTX_TURN 1 role=user]]\nthe task\n", ""), "protected turns"),
    (lambda t: t.replace("role=tool]]\nresult two", "role=user]]\nresult two"), "changed role"),
    (lambda t: t + "[[CTX_TURN 6 role=user]]\nnew\n", "cannot be added"),
    (lambda t: t + "[[CTX_TURN 3 role=tool]]\ndup\n", "out of order"),
    (lambda t: "preface\n" + t, "before the first"),
    (lambda t: t.replace('{"query": "a"}', "{not json"), "not JSON"),
])
def test_invalid_edits_are_refused(mutate, message):
    with pytest.raises(clm.EditError, match=message):
        clm.parse_back(mutate(clm.render_mirror(MESSAGES)), MESSAGES)


def test_edit_tool_argument_errors():
    with pytest.raises(clm.EditError, match="exactly once"):
        clm.apply_edit(MESSAGES, {"action": "replace", "old": "result", "new": "x"})
    with pytest.raises(clm.EditError, match="no such turns"):
        clm.apply_edit(MESSAGES, {"action": "delete", "turns": [9]})
    with pytest.raises(clm.EditError, match="unknown action"):
        clm.apply_edit(MESSAGES, {"action": "rewrite"})


def test_orphan_tool_results_go_with_their_call():
    kept = MESSAGES[:2] + MESSAGES[3:]  # assistant turn 2 deleted, its result left behind
    assert clm.drop_orphan_tool_results(kept) == MESSAGES[:2] + MESSAGES[4:]


def test_edit_gate():
    assert clm.gate("shrink", 100, 90, 1000) is None
    assert "shrink" in clm.gate("shrink", 100, 100, 1000)
    assert clm.gate("fit", 100, 150, 1000) is None
    assert "over the limit" in clm.gate("fit", 100, 1500, 1000)


def test_nudges_fire_once_per_ratio_and_rearm_after_shrinking():
    budget = clm.Budget(budget_tokens=1000, strict_target=900, nudge_ratios=(0.25, 0.5, 0.75), persistent_ratio=0.9)
    assert budget.nudges(200) == []
    assert budget.nudges(260) == [("ratio", 0.25)]
    assert budget.nudges(300) == []
    assert budget.nudges(760) == [("ratio", 0.75)]  # 0.5 and 0.75 at once: the higher one is said
    assert budget.nudges(770) == []
    assert budget.nudges(820) == [("persistent", 0.9)]  # >= 0.9 * 900, every turn
    assert budget.nudges(820) == [("persistent", 0.9)]
    assert budget.nudges(300) == []  # shrank below 0.5 and 0.75: they re-arm
    assert budget.nudges(520) == [("ratio", 0.5)]


def test_calibration_learns_the_token_ratio_within_bounds():
    budget = clm.Budget(1000, 800)
    messages = [{"role": "user", "content": "x" * 384}]  # 400 chars with the per-message overhead
    budget.calibrate(messages, 200)
    assert budget.tok_ratio == pytest.approx(2.0) and budget.estimate(messages) == 200
    budget.calibrate(messages, 10_000)
    assert budget.tok_ratio == 3.0


def test_rollback_drops_recent_turns_with_their_results():
    budget = clm.Budget(1000, 800)
    messages = [dict(m) for m in MESSAGES] + [{"role": "user", "content": "note " * 200}]
    rolled, dropped = clm.rollback(messages, budget, target=budget.estimate(MESSAGES[:4]), protect=2)
    assert rolled == MESSAGES[:4] and dropped == 2  # the note, then turn 4 with its result


# ---- the CLM agent loop


def clm_agent(endpoint, **overrides):
    config = AgentConfig(**{"mode": "clm", "finish_policy": "submit", "max_steps": 12, "context_budget_tokens": 2000,
                            "context_budget_reserve_tokens": 200, "finalize_nudge_turns": 0, **overrides})
    client = ChatClient(endpoint, model="m", sampling=config.sampling(), chat_template_kwargs=config.chat_template_kwargs,
                        sleep=lambda s: None)

    class BigToolBox:
        retrieved_docids = ["1"]

        def schemas(self):
            return [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]

        def call(self, name, arguments):
            return "R" * 1000  # about 250 tokens per observation

    return Agent(config, client, BigToolBox), config


def user_notes(payload):
    return [m["content"] for m in payload["messages"][2:] if m["role"] == "user"]


def test_clm_agent_nudges_at_25_50_75_percent_and_submits():
    script = [native_call("search", query=f"q{i}") for i in range(7)] + [native_call("submit", answer=ANSWER)]
    endpoint = FakeEndpoint(script, prompt_tokens=lambda p: len(json.dumps(p["messages"])) // 4)
    agent, config = clm_agent(endpoint, context_budget_tokens=2400, context_budget_reserve_tokens=100,
                              persistent_nudge_ratio=0.99)
    record = agent.run("q1", "question", "run.q1").record
    assert record["status"] == "completed"
    assert record["result"][-1]["output"] == ANSWER
    notes = [n for p in endpoint.payloads for n in user_notes(p)]
    shares = [n.split("passed ")[1].split(" ")[0] for n in dict.fromkeys(notes) if n.startswith("[CONTEXT NOTICE]")]
    # One notice per ratio, in order; after the rollback shrank the context below 50 %, that
    # notice re-armed and fired again.
    assert shares == ["25%", "50%", "75%", "50%"]
    assert notes.index(next(n for n in notes if n.startswith("[ROLLBACK"))) < len(notes) - 1
    assert record["agent_stats"]["nudges"] >= 3  # plus an urgent one just before the rollback
    assert endpoint.payloads[0]["messages"][0]["role"] == "system"
    assert [t["function"]["name"] for t in endpoint.payloads[0]["tools"]] == ["search", "context", "submit"]


def test_clm_agent_accepted_edit_is_free_and_shrinks_the_context():
    script = [native_call("search", query="a"), native_call("search", query="b"),
              native_call("context", action="delete", turns=[2, 3]),
              native_call("submit", answer=ANSWER)]
    endpoint = FakeEndpoint(script)
    agent, _ = clm_agent(endpoint)
    run = agent.run("q1", "question", "run.q1")
    stats = run.record["agent_stats"]
    assert stats["ctx_accepted"] == 1 and stats["free_ctx_turns"] == 1
    assert run.record["steps"] == 2  # the two searches; the edit turn was free
    before, after = endpoint.payloads[2]["messages"], endpoint.payloads[3]["messages"]
    assert len(after) == len(before) - 2 + 2  # two turns gone, the edit call and its (empty) result added
    calls = [m["tool_calls"][0]["function"] for m in after if m["role"] == "assistant"]
    assert calls[0] == {"name": "search", "arguments": '{"query": "b"}'}  # the first search is gone
    assert calls[1]["name"] == "context" and after[-1] == {"role": "tool", "content": "", "tool_call_id": "call_context"}


def test_clm_agent_shrink_gate_rejects_a_growing_edit():
    script = [native_call("search", query="a"),
              native_call("context", action="replace", old='{"query": "a"}', new='{"query": "a much longer query"}'),
              native_call("submit", answer=ANSWER)]
    endpoint = FakeEndpoint(script)
    agent, _ = clm_agent(endpoint)
    record = agent.run("q1", "question", "run.q1").record
    assert record["agent_stats"]["ctx_rejected"] == 1 and "free_ctx_turns" not in record["agent_stats"]
    results = [m["content"] for m in endpoint.payloads[2]["messages"] if m["role"] == "tool"]
    assert "shrink gate" in results[-1]
    assert endpoint.payloads[2]["messages"][2] == endpoint.payloads[1]["messages"][2]  # unchanged


def test_clm_agent_rolls_back_when_over_budget_and_pins_a_ledger():
    script = [native_call("search", query=f"q{i}") for i in range(8)] + [native_call("submit", answer=ANSWER)]
    endpoint = FakeEndpoint(script)
    agent, config = clm_agent(endpoint, context_budget_tokens=1400, context_budget_reserve_tokens=200,
                              retry_edit_margin_tokens=300)
    record = agent.run("q1", "question", "run.q1").record
    stats = record["agent_stats"]
    assert stats["retries_on_limit"] >= 1 and stats["turns_rolled_back"] >= 1
    assert record["status"] == "completed"
    # Every prompt after the first rollback carries the ledger at index 2, and stays under the limit.
    rolled = [p for p in endpoint.payloads if len(p["messages"]) > 2 and "[ROLLBACK LEDGER]" in str(p["messages"][2].get("content"))]
    assert rolled
    assert all(len(json.dumps(p["messages"])) // 4 <= 1200 + 100 for p in rolled)


def test_clm_agent_gives_up_after_the_retry_limit():
    script = [native_call("search", query=f"q{i}") for i in range(30)]
    endpoint = FakeEndpoint(script)
    agent, _ = clm_agent(endpoint, context_budget_tokens=1400, context_budget_reserve_tokens=200,
                         retry_edit_margin_tokens=300, max_num_retry_on_limit=2, max_steps=30)
    record = agent.run("q1", "question", "run.q1").record
    assert record["status"] == "budget_exhausted"
    assert record["agent_stats"]["retries_on_limit"] == 2 and record["agent_stats"]["budget_finalized"] == 1


def test_clm_agent_no_tool_call_reminder_and_finalize_notice():
    endpoint = FakeEndpoint([{"content": "thinking aloud"}, {"content": "still"}, native_call("submit", answer=ANSWER)])
    agent, _ = clm_agent(endpoint, max_steps=4, finalize_nudge_turns=3)
    record = agent.run("q1", "question", "run.q1").record
    assert record["status"] == "completed"
    second = endpoint.payloads[1]["messages"][-1]
    assert second["role"] == "user" and "No tool call" in second["content"] and "Only 3 turn(s) remain" in second["content"]
