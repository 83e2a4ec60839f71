"""Files that survive a full disk or a crash (issue 25, item 2): ``serving/jsonl_append.py`` never
raises for a failed write, loops over short writes, ends a cut line and marks what it lost; the
reader rule of ``policy.events`` skips and names cut lines and still refuses corruption."""

from __future__ import annotations

import errno
import json
import logging
import os
from types import SimpleNamespace

import pytest

from eval import server as eval_server
from eval.traces.record import ServerTrace
from patches import trace_writer
from policy import faults
from policy.events import (LOST, JsonlError, events_file_health, parse_jsonl, read_events, read_jsonl,
                           read_startups)
from serving import jsonl_append
from serving.event_writer import EventWriter
from serving.jsonl_append import LOST_LINE, JsonlAppender, encode
from tests.unit.test_events import make_event

REAL_WRITE = os.write


class Disk:
    """``os.write`` as a filling disk would do it: each scripted step is ``"ok"`` (write it all),
    an int (write that many bytes and return the count: a short write) or ``"full"`` (ENOSPC)."""

    def __init__(self, monkeypatch, *steps):
        self.steps = list(steps)
        self.calls: list[bytes] = []
        monkeypatch.setattr(jsonl_append.os, "write", self.write)

    def write(self, fd, data):
        data = bytes(data)
        self.calls.append(data)
        step = self.steps.pop(0) if self.steps else "ok"
        if step == "full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if step == "eio":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return REAL_WRITE(fd, data if step == "ok" else data[:step])


@pytest.fixture
def plan(monkeypatch):
    """A ``CACHE_POLICY_FAULTS`` spec for this process, with fresh counters."""
    monkeypatch.setattr(faults, "_CALLS", {})

    def install(text):
        monkeypatch.setattr(faults, "_PLAN", faults.parse(text))
    return install


def lost_lines(caplog) -> list[dict]:
    return [LOST_LINE.search(r.getMessage()).groupdict() for r in caplog.records
            if r.levelno == logging.ERROR and LOST_LINE.search(r.getMessage())]


def row(n: int) -> dict:
    return {"rid": f"r{n}", "n": n}


# ---------------------------------------------------------------------- the writer


def test_a_short_write_then_a_full_disk_loses_one_record_and_the_next_write_recovers(tmp_path, monkeypatch, caplog):
    path = tmp_path / "events.jsonl"
    writer = JsonlAppender(str(path))
    assert writer.append(row(1)) is True
    disk = Disk(monkeypatch, 5, "full")  # 5 bytes of r2's line, then the disk is full
    with caplog.at_level(logging.ERROR, logger="serving.jsonl_append"):
        assert writer.append(row(2), key="r2") is False
    assert writer.lost == 1
    assert path.read_bytes() == encode(row(1)) + encode(row(2))[:5]  # the short write was continued, then cut
    assert lost_lines(caplog) == [{"path": str(path), "error": "ENOSPC", "reason": "No space left on device",
                                   "since": "1", "total": "1"}]
    assert disk.calls[1] == encode(row(2))[5:]  # the loop asked for the rest, not the whole line again
    read = read_jsonl(str(path))  # while the disk is full: the cut last line is skipped and named
    assert read.rows == [(1, row(1))] and read.cut == [f"{path}:2: a cut line (5 bytes) skipped"] and read.lost == 0

    assert writer.append(row(3)) is True
    marker_write, row_write = disk.calls[2:]
    assert marker_write.startswith(b"\n") and json.loads(marker_write)["record"] == LOST  # ends the cut line
    assert row_write == encode(row(3))  # the row in a write of its own
    writer.close()
    read = read_jsonl(str(path))
    assert read.rows == [(1, row(1)), (4, row(3))]
    assert read.cut == [f"{path}:2: a cut line (5 bytes) skipped"] and read.lost == 1
    marker = json.loads(path.read_text().splitlines()[2])
    assert (marker["count"], marker["error"]) == (1, "ENOSPC") and marker["first_ts"] <= marker["last_ts"]


def test_losses_since_the_last_good_write_add_up_in_the_log_and_the_marker(tmp_path, monkeypatch, caplog):
    path = tmp_path / "e.jsonl"
    writer = JsonlAppender(str(path))
    Disk(monkeypatch, "full", "eio", "ok", "ok")
    with caplog.at_level(logging.ERROR, logger="serving.jsonl_append"):
        assert [writer.append(row(n)) for n in range(3)] == [False, False, True]
    assert [(line["error"], line["since"], line["total"]) for line in lost_lines(caplog)] == [
        ("ENOSPC", "1", "1"), ("EIO", "2", "2")]
    (marker, last) = [json.loads(line) for line in path.read_text().splitlines()]
    assert (marker["record"], marker["count"], marker["error"]) == (LOST, 2, "EIO") and last == row(2)
    assert read_jsonl(str(path)) == read_jsonl(str(path)).__class__(rows=[(2, row(2))], cut=[], lost=2)


def test_a_failed_marker_write_is_a_second_cut_line_and_both_are_skipped(tmp_path, monkeypatch):
    """A full disk cuts the record, then the marker meant to explain it; the next good write
    ends the second cut line with the marker that counts both records."""
    path = tmp_path / "e.jsonl"
    writer = JsonlAppender(str(path))
    Disk(monkeypatch, "ok", 7, "full", 9, "full")
    assert [writer.append(row(n)) for n in range(4)] == [True, False, False, True]
    writer.close()
    read = read_jsonl(str(path))
    assert [r for _, r in read.rows] == [row(0), row(3)] and read.lost == 2
    assert read.cut == [f"{path}:2: a cut line (7 bytes) skipped", f"{path}:3: a cut line (8 bytes) skipped"]


def test_append_never_raises_and_close_writes_a_marker_still_owed(tmp_path, monkeypatch):
    path = tmp_path / "e.jsonl"
    writer = EventWriter(str(path))
    disk = Disk(monkeypatch, "eio", "eio", "eio")
    assert writer.write(make_event(rid="a")) is False and writer.write(make_event(rid="b")) is False
    writer.close()  # its marker write fails too: nothing raised
    assert path.read_bytes() == b"" and writer.lost == 2 and len(disk.calls) == 3
    writer = EventWriter(str(path))
    assert writer.write(make_event(rid="c")) is True
    Disk(monkeypatch, 3, "full")
    assert writer.write(make_event(rid="d")) is False
    writer.close()  # the disk has room again: the marker goes out
    assert [e.rid for e in read_events(str(path))] == ["c"]
    assert events_file_health(str(path)) == {"cut": [f"{path}:2: a cut line (3 bytes) skipped"], "lost": 1}


def test_a_write_that_makes_no_progress_is_a_full_disk_not_a_spin(tmp_path, monkeypatch):
    writer = JsonlAppender(str(tmp_path / "e.jsonl"))
    monkeypatch.setattr(jsonl_append.os, "write", lambda fd, data: 0)
    assert writer.append(row(1)) is False and writer.lost == 1


@pytest.mark.parametrize("tail, lost, cut", [
    pytest.param(b'{"rid": "old", "n"', 1, ["{path}:2: a cut line (18 bytes) skipped"], id="cut-tail"),
    pytest.param(b'{"rid": "old"}', 0, [], id="whole-record-without-newline"),
])
def test_a_writer_takes_over_a_file_left_inside_a_line(tmp_path, tail, lost, cut):
    path = tmp_path / "e.jsonl"
    path.write_bytes(encode(row(0)) + tail)
    writer = JsonlAppender(str(path))
    assert writer.append(row(1)) is True
    writer.close()
    read = read_jsonl(str(path))
    assert read.cut == [c.format(path=path) for c in cut] and read.lost == lost
    assert [r for _, r in read.rows][-1] == row(1) and writer.lost == 0
    if lost:
        marker = json.loads(path.read_text().splitlines()[2])
        assert (marker["count"], marker["error"]) == (1, "cut")


# ---------------------------------------------------------------------- injected faults


def test_injected_event_faults_lose_the_third_and_fourth_writes(tmp_path, plan, caplog):
    """Each item counts the calls that reach it (``policy/faults.py``): the first ``@3`` ends the
    3rd call, so the second ``@3`` reaches its 3rd call at the 4th write."""
    plan("events.write@3,events.write@3")
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    with caplog.at_level(logging.ERROR, logger="serving.jsonl_append"):
        written = [writer.write(make_event(rid=f"r{n}")) for n in range(1, 7)]
    writer.close()
    assert written == [True, True, False, False, True, True]
    assert [e.rid for e in read_events(str(path))] == ["r1", "r2", "r5", "r6"]
    read = read_jsonl(str(path))
    half = len(encode(make_event(rid="r3").to_dict())) // 2
    assert read.lost == 2 and read.cut == [f"{path}:3: a cut line ({half} bytes) skipped",
                                           f"{path}:5: a cut line ({half} bytes) skipped"]
    lines = lost_lines(caplog)
    assert [(line["error"], line["total"]) for line in lines] == [("ENOSPC", "1"), ("ENOSPC", "2")]
    assert all("injected" in line["reason"] for line in lines)


def test_an_injected_fault_on_the_last_write_leaves_a_cut_last_line(tmp_path, plan):
    plan("events.write~b@1")
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    assert writer.write(make_event(rid="a")) is True and writer.write(make_event(rid="b")) is False
    assert not path.read_text().endswith("\n")
    assert eval_server.request_events(path) == [make_event(rid="a").to_dict()]  # a poll mid-failure
    assert [e.rid for e in read_events(str(path))] == ["a"]


def test_the_start_up_record_passes_no_fault_point(tmp_path, plan):
    from serving.event_writer import write_startup
    from tests.unit.test_events import make_startup

    plan("events.write@1+")
    assert write_startup(str(tmp_path / "e.jsonl"), make_startup()) is True
    assert len(read_startups(str(tmp_path / "e.jsonl"))) == 1


def test_injected_trace_faults_are_cut_lines_the_trace_reader_names(tmp_path, plan, monkeypatch):
    plan("trace.write@2")
    path = tmp_path / "trace.jsonl"
    monkeypatch.setitem(trace_writer._state, "writer", JsonlAppender(str(path), trace_writer.FAULT_POINT))
    for n in range(3):
        trace_writer._write(SimpleNamespace(rid=f"t{n}", extra_key=None, origin_input_ids=[1, 2], output_ids=[3],
                                            finished_reason=None), "stop")
    server = ServerTrace(path, ["t0", "t1", "t2"])
    server.poll()
    assert server.missing() == ["t1"] and server.lost == 1 and len(server.cut) == 1
    assert server.cut[0].startswith(f"{path}:2: a cut line")


def test_the_trace_reader_waits_for_the_marker_after_a_cut_line(tmp_path):
    """Bad lines just before an unended one may be cut lines whose marker is still coming."""
    path = tmp_path / "trace.jsonl"
    line = json.dumps({"rid": "a", "cache_salt": None, "prompt_ids": [1], "completion_ids": [2],
                       "finish_reason": "stop"}) + "\n"
    marker = encode({"record": LOST, "count": 2, "error": "ENOSPC", "first_ts": 1.0, "last_ts": 2.0})
    path.write_text(line + '{"rid": "b", "pro\n' + marker.decode()[:6])
    server = ServerTrace(path, ["a", "c"])
    server.poll()
    assert set(server.finished) == {"a"} and server.cut == []
    with open(path, "a") as f:
        f.write("\n" + marker.decode() + line.replace('"a"', '"c"'))
    server.poll()
    assert set(server.finished) == {"a", "c"} and server.lost == 2
    assert server.cut == [f"{path}:2: a cut line (17 bytes) skipped", f"{path}:3: a cut line (6 bytes) skipped"]


# ---------------------------------------------------------------------- the reader rule


def test_a_file_truncated_mid_line_reads_with_its_last_line_named(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    for rid in ("a", "b"):
        writer.write(make_event(rid=rid))
    writer.close()
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # a crash cut the last line
    read = read_jsonl(str(path))
    assert [r["rid"] for _, r in read.rows] == ["a"] and read.lost == 0
    assert read.cut == [f"{path}:2: a cut line ({len(data) // 2 - 40} bytes) skipped"]
    assert [e.rid for e in read_events(str(path))] == ["a"]
    assert [r["rid"] for r in eval_server.request_events(path)] == ["a"]


@pytest.mark.parametrize("text, line", [
    pytest.param('{"a": 1}\n{"b": \n{"c": 3}\n', 2, id="bad-line-then-a-record"),
    pytest.param('{"a": 1}\n{"b": \n', 2, id="bad-last-line-with-its-newline"),
    pytest.param('{"a": 1}\n{"b": \n{"rid": "x"}\n{"record": "lost", "count": 1}\n', 2,
                 id="a-record-between-the-bad-line-and-the-marker"),
])
def test_a_bad_line_not_explained_by_a_marker_or_the_end_still_raises(tmp_path, text, line):
    path = tmp_path / "e.jsonl"
    path.write_text(text)
    with pytest.raises(JsonlError) as info:
        read_jsonl(str(path))
    assert str(info.value).startswith(f"{path}:{line}: ") and info.value.line == line
    with pytest.raises(ValueError, match=f"{path}:{line}: "):
        read_startups(str(path))


def test_cut_lines_before_a_marker_are_skipped_with_blank_lines_between(tmp_path):
    text = '{"a": 1}\n{"b"\n\n{"c": [\n  \n{"record": "lost", "count": 3}\n{"d": 4}\n'
    read = parse_jsonl(text.encode(), "f", first_line=10)
    assert read.rows == [(10, {"a": 1}), (16, {"d": 4})] and read.lost == 3
    assert read.cut == ["f:11: a cut line (4 bytes) skipped", "f:13: a cut line (7 bytes) skipped"]


def test_a_cut_line_before_a_restart_is_skipped_so_the_server_can_start_again(tmp_path):
    """A writer that cut a line, ended it, and died before its marker got out: the file ends in an
    ended bad line, which alone is corruption; the next server's start-up record explains it
    (a crash), so the restart and every reader go on (and name the line)."""
    from policy.events import next_start, read_jsonl, startup_record

    path = tmp_path / "events.jsonl"
    first = json.dumps(startup_record("radix", {}, {}, [], 1, 1.0))
    path.write_text(first + '\n{"rid": "b\n')
    with pytest.raises(ValueError):
        read_jsonl(str(path))  # nothing explains the bad line yet
    with open(path, "a") as f:
        f.write(json.dumps(startup_record("radix", {}, {}, [], 2, 2.0, start=2, previous={"pid": 1, "ts": 1.0})) + "\n")
    read = read_jsonl(str(path))
    assert [row["pid"] for _, row in read.rows] == [1, 2] and read.cut == [f"{path}:2: a cut line (10 bytes) skipped"]
    assert next_start(str(path))[0] == 3


def test_closing_twice_is_harmless(tmp_path):
    from serving.jsonl_append import JsonlAppender

    writer = JsonlAppender(str(tmp_path / "e.jsonl"))
    assert writer.append({"a": 1})
    writer.close()
    writer.close()
    assert (tmp_path / "e.jsonl").read_text() == '{"a": 1}\n'
