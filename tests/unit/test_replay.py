"""``eval.replay`` against a fake transport: the request per call, order within a conversation,
concurrency across conversations, mismatch and server failures, resume from ``client.jsonl``,
the progress line, and the CLI's exit statuses."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from eval.replay import run as replay_run
from eval.replay.__main__ import main
from eval.replay.run import Mismatch, Progress, ServerError, UsageError, call_payload, pending, read_done, replay
from eval.soak.client import Reply
from eval.traces.format import TraceCall, write_trace


def trace(conversations=3, turns=3, salt=None) -> list[TraceCall]:
    """Conversations interleaved turn by turn, as an agent run records them."""
    calls = []
    for turn in range(turns):
        for c in range(conversations):
            calls.append(TraceCall(f"c{c}", turn, [1, 2, 3 + turn], [10 + c, 20 + turn], salt))
    return calls


class FakeServer:
    """Answers ``/generate`` with the forced ids (or wrong ones for ``wrong`` rids), after ``delay``
    seconds; records the order of calls and the most conversations/calls in flight at once."""

    def __init__(self, delay=0.0, wrong=(), fail=()):
        self.delay, self.wrong, self.fail = delay, set(wrong), set(fail)
        self.lock = threading.Lock()
        self.order: list[str] = []
        self.in_flight: set[str] = set()
        self.max_in_flight = 0
        self.overlap_in_conversation = False

    def __call__(self, path, payload):
        assert path == "/generate"
        rid = payload["rid"]
        conversation = rid.rsplit(".", 1)[0]
        with self.lock:
            self.overlap_in_conversation |= conversation in self.in_flight
            self.in_flight.add(conversation)
            self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
            self.order.append(rid)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight.discard(conversation)
        if rid in self.fail:
            return Reply(500, {"error": "boom"}, "boom")
        params = payload["sampling_params"]
        ids = list(params.get("custom_params", {}).get("forced_output_ids", []))
        if rid in self.wrong:
            ids = ids[:-1] + [ids[-1] + 1]
        meta = {"prompt_tokens": len(payload["input_ids"]), "completion_tokens": len(ids), "cached_tokens": 2}
        return Reply(200, {"output_ids": ids, "meta_info": meta})


# ---------------------------------------------------------------------- one call


def test_payload_forces_the_completion_with_the_salt():
    call = TraceCall("conv", 4, [5, 6, 7], [8, 9], "tenant-a")
    assert call_payload(call, "r1") == {
        "input_ids": [5, 6, 7], "rid": "r1.conv.4", "extra_key": "tenant-a", "session_id": "r1.conv",
        "sampling_params": {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 2,
                            "custom_params": {"forced_output_ids": [8, 9]}}}


def test_empty_completion_reads_the_prompt_only():
    payload = call_payload(TraceCall("conv", 0, [5], [], None), "r")
    assert payload["sampling_params"] == {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 0}
    assert "extra_key" not in payload


# ---------------------------------------------------------------------- scheduling


def test_conversations_in_order_of_first_appearance_turns_in_order(tmp_path):
    server = FakeServer()
    result = replay(server, trace(), tmp_path, "r", concurrency=1)
    assert result == {"total": 9, "skipped": 0, "sent": 9, "client": str(tmp_path / "client.jsonl")}
    assert server.order == [f"r.c{c}.{t}" for c in range(3) for t in range(3)]
    records = [json.loads(line) for line in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert records[0] == {"rid": "r.c0.0", "conversation": "c0", "turn": 0, "kind": None,
                          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 2},
                          "cached_tokens": 2, "seconds": records[0]["seconds"]}


def test_concurrency_bounds_conversations_in_flight(tmp_path):
    server = FakeServer(delay=0.02)
    replay(server, trace(conversations=5, turns=3), tmp_path, "r", concurrency=2)
    assert server.max_in_flight == 2
    assert not server.overlap_in_conversation
    for c in range(5):
        mine = [rid for rid in server.order if rid.startswith(f"r.c{c}.")]
        assert mine == [f"r.c{c}.{t}" for t in range(3)]


def test_mismatch_stops_and_names_the_rid(tmp_path):
    server = FakeServer(wrong={"r.c1.1"})
    with pytest.raises(Mismatch, match=r"^r\.c1\.1: .*first difference at position 1"):
        replay(server, trace(), tmp_path, "r", concurrency=1)
    assert server.order[-1] == "r.c1.1"  # nothing sent after it
    assert read_done(tmp_path / "client.jsonl") == {"r.c0.0", "r.c0.1", "r.c0.2", "r.c1.0"}


def test_server_failure_is_a_server_error(tmp_path):
    with pytest.raises(ServerError, match=r"^r\.c0\.0: status 500"):
        replay(FakeServer(fail={"r.c0.0"}), trace(), tmp_path, "r")


# ---------------------------------------------------------------------- resume


def test_resume_skips_done_calls_and_continues_a_conversation(tmp_path):
    with pytest.raises(Mismatch):
        replay(FakeServer(wrong={"r.c1.1"}), trace(), tmp_path, "r")
    server = FakeServer()
    result = replay(server, trace(), tmp_path, "r")
    assert server.order == ["r.c1.1", "r.c1.2", "r.c2.0", "r.c2.1", "r.c2.2"]
    assert result["skipped"] == 4 and result["sent"] == 5
    rids = [json.loads(line)["rid"] for line in (tmp_path / "client.jsonl").read_text().splitlines()]
    assert sorted(rids) == sorted(call.rid("r") for call in trace())
    # Another run name in the same directory replays everything.
    other = FakeServer()
    replay(other, trace(), tmp_path, "s")
    assert len(other.order) == 9


def test_pending_groups_by_conversation():
    queues = pending(trace(), {"r.c0.0", "r.c2.0", "r.c2.1", "r.c2.2"}, "r")
    assert [[c.rid("r") for c in q] for q in queues] == [["r.c0.1", "r.c0.2"], ["r.c1.0", "r.c1.1", "r.c1.2"]]


def test_torn_last_line_is_cut_and_a_bad_line_refused(tmp_path):
    path = tmp_path / "client.jsonl"
    path.write_text('{"rid": "a"}\n{"rid": "b"}\n{"rid": "c", "usa')
    assert read_done(path) == {"a", "b"}
    assert path.read_text() == '{"rid": "a"}\n{"rid": "b"}\n'
    path.write_text('{"rid": "a"}\n{"rid": "b"}')  # whole record, newline missing
    assert read_done(path) == {"a", "b"} and path.read_text().endswith("}\n")
    path.write_text('{"rid": "a"}\nnot json\n{"rid": "b"}\n')
    with pytest.raises(UsageError, match="line 2 is not a client record"):
        read_done(path)


# ---------------------------------------------------------------------- progress


def test_progress_line():
    stream = io.StringIO()
    clock = iter([100.0, 110.0, 120.0, 121.0])
    meter = Progress(total=10, done=2, stream=stream, every=5.0, clock=lambda: next(clock))  # started at 100
    meter.tick()  # 110: 3/10 done, one call sent in 10 s
    meter.tick()  # 120
    lines = stream.getvalue().splitlines()
    assert lines[0] == "replay: 3/10 calls (30%), 0.10 calls/s, ETA 70 s"
    assert lines[1] == "replay: 4/10 calls (40%), 0.10 calls/s, ETA 60 s"
    meter.tick()  # 121: within 5 s of the last line, nothing printed
    assert len(stream.getvalue().splitlines()) == 2


# ---------------------------------------------------------------------- CLI


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "trace.jsonl"
    write_trace(trace(conversations=2, turns=2), path)
    return path


@pytest.mark.parametrize("args, words", [
    (["--server", "http://10.0.0.1:30000"], "only a loopback server"),
    (["--concurrency", "0"], "must be >= 1"),
    (["--run-id", "a.b"], "without white space or '.'"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace /nonexistent/trace.jsonl"),
])
def test_usage_errors_exit_2_with_one_line(args, words, trace_file, tmp_path, capsys):
    base = {"--server": "http://127.0.0.1:1", "--trace": str(trace_file), "--out": str(tmp_path / "out")}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = [item for pair in base.items() for item in pair]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and err.startswith("python -m eval.replay: error: ")


def test_malformed_trace_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"conversation": "c", "turn": 1, "prompt_ids": [1], "completion_ids": [], "cache_salt": null}\n')
    assert main(["--server", "http://127.0.0.1:1", "--trace", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "turn 1, expected 0" in capsys.readouterr().err


def test_cli_end_to_end_with_a_fake_transport(trace_file, tmp_path, capsys, monkeypatch):
    server = FakeServer(wrong={"x.c1.1"})
    monkeypatch.setattr(replay_run, "check_reachable", lambda base: None)
    headers_sent = []

    def request(base, path, payload, timeout, headers=None):
        headers_sent.append(headers)
        return server(path, payload)

    monkeypatch.setattr(replay_run.client, "request", request)
    argv = ["--server", "http://localhost:30000/", "--trace", str(trace_file), "--out", str(tmp_path / "o"),
            "--run-id", "x", "--concurrency", "1"]
    assert main(argv) == 1  # the server's ids differ from the trace: a failed check
    assert "x.c1.1" in capsys.readouterr().err
    server.wrong.clear()
    assert main(argv) == 0
    assert "1 calls sent, 3 already done, 4 in the trace" in capsys.readouterr().out
    assert set(map(str, headers_sent)) == {"None"}  # no routing header unless asked


def test_router_mode_sends_the_envelope_and_the_routing_key(trace_file, tmp_path, monkeypatch):
    server, sent = FakeServer(wrong=set()), []

    def request(base, path, payload, timeout, headers=None):
        sent.append((payload["rid"], headers))
        forced = payload.pop("custom_logit_processor", None)  # what the router keeps
        assert "custom_params" not in payload["sampling_params"]
        if forced is not None:
            payload["sampling_params"]["custom_params"] = json.loads(forced)
        return server(path, payload)

    monkeypatch.setattr(replay_run, "check_reachable", lambda base: None)
    monkeypatch.setattr(replay_run.client, "request", request)
    argv = ["--server", "http://localhost:30000/", "--trace", str(trace_file), "--out", str(tmp_path / "o"),
            "--run-id", "x", "--router"]
    assert main(argv) == 0
    assert sent and all(headers == {"x-smg-routing-key": rid.rsplit(".", 1)[0]} for rid, headers in sent)
