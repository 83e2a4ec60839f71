"""The BCP agent loop against a scripted fake chat endpoint (no server)."""

from __future__ import annotations

import json

import pytest

from eval.bcp.agent import Agent
from eval.bcp.client import ChatClient, ClientError, parse_reply, parse_text_tool_calls
from eval.bcp.config import AgentConfig, load_config


class FakeEndpoint:
    """``post(path, payload)`` answering from a script: each entry is a reply message dict, a
    callable(payload) -> message, or an exception to raise."""

    def __init__(self, script, prompt_tokens=None):
        self.script = list(script)
        self.payloads = []
        self.prompt_tokens = prompt_tokens  # callable(payload) -> int, default chars/4

    def __call__(self, path, payload):
        assert path == "/v1/chat/completions"
        self.payloads.append(json.loads(json.dumps(payload)))
        if not self.script:
            raise AssertionError("the agent asked for more replies than scripted")
        entry = self.script.pop(0)
        if isinstance(entry, BaseException):
            raise entry
        message = entry(payload) if callable(entry) else entry
        chars = len(json.dumps(payload["messages"])) + len(json.dumps(payload.get("tools", [])))
        prompt = self.prompt_tokens(payload) if self.prompt_tokens else chars // 4
        return {"choices": [{"message": {"role": "assistant", **message}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7,
                          "prompt_tokens_details": {"cached_tokens": 3}}}


class FakeToolBox:
    def __init__(self):
        self.calls = []
        self.retrieved_docids = []

    def schemas(self):
        return [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
                {"type": "function", "function": {"name": "get_document", "parameters": {"type": "object"}}}]

    def call(self, name, arguments):
        self.calls.append((name, arguments))
        if name == "search":
            self.retrieved_docids.extend(d for d in ("11", "12") if d not in self.retrieved_docids)
            return json.dumps([{"docid": "11", "score": 2.0, "snippet": "alpha " * 20}, {"docid": "12", "snippet": "beta"}])
        if name == "get_document":
            return json.dumps({"docid": arguments["docid"], "text": "long text " * 50})
        return json.dumps({"error": f"unknown tool {name}"})


def native_call(name, **arguments):
    return {"content": "", "tool_calls": [{"id": f"call_{name}", "type": "function",
                                           "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def xml_call(name, **arguments):
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return {"content": f"thinking it over\n</think>\n\nLet me look.\n\n<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"}


ANSWER = "Explanation: found it [11]\nExact Answer: Zuntor\nConfidence: 80%"


def make_agent(endpoint, **overrides):
    config = AgentConfig(**{"mode": "plain", "finish_policy": "text", "max_steps": 10, **overrides})
    client = ChatClient(endpoint, model="m", sampling=config.sampling(), chat_template_kwargs=config.chat_template_kwargs,
                        cache_salt=config.cache_salt, protocol=config.tool_protocol, sleep=lambda s: None)
    boxes = []

    def make_toolbox():
        boxes.append(FakeToolBox())
        return boxes[-1]

    return Agent(config, client, make_toolbox, model_name="m"), boxes


def test_plain_agent_executes_native_and_text_tool_calls_and_extracts_the_answer():
    endpoint = FakeEndpoint([native_call("search", query="who designed it"),
                             xml_call("get_document", docid="11"),
                             {"content": "<think>done</think>\n\n" + ANSWER}])
    agent, boxes = make_agent(endpoint)
    run = agent.run("7", "Who designed the thing?", "r1.7")
    record = run.record
    assert boxes[0].calls == [("search", {"query": "who designed it"}), ("get_document", {"docid": "11"})]
    assert record["status"] == "completed"
    assert record["query_id"] == "7"
    assert record["result"][-1] == {"type": "output_text", "tool_name": None, "arguments": None, "output": ANSWER}
    assert [i["type"] for i in record["result"]] == ["tool_call", "reasoning", "tool_call", "reasoning", "output_text"]
    assert record["result"][0]["tool_name"] == "search" and '"docid": "11"' in record["result"][0]["output"]
    assert record["tool_call_counts"] == {"search": 1, "get_document": 1}
    assert record["retrieved_docids"] == ["11", "12"]
    assert record["rids"] == ["r1.7.0000", "r1.7.0001", "r1.7.0002"]
    assert record["tokens"]["completion"] == 21 and record["tokens"]["cached"] == 9
    assert record["agent_stats"]["tool_protocol_native"] == 1 and record["agent_stats"]["tool_protocol_text"] == 1
    # Requests: rid per turn, template kwargs, sampling, tools; the text-protocol call went back as tool_calls.
    first, second, third = endpoint.payloads
    assert [p["rid"] for p in endpoint.payloads] == record["rids"]
    assert first["chat_template_kwargs"] == {"enable_thinking": True, "preserve_thinking": False}
    assert first["temperature"] == 0.7 and first["top_p"] == 0.95 and first["max_tokens"] == 4096
    assert "cache_salt" not in first
    assert [t["function"]["name"] for t in first["tools"]] == ["search", "get_document"]
    assistant = third["messages"][-2]
    assert assistant["reasoning_content"] == "thinking it over"
    assert assistant["content"] == "Let me look."
    assert assistant["tool_calls"][0]["function"] == {"name": "get_document", "arguments": '{"docid": "11"}'}
    assert third["messages"][-1]["role"] == "tool" and "long text" in third["messages"][-1]["content"]
    assert second["messages"][2] == {"role": "tool", "content": FakeToolBox().call("search", {}),
                                     "tool_call_id": "call_search"}


def test_cache_salt_and_seed_are_sent_when_configured():
    endpoint = FakeEndpoint([{"content": ANSWER}])
    agent, _ = make_agent(endpoint, cache_salt="q-salt", seed=5, top_k=20, enable_thinking=False)
    agent.run("1", "q", "r.1")
    payload = endpoint.payloads[0]
    assert payload["cache_salt"] == "q-salt" and payload["seed"] == 5 and payload["top_k"] == 20
    assert payload["chat_template_kwargs"]["enable_thinking"] is False


def test_plain_agent_stops_at_the_step_cap_as_incomplete():
    endpoint = FakeEndpoint([native_call("search", query=f"q{i}") for i in range(3)])
    agent, _ = make_agent(endpoint, max_steps=3)
    record = agent.run("1", "q", "r.1").record
    assert record["status"] == "max_steps"
    assert len(endpoint.payloads) == 3
    assert record["result"][-1]["type"] == "output_text"


def test_a_failed_request_ends_the_question_with_an_error_status():
    endpoint = FakeEndpoint([native_call("search", query="x"), ClientError("POST -> 400: bad request", status=400)])
    agent, _ = make_agent(endpoint)
    record = agent.run("1", "q", "r.1").record
    assert record["status"] == "error" and "bad request" in record["error"]


def test_transient_errors_are_retried():
    endpoint = FakeEndpoint([ClientError("503", status=503), ConnectionRefusedError("down"), {"content": ANSWER}])
    agent, _ = make_agent(endpoint)
    record = agent.run("1", "q", "r.1").record
    assert record["status"] == "completed" and len(endpoint.payloads) == 3
    assert record["rids"] == ["r.1.0000"]  # one logical request, three attempts


def test_text_protocol_parsing_variants():
    text, calls = parse_text_tool_calls('Hi\n<tool_call>\n{"name": "search", "arguments": {"query": "a b"}}\n</tool_call>')
    assert text == "Hi" and calls[0].name == "search" and calls[0].arguments == {"query": "a b"}
    text, calls = parse_text_tool_calls("<tool_call>\n<function=search>\n<parameter=query>\nmulti\nline\n</parameter>\n"
                                        "</function>\n</tool_call>\n<tool_call>\n<function=get_document>\n"
                                        "<parameter=docid>\n12\n</parameter>\n</function>\n</tool_call>")
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": "multi\nline"}), ("get_document", {"docid": "12"})]
    _, calls = parse_text_tool_calls("<tool_call>garbage</tool_call>")
    assert calls[0].error
    reply = parse_reply({"choices": [{"message": {"content": "no calls here"}, "finish_reason": "length"}]}, "auto")
    assert reply.tool_calls == [] and reply.protocol is None and reply.finish_reason == "length"
    # "native" never reads calls out of the text.
    reply = parse_reply({"choices": [{"message": {"content": xml_call("search", query="x")["content"]}}]}, "native")
    assert reply.tool_calls == []


def test_the_text_protocol_sends_no_tools_field():
    endpoint = FakeEndpoint([{"content": ANSWER}])
    agent, _ = make_agent(endpoint, tool_protocol="text")
    agent.run("1", "q", "r.1")
    assert "tools" not in endpoint.payloads[0]


def test_a_bad_tool_call_is_an_observation_not_a_crash():
    endpoint = FakeEndpoint([{"content": "<tool_call>garbage</tool_call>"}, {"content": ANSWER}])
    agent, boxes = make_agent(endpoint)
    record = agent.run("1", "q", "r.1").record
    assert record["status"] == "completed"
    assert boxes[0].calls == []
    assert "could not be read" in endpoint.payloads[1]["messages"][-1]["content"]


def test_default_config_mirrors_the_authors_values():
    config = load_config()
    assert config.mode == "clm" and config.edit_gate == "shrink"
    assert (config.max_tokens, config.temperature, config.top_p) == (4096, 0.7, 0.95)
    assert config.strict_target == 26624
    assert config.nudge_ratios == (0.25, 0.5, 0.75) and config.persistent_nudge_ratio == 0.9
    assert (config.max_num_retry_on_limit, config.retry_edit_margin_tokens, config.finalize_nudge_turns) == (6, 2048, 3)
    assert config.observation_max_chars == 60000
    assert AgentConfig(max_steps=500).call_cap == 1024 and AgentConfig(max_steps=500).max_total_iters == 1014
    assert load_config(overrides={"nudge_ratios": "0.2,0.4", "search.k": 3}).nudge_ratios == (0.2, 0.4)
    with pytest.raises(ValueError, match="unknown agent config keys"):
        load_config(overrides={"max_stepz": 3})
    assert load_config().fingerprint() != load_config(overrides={"temperature": 0.0}).fingerprint()
