"""A restart is a cold start, said out loud (issue 25, item 3): the start-up record counts the
starts of its file, the launcher logs a restart, and ``eval.report ingest`` splits a run there,
keeps a retried rid once and says how many answered calls have no event."""

from __future__ import annotations

import csv
import json
import logging
import os

import pytest

from eval import report
from policy.events import RequestEvent, next_start, read_startups, startup_record
from serving.event_writer import RESTART_LINE, EventWriter, write_startup, write_startup_record


def event(rid: str, prompt: int, reused: int, finished: float = 1.0) -> RequestEvent:
    return RequestEvent(rid=rid, policy="exact", prompt_tokens=prompt, prefix_reused=reused, moved=0,
                        read=prompt - reused, decode_tokens=2, cache_salt=None, plan_resume=reused,
                        finish_reason="stop", queued_ts=finished - 0.5, finished_ts=finished)


def startup(pid: int, ts: float, **fields) -> dict:
    return startup_record("exact", {}, {"sglang": "0.5.16"}, ["--model-path", "m"], pid, ts, **fields)


def write_file(path, items) -> None:
    """Events (``RequestEvent``) and start-up records (dicts) in order, as the server writes them."""
    writer = EventWriter(str(path))
    for item in items:
        if isinstance(item, dict):
            write_startup(str(path), item)
        else:
            writer.write(item)
    writer.close()


# ---------------------------------------------------------------------- the start-up record


def test_a_second_start_on_one_file_is_a_restart_with_a_cold_cache(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    with caplog.at_level(logging.INFO, logger="serving.event_writer"):
        first = write_startup_record(str(path), "radix", {}, ["--model-path", "m"])
        assert not [r for r in caplog.records if RESTART_LINE.search(r.getMessage())]
        second = write_startup_record(str(path), "radix", {}, ["--model-path", "m"])
    assert (first["start"], first["restart"], first["cache"], first["previous"]) == (1, False, "cold", None)
    assert (second["start"], second["restart"], second["cache"]) == (2, True, "cold")
    assert second["previous"] == {"pid": os.getpid(), "ts": first["ts"]}
    assert read_startups(str(path)) == [first, second]
    (line,) = [RESTART_LINE.search(r.getMessage()) for r in caplog.records if RESTART_LINE.search(r.getMessage())]
    assert line.groupdict() == {"path": str(path), "start": "2", "pid": str(os.getpid())}


def test_old_start_up_records_without_the_fields_still_read_and_count_by_position(tmp_path):
    path = tmp_path / "events.jsonl"
    old = [{"record": "startup", "policy": "radix", "settings": {}, "pid": pid, "ts": ts} for pid, ts in ((5, 1.0), (6, 2.0))]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert read_startups(str(path)) == old
    assert next_start(str(path)) == (3, {"pid": 6, "ts": 2.0})
    assert next_start(str(tmp_path / "missing.jsonl")) == (1, None)


def test_the_start_after_a_crash_that_cut_the_last_line(tmp_path):
    path = tmp_path / "events.jsonl"
    write_file(path, [startup(5, 1.0), event("a.0", 10, 0)])
    path.write_bytes(path.read_bytes()[:-20])  # the server died in the middle of a line
    record = write_startup_record(str(path), "exact", {}, [])
    assert (record["start"], record["previous"]) == (2, {"pid": 5, "ts": 1.0})
    run = report.merged_run(path)
    assert run.events == []  # the cut event is gone, and named
    cut_size = len(json.dumps(event("a.0", 10, 0).to_dict(), sort_keys=True)) - 19  # 20 bytes off, the newline one
    assert run.files[0].lost == 1 and run.files[0].cut == [f"{path}:2: a cut line ({cut_size} bytes) skipped"]
    assert run.files[0].last_start == 2  # the new start's record follows the marker the new writer wrote


# ---------------------------------------------------------------------- ingest


def test_a_restart_splits_the_run_into_starts_with_their_own_shares(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    write_file(path, [startup(5, 0.0), event("c.0", 100, 0, 1.0), event("c.1", 200, 100, 2.0),
                      startup(6, 3.0, start=2, previous={"pid": 5, "ts": 0.0}),
                      event("c.2", 300, 0, 4.0), event("d.0", 100, 50, 5.0)])
    rows, failures = report.ingest(path, tmp_path / "out")
    assert failures == []
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["starts"] == [
        {"file": str(path), "start": 1, "restart": False, "requests": 2,
         "prefix_reused_share": 100 / 300, "moved_share": 0.0, "read_share": 200 / 300},
        {"file": str(path), "start": 2, "restart": True, "requests": 2,
         "prefix_reused_share": 50 / 400, "moved_share": 0.0, "read_share": 350 / 400},
    ]
    assert summary["all"]["requests"] == 4 and summary["all"]["prefix_reused_share"] == 150 / 700
    assert capsys.readouterr().err.strip() == report.SPLIT_LINE.format(n=1)
    with open(tmp_path / "out" / "requests.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["rid"], r["start"], r["class"]) for r in table] == [
        ("c.0", "1", "first"), ("c.1", "1", "append"), ("c.2", "2", "first"), ("d.0", "2", "first")]


def test_no_split_line_without_a_restart(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    write_file(path, [startup(5, 0.0), event("c.0", 100, 0)])
    report.ingest(path, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [s["restart"] for s in summary["starts"]] == [False] and capsys.readouterr().err == ""


def test_a_rid_retried_after_a_restart_is_kept_once_the_later_copy(tmp_path):
    path = tmp_path / "events.jsonl"
    write_file(path, [startup(5, 0.0), event("c.0", 100, 0, 1.0), event("c.1", 200, 100, 2.0),
                      startup(6, 3.0, start=2), event("c.1", 200, 0, 4.0)])
    rows, failures = report.ingest(path, tmp_path / "out")
    assert failures == [] and [(r.rid, r.prefix_reused, r.start) for r in rows] == [("c.0", 0, 1), ("c.1", 0, 2)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["retried_after_restart"] == ["c.1"]


def test_a_rid_in_a_worker_that_restarted_and_in_another_is_a_retry(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_file(a, [startup(5, 0.0), event("c.0", 100, 0, 1.0), startup(7, 2.0, start=2)])
    write_file(b, [startup(6, 0.0), event("c.0", 100, 0, 3.0), event("c.1", 200, 100, 4.0)])
    run = report.merged_run([a, b])
    assert [(e.rid, seg) for e, seg in zip(run.events, run.segments)] == [("c.0", (str(b), 1)), ("c.1", (str(b), 1))]
    assert run.retried == ["c.0"]


def test_a_rid_in_the_last_start_of_two_files_still_fails(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_file(a, [startup(5, 0.0), event("x.0", 10, 0, 1.0)])
    write_file(b, [startup(6, 0.0), event("y.0", 10, 0, 1.5), startup(8, 1.8, start=2), event("x.0", 10, 0, 2.0)])
    with pytest.raises(ValueError, match=f"rid x.0 is in {a} and in {b}"):
        report.merged_events([a, b])
    assert report.main(["ingest", "--events", str(a), "--events", str(b), "--out", str(tmp_path / "o")]) == 2
    assert "rid x.0 is in" in capsys.readouterr().err


@pytest.mark.parametrize("lost, message", [
    (2, "C1: 2 answered calls have no event; the events files record 2 lost writes (disk full?)"),
    (0, "C1: 2 answered calls have no event; the events files record no lost writes"),
])
def test_answered_calls_without_an_event_are_counted_beside_the_lost_writes(tmp_path, monkeypatch, lost, message):
    from policy import faults

    monkeypatch.setattr(faults, "_CALLS", {})
    if lost:  # the 2nd and 3rd event writes hit a full disk
        monkeypatch.setattr(faults, "_PLAN", faults.parse("events.write@2,events.write@2"))
    path = tmp_path / "events.jsonl"
    served = [event(f"c.{n}", 100, 0, float(n)) for n in range(4)]
    write_file(path, [startup(5, 0.0), *(served if lost else [served[0], served[3]])])
    client = tmp_path / "client.jsonl"
    client.write_text("".join(json.dumps({"rid": e.rid, "usage": {"prompt_tokens": 100, "completion_tokens": 2}}) + "\n"
                              for e in served))
    rows, failures = report.ingest(path, tmp_path / "out", client_path=client)
    assert failures == ["C1 c.1: client request without a server row", "C1 c.2: client request without a server row",
                        message]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["missing_records"], summary["missing_rids"]) == (2, ["c.1", "c.2"])
    assert summary["lost_records"] == lost and len(summary["cut_lines"]) == (2 if lost else 0)


def test_without_a_client_file_missing_records_is_null(tmp_path):
    path = tmp_path / "events.jsonl"
    write_file(path, [event("c.0", 10, 0)])
    report.ingest(path, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["missing_records"], summary["missing_rids"], summary["lost_records"], summary["cut_lines"]) == (
        None, None, 0, [])
    assert summary["starts"] == [{"file": str(path), "start": 0, "restart": False, "requests": 1,
                                  "prefix_reused_share": 0.0, "moved_share": 0.0, "read_share": 1.0}]
