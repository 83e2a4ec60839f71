"""Recording traces: the server's ``--cache-trace`` line (``serving/trace_record.py``, written by
``patches/trace_writer.py``), the launcher
flag, the join with the client's calls (``eval/traces/record.py``) and the BCP and workload
callers (``eval/bcp/trace.py``, ``eval.workload.write_run_trace``)."""

from __future__ import annotations

import json
import os
from array import array
from types import SimpleNamespace

import pytest

from eval import workload
from eval.bcp import trace as bcp_trace
from eval.traces.format import TraceError, read_trace
from eval.traces.record import ClientCall, record_trace
from patches import launch_server, targets, trace_writer
from serving.jsonl_append import JsonlAppender
from serving.trace_record import trace_record


class Reason:
    def __init__(self, kind: str):
        self.kind = kind

    def to_json(self):
        return {"type": self.kind}


def fake_req(rid="r1", prompt=(5, 6, 7), output=(8, 9), salt="s", reason="length", finished=True):
    return SimpleNamespace(rid=rid, extra_key=salt, origin_input_ids=array("q", prompt), output_ids=list(output),
                           finished_reason=Reason(reason) if reason else None, finished=lambda: finished)


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------- the server side


def test_trace_line_has_the_exact_ids_and_the_salt():
    assert trace_writer.trace_line(fake_req()) == {
        "rid": "r1", "cache_salt": "s", "prompt_ids": [5, 6, 7], "completion_ids": [8, 9], "finish_reason": "length"}
    assert trace_writer.trace_line(fake_req(salt=None, reason=None), "abort")["finish_reason"] == "abort"


@pytest.mark.parametrize("args, expected", [
    (("r", None, [1], [], None),
     {"rid": "r", "cache_salt": None, "prompt_ids": [1], "completion_ids": [], "finish_reason": None}),
    (("r", "s", array("q", [5, 6]), (True, 7), "stop"),
     {"rid": "r", "cache_salt": "s", "prompt_ids": [5, 6], "completion_ids": [1, 7], "finish_reason": "stop"}),
], ids=["empty-completion", "array-and-tuple"])
def test_trace_record_copies_ids_into_plain_ints(args, expected):
    record = trace_record(*args)
    assert record == expected and all(type(t) is int for t in record["prompt_ids"] + record["completion_ids"])


def test_writer_appends_one_sorted_line_per_request(tmp_path):
    path = tmp_path / "sub" / "trace.jsonl"
    writer = JsonlAppender(str(path))
    writer.append(trace_writer.trace_line(fake_req("a")))
    writer.append(trace_writer.trace_line(fake_req("b", output=())))
    writer.close()
    lines = path.read_text().splitlines()
    assert lines[0] == ('{"cache_salt": "s", "completion_ids": [8, 9], "finish_reason": "length", '
                        '"prompt_ids": [5, 6, 7], "rid": "a"}')
    assert json.loads(lines[1])["completion_ids"] == []


def test_no_hooks_without_the_env(monkeypatch):
    monkeypatch.delenv(trace_writer.TRACE_ENV, raising=False)
    registered = []
    assert trace_writer.install(lambda *a: registered.append(a)) is False
    assert registered == []


def test_hooks_write_finished_and_popped_requests_only(monkeypatch, tmp_path):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace_writer.TRACE_ENV, str(path))
    monkeypatch.setitem(trace_writer._state, "writer", None)
    hooks = {}
    assert trace_writer.install(lambda target, hook, kind: hooks.setdefault(target, hook)) is True
    assert set(hooks) == {targets.SCHEDULER_INIT, targets.RELEASE_KV, targets.ABORT}
    follower = SimpleNamespace(ps=SimpleNamespace(attn_tp_rank=1, attn_cp_rank=0, pp_rank=0))
    hooks[targets.SCHEDULER_INIT](None, follower)
    assert trace_writer._state["writer"] is None  # only the leader writes
    leader = SimpleNamespace(ps=SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, pp_rank=0),
                             waiting_queue=[fake_req("q.1", output=(), reason=None, finished=False),
                                            fake_req("other", reason=None, finished=False)])
    hooks[targets.SCHEDULER_INIT](None, leader)
    hooks[targets.RELEASE_KV](fake_req("done"), None)
    hooks[targets.RELEASE_KV](fake_req("retracted", finished=False), None)  # released, read again later
    hooks[targets.ABORT](leader, SimpleNamespace(rid="q.", abort_all=False))
    rows = read_rows(path)
    assert [(r["rid"], r["finish_reason"]) for r in rows] == [("done", "length"), ("q.1", "abort")]
    assert rows[1]["completion_ids"] == []


def test_launcher_takes_the_flag_off_and_passes_the_path(monkeypatch, tmp_path):
    spec, rest = launch_server.parse(["--model-path", "m", "--cache-trace", "t.jsonl", "--port", "3"])
    assert rest == ["--model-path", "m", "--port", "3"] and spec.events_path is None
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(trace_writer.TRACE_ENV, raising=False)
    launch_server._pass_trace_path(["--cache-trace", "t.jsonl"])
    assert os.environ[trace_writer.TRACE_ENV] == str(tmp_path / "t.jsonl")
    launch_server._pass_trace_path(["--model-path", "m"])  # absent: a stale value is removed
    assert trace_writer.TRACE_ENV not in os.environ


# ---------------------------------------------------------------------- the join


def server_line(rid, prompt, completion, reason="stop", salt=None):
    return json.dumps({"rid": rid, "cache_salt": salt, "prompt_ids": prompt, "completion_ids": completion,
                       "finish_reason": reason}) + "\n"


def test_join_keeps_client_order_and_drops_other_rids(tmp_path):
    server = tmp_path / "server.jsonl"
    server.write_text(server_line("warmup", [1], [2]) + server_line("run.b.0", [7, 8], [9], salt="k")
                      + server_line("run.a.0", [1, 2], [3]) + server_line("run.a.1", [0], [], "abort")
                      + server_line("run.a.1", [1, 2, 3, 4], [5, 6], "length"))
    calls = [("run.a.0", "a", 0), ClientCall("run.b.0", "b", 0, kind="tool", meta={"x": 1}),
             {"rid": "run.a.1", "conversation": "a", "turn": 1, "messages": [{"role": "user", "content": "hi"}]}]
    trace = record_trace(server, calls, tmp_path / "out" / "trace.jsonl", timeout=0)
    assert read_trace(tmp_path / "out" / "trace.jsonl") == trace
    assert [(c.conversation, c.turn) for c in trace] == [("a", 0), ("b", 0), ("a", 1)]
    assert trace[1].prompt_ids == [7, 8] and trace[1].completion_ids == [9] and trace[1].cache_salt == "k"
    assert trace[1].kind == "tool" and trace[1].meta == {"x": 1, "rid": "run.b.0", "finish_reason": "stop"}
    # the retried rid: its abort line is ignored, the finished one taken
    assert trace[2].prompt_ids == [1, 2, 3, 4] and trace[2].messages == [{"role": "user", "content": "hi"}]


def test_a_call_without_a_server_line_is_an_error_naming_it(tmp_path):
    server = tmp_path / "server.jsonl"
    server.write_text(server_line("r.0", [1], [2]) + server_line("r.1", [0], [], "abort"))
    with pytest.raises(TraceError, match=r"rid r\.2 \(conversation 'c' turn 1\) has no line"):
        record_trace(server, [("r.0", "c", 0), ("r.2", "c", 1)], tmp_path / "t.jsonl", timeout=0.3)
    with pytest.raises(TraceError, match=r"rid r\.1 .* has only an aborted line"):
        record_trace(server, [("r.1", "c", 0)], tmp_path / "t.jsonl", timeout=0)
    assert not (tmp_path / "t.jsonl").exists()


def test_client_calls_are_checked_before_waiting(tmp_path):
    with pytest.raises(TraceError, match="turn 2, expected 1"):
        record_trace(tmp_path / "absent.jsonl", [("r.0", "c", 0), ("r.2", "c", 2)], tmp_path / "t.jsonl")
    with pytest.raises(TraceError, match="rid r.0 is named by two client calls"):
        record_trace(tmp_path / "absent.jsonl", [("r.0", "c", 0), ("r.0", "d", 0)], tmp_path / "t.jsonl")


def test_a_partial_last_line_waits_for_the_rest(tmp_path):
    from eval.traces.record import ServerTrace

    path = tmp_path / "server.jsonl"
    whole = server_line("r.0", [1], [2])
    path.write_text(whole[:20])
    server = ServerTrace(path, ["r.0"])
    server.poll()
    assert server.missing() == ["r.0"]
    with open(path, "a") as f:
        f.write(whole[20:] + "not json\n")
    with pytest.raises(TraceError, match=r"server\.jsonl:2: not JSON"):
        server.poll()
    assert server.finished["r.0"]["prompt_ids"] == [1]


# ---------------------------------------------------------------------- callers


def test_bcp_calls_final_attempt_answered_in_sending_order():
    rows = [
        {"rid": "run.7~1.0000", "qid": "7", "turn": 0, "kind": "agent", "t_send": 5.0},
        {"rid": "run.7~1.0001", "qid": "7", "turn": 1, "kind": "agent", "t_send": 7.0, "error": "overflow"},
        {"rid": "run.7~1.0002", "qid": "7", "turn": 2, "kind": "agent", "t_send": 8.0},
        {"rid": "run.9.0000", "qid": "9", "turn": 0, "kind": "agent", "t_send": 6.0},
        {"rid": "run.7.0000", "qid": "7", "turn": 0, "kind": "agent", "t_send": 1.0},  # the interrupted attempt
    ]
    records = [{"rids": ["run.7~1.0000", "run.7~1.0001", "run.7~1.0002"]}, {"rids": ["run.9.0000"]}]
    calls = bcp_trace.client_calls(rows, records, {"enable_thinking": False})
    assert [(c.rid, c.conversation, c.turn, c.meta["call"]) for c in calls] == [
        ("run.7~1.0000", "7", 0, 0), ("run.9.0000", "9", 0, 0), ("run.7~1.0002", "7", 1, 2)]
    assert calls[0].chat_template_kwargs == {"enable_thinking": False} and calls[0].kind == "agent"


def test_bcp_collect_trace_writes_the_run_trace(tmp_path):
    (tmp_path / "client_requests.jsonl").write_text(json.dumps(
        {"rid": "run.1.0000", "qid": "1", "turn": 0, "kind": "agent", "t_send": 1.0}) + "\n")
    server = tmp_path / "server.jsonl"
    server.write_text(server_line("judge-1", [4], [4]) + server_line("run.1.0000", [1, 2], [3]))
    assert bcp_trace.collect_trace(server, tmp_path, [{"rids": ["run.1.0000"]}], timeout=0) == 1
    (call,) = read_trace(tmp_path / bcp_trace.TRACE)
    assert (call.conversation, call.turn, call.prompt_ids, call.completion_ids) == ("1", 0, [1, 2], [3])


def test_workload_run_trace(tmp_path):
    def endpoint(path, payload):
        return {"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}

    records = workload.run(endpoint, tmp_path, conversations=1, run_name="w", progress=False)
    assert "messages" not in json.loads((tmp_path / "client.jsonl").read_text().splitlines()[0])
    server = tmp_path / "server.jsonl"
    server.write_text("".join(server_line(r["rid"], [1, r["turn"]], [2]) for r in records))
    trace = read_trace(workload.write_run_trace(records, server, tmp_path, timeout=0))
    assert [(c.conversation, c.turn, c.kind) for c in trace] == [("c0", t, k) for t, k in enumerate(workload.TURN_KINDS)]
    assert trace[3].messages == records[3]["messages"] and trace[3].prompt_ids == [1, 3]
