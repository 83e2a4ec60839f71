"""eval/accounting/provenance.py and ``python -m eval.report ingest`` on events with known answers."""

from __future__ import annotations

import csv
import json

import pytest

from eval import report
from eval.accounting import provenance
from eval.accounting.flops import QWEN36_27B, n_body
from serving.event_writer import EventWriter
from policy.events import RequestEvent

BODY = n_body(QWEN36_27B)


def event(rid, prompt, reused, moved=0, decode=10, policy="radix", salt=None):
    return RequestEvent(rid=rid, policy=policy, prompt_tokens=prompt, prefix_reused=reused, moved=moved,
                        read=prompt - reused - moved, decode_tokens=decode, cache_salt=salt, plan_resume=reused,
                        finish_reason="length", queued_ts=1.0, finished_ts=2.0)


@pytest.mark.parametrize(
    "rid, salt, expected",
    [("run1.q7.3", None, "run1.q7"), ("conv-a", "tenant", "tenant"), ("abc123", None, "abc123")],
    ids=["dotted-rid", "salt", "bare"],
)
def test_conversation_of(rid, salt, expected):
    assert provenance.conversation_of(rid, salt) == expected


@pytest.mark.parametrize(
    "reused, previous, expected",
    [(0, None, "first"), (900, 1000, "edited"), (936, 1000, "append"), (935, 1000, "edited"), (1200, 1000, "append")],
    ids=["first", "edited", "at-slack", "just-past-slack", "beyond-previous"],
)
def test_classify(reused, previous, expected):
    assert provenance.classify(reused, previous) == expected


def conversation():
    return [
        event("c1.1", 1000, 0),
        event("c2.1", 500, 0),
        event("c1.2", 1200, 960),  # append: reused 960 >= 1000 - 64
        event("c1.3", 1100, 200),  # edited: reused 200 < 1200 - 64
        event("c2.2", 700, 448),  # edited relative to 500? 448 >= 436: append
    ]


def test_rows_classes_and_pflops():
    rows = provenance.rows_from_events(conversation(), BODY)
    assert [(r.rid, r.klass) for r in rows] == [
        ("c1.1", "first"), ("c2.1", "first"), ("c1.2", "append"), ("c1.3", "edited"), ("c2.2", "append")]
    assert rows[3].read == 900 and rows[3].pflops == pytest.approx(2 * BODY * (900 + 10) / 1e15)
    assert provenance.check(rows, BODY) == []
    s = provenance.summary(rows)
    assert s["classes"] == {"first": 2, "append": 2, "edited": 1}
    assert s["all"]["prompt_tokens"] == 4500 and s["all"]["prefix_reused"] == 1608 and s["all"]["read"] == 2892
    assert s["edited"]["requests"] == 1 and s["edited"]["read_share"] == pytest.approx(900 / 1100)
    assert s["conversations"] == 2


def changed(row, **fields):
    """``row`` with ``fields`` replaced and its PFLOPs recomputed (so only the intended check fires)."""
    data = {**row.__dict__, **fields}
    data["pflops"] = fields.get("pflops", 2 * BODY * (data["read"] + data["decode"]) / 1e15)
    return provenance.Row(**data)


def test_each_check_fires():
    (row,) = provenance.rows_from_events([event("a.1", 100, 50)], BODY)
    assert provenance.check([changed(row, read=40)], BODY) == [
        "I1 a.1: prompt 100 != reused 50 + moved 0 + read 40",
        "I2 totals: sum(P - R) = 50 != sum(M) + sum(F) = 40",
    ]
    assert provenance.check([changed(row, moved=10, read=40)], BODY) == ["I3 a.1: policy radix moved 10 tokens"]
    assert provenance.check([changed(row, moved=10, read=40, policy="scr")], BODY) == []
    wrong = provenance.check([changed(row, pflops=1.0)], BODY)
    assert len(wrong) == 1 and wrong[0].startswith("I2 PFLOPs: rows 1.0 != totals")
    assert provenance.check([changed(row, prefix_reused=110, read=-10)], BODY) == [
        "I1 a.1: prompt 100 == reused 110 + moved 0 + read -10; negative: read",
    ]


def test_ingest_command_writes_csv_and_summary(tmp_path):
    writer = EventWriter(str(tmp_path / "events.jsonl"))
    for e in conversation():
        writer.write(e)
    writer.close()
    assert report.main(["ingest", "--events", str(tmp_path / "events.jsonl"), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "requests.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["class"] for r in table] == ["first", "first", "append", "edited", "append"]
    assert table[3]["read"] == "900" and table[3]["conversation"] == "c1"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["n_body"] == 24_353_201_664 and summary["checks_failed"] == []


def test_ingest_exits_2_on_an_unreadable_events_file(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text('{"schema": 9}\n')
    assert report.main(["ingest", "--events", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "unsupported event schema 9" in capsys.readouterr().err


def test_raw_negative_counts_are_read_and_fail_i1_naming_the_rid(tmp_path):
    """The server records R = cached_tokens - 2M raw. Below 0 (the double-count rule is wrong for
    that request), or above P - M (then F < 0), reading the events file must neither refuse nor
    clamp it, and I1 must fail for exactly those rids."""
    events = [event("ok.1", 1000, 400), event("neg.1", 1000, -40, moved=500, policy="scr"),
              event("over.1", 1000, 700, moved=500, policy="scr")]
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    for e in events:
        writer.write(e)
    writer.close()
    rows, failures = report.ingest(path, tmp_path / "out")
    assert [(r.rid, r.prefix_reused, r.moved, r.read) for r in rows] == [
        ("ok.1", 400, 0, 600), ("neg.1", -40, 500, 540), ("over.1", 700, 500, -200)]
    assert failures == [
        "I1 neg.1: prompt 1000 == reused -40 + moved 500 + read 540; negative: reused",
        "I1 over.1: prompt 1000 == reused 700 + moved 500 + read -200; negative: read",
    ]


def test_check_client_matches_client_requests_to_server_rows_one_to_one():
    rows = provenance.rows_from_events([event("a.1", 100, 0), event("a.2", 120, 90)], BODY)
    usage = {row.rid: {"prompt_tokens": row.prompt_tokens, "completion_tokens": row.decode} for row in rows}
    client = [{"rid": rid, "usage": u} for rid, u in usage.items()]
    assert provenance.check_client(rows, client) == []
    twice = client + [client[0]]
    assert [f for f in provenance.check_client(rows, twice) if "client requests with this rid" in f] == [
        f"C1 a.1: {sum(r['rid'] == 'a.1' for r in twice)} client requests with this rid"]
    missing_row = provenance.check_client(rows[:1], client)
    assert missing_row == ["C1 a.2: client request without a server row"]
    foreign = provenance.check_client(rows, client[:1])
    assert foreign == ["C1 a.2: server row without a client request (foreign request)"]


def test_check_against_events_reads_blocks_as_zero_for_an_event_without_them():
    (row,) = provenance.rows_from_events([event("a.1", 100, 50)], BODY)
    assert row.blocks == 0

    import dataclasses

    class NoBlocks:  # an events-file record written before ``blocks`` existed
        def __init__(self, source):
            fields = {f.name: getattr(source, f.name) for f in dataclasses.fields(source) if f.name != "blocks"}
            self.__dict__.update(fields)

    old = NoBlocks(event("a.1", 100, 50))
    assert not hasattr(old, "blocks")
    assert provenance.check_against_events([row], [old]) == []
