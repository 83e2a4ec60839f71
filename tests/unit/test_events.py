"""``policy.events.RequestEvent`` / ``read_events`` and the writer ``serving.event_writer.EventWriter``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.event_writer import EventWriter, write_startup
from policy.events import SCHEMA_VERSION, RequestEvent, read_events, read_startups, startup_record

ROOT = Path(__file__).resolve().parents[2]


def make_event(**overrides) -> RequestEvent:
    fields = dict(
        rid="r1",
        policy="radix",
        prompt_tokens=10,
        prefix_reused=4,
        moved=0,
        read=6,
        decode_tokens=3,
        cache_salt=None,
        plan_resume=4,
        finish_reason="stop",
        queued_ts=100.0,
        finished_ts=101.5,
    )
    fields.update(overrides)
    return RequestEvent(**fields)


EVENT_DICT = {
    "rid": "r1",
    "policy": "radix",
    "prompt_tokens": 10,
    "prefix_reused": 4,
    "moved": 0,
    "read": 6,
    "decode_tokens": 3,
    "cache_salt": None,
    "plan_resume": 4,
    "finish_reason": "stop",
    "queued_ts": 100.0,
    "finished_ts": 101.5,
    "snapshots": [],
    "forwards_off_plan": 0,
    "pieces": [],
    "blocks": 0,
    "fallback": None,
    "retractions": 0,
    "match_cap": None,
    "schema": 1,
}

EVENT_LINE = (
    '{"blocks": 0, "cache_salt": null, "decode_tokens": 3, "fallback": null, "finish_reason": "stop", '
    '"finished_ts": 101.5, "forwards_off_plan": 0, "match_cap": null, "moved": 0, "pieces": [], "plan_resume": 4, '
    '"policy": "radix", "prefix_reused": 4, "prompt_tokens": 10, "queued_ts": 100.0, "read": 6, "retractions": 0, "rid": "r1", '
    '"schema": 1, "snapshots": []}'
)

# A line written before ``snapshots``, ``forwards_off_plan``, ``fallback`` and ``retractions`` existed
# (same schema): still readable.
OLD_EVENT_LINE = (
    '{"blocks": 0, "cache_salt": null, "decode_tokens": 3, "finish_reason": "stop", "finished_ts": 101.5, '
    '"moved": 0, "plan_resume": 4, "policy": "radix", "prefix_reused": 4, "prompt_tokens": 10, '
    '"queued_ts": 100.0, "read": 6, "rid": "r1", "schema": 1}'
)


# ---------------------------------------------------------------------- RequestEvent


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="reused-and-read"),
        pytest.param(dict(prefix_reused=0, read=10), id="all-read"),
        pytest.param(dict(prefix_reused=10, read=0), id="all-reused"),
        pytest.param(dict(prefix_reused=2, moved=3, read=5), id="with-moved"),
        pytest.param(dict(prompt_tokens=0, prefix_reused=0, read=0, decode_tokens=0), id="empty"),
        pytest.param(dict(cache_salt="s", plan_resume=None, finish_reason=None), id="nullable-fields"),
    ],
)
def test_identity_accepted(overrides):
    event = make_event(**overrides)
    assert event.prompt_tokens == event.prefix_reused + event.moved + event.read
    assert event.schema == SCHEMA_VERSION == 1


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(dict(read=5), "r1: prompt 10 != reused 4 + moved 0 + read 5", id="too-few"),
        pytest.param(dict(read=7), "r1: prompt 10 != reused 4 + moved 0 + read 7", id="too-many"),
        pytest.param(dict(moved=1), "r1: prompt 10 != reused 4 + moved 1 + read 6", id="moved-not-counted"),
        pytest.param(dict(prompt_tokens=0), "r1: prompt 0 != reused 4 + moved 0 + read 6", id="zero-prompt"),
    ],
)
def test_identity_rejected(overrides, message):
    with pytest.raises(ValueError) as info:
        make_event(**overrides)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(prefix_reused=-40, moved=20, read=30), id="negative-reused"),
        pytest.param(dict(prefix_reused=8, moved=5, read=-3), id="reused-above-prompt-minus-moved"),
    ],
)
def test_raw_negative_counts_are_kept_on_write_and_read(overrides, tmp_path):
    """``prefix_reused`` is recorded raw (cached_tokens - 2 * moved under scr): neither the record
    nor the reader may clamp or refuse a negative count; accounting check I1 reports it."""
    event = make_event(**overrides)
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    writer.write(event)
    writer.close()
    assert list(read_events(str(path))) == [event]


def test_to_dict_exact():
    assert make_event().to_dict() == EVENT_DICT


def test_new_fields_default_empty_and_not_shared():
    first, second = make_event(), make_event()
    assert (first.snapshots, first.forwards_off_plan) == ([], 0)
    assert first.snapshots is not second.snapshots


def test_to_dict_with_snapshots_exact():
    event = make_event(policy="exact", snapshots=[[256, "periodic"], [320, "prompt_end"]], forwards_off_plan=1)
    assert event.to_dict() == dict(
        EVENT_DICT, policy="exact", snapshots=[[256, "periodic"], [320, "prompt_end"]], forwards_off_plan=1
    )


def test_line_without_the_new_fields_still_reads(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(OLD_EVENT_LINE + "\n")
    assert list(read_events(str(path))) == [make_event()]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="default"),
        pytest.param(dict(cache_salt="salt", plan_resume=None, finish_reason=None), id="nullables"),
        pytest.param(dict(prefix_reused=2, moved=3, read=5, policy="exact"), id="moved"),
        pytest.param(
            dict(policy="exact", snapshots=[[256, "periodic"], [512, "prompt_end"]], forwards_off_plan=2),
            id="exact-snapshots",
        ),
    ],
)
def test_dict_round_trip(overrides):
    event = make_event(**overrides)
    assert RequestEvent.from_dict(event.to_dict()) == event
    assert RequestEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event


@pytest.mark.parametrize(
    "schema, message",
    [
        pytest.param(2, "unsupported event schema 2", id="newer"),
        pytest.param(0, "unsupported event schema 0", id="older"),
        pytest.param("1", "unsupported event schema '1'", id="string"),
        pytest.param(None, "unsupported event schema None", id="null"),
    ],
)
def test_from_dict_rejects_schema(schema, message):
    data = dict(EVENT_DICT, schema=schema)
    with pytest.raises(ValueError) as info:
        RequestEvent.from_dict(data)
    assert str(info.value) == message


def test_from_dict_rejects_missing_schema():
    data = {k: v for k, v in EVENT_DICT.items() if k != "schema"}
    with pytest.raises(ValueError) as info:
        RequestEvent.from_dict(data)
    assert str(info.value) == "unsupported event schema None"


# ---------------------------------------------------------------------- read_events


def test_read_events_skips_blank_lines(tmp_path):
    first = make_event(rid="a")
    second = make_event(rid="b", prefix_reused=0, read=10)
    path = tmp_path / "events.jsonl"
    path.write_text(
        json.dumps(first.to_dict()) + "\n\n" + "   \n" + json.dumps(second.to_dict()) + "\n"
    )
    assert list(read_events(str(path))) == [first, second]


def test_read_events_empty_file(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    assert list(read_events(str(path))) == []


def test_read_events_last_line_without_newline(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(EVENT_LINE)
    assert list(read_events(str(path))) == [make_event()]


BAD_LINES = [
    pytest.param("not json", "Expecting value: line 1 column 1 (char 0)", id="not-json"),
    pytest.param(
        json.dumps(dict(EVENT_DICT, schema=2)), "unsupported event schema 2", id="wrong-schema",
    ),
    pytest.param(
        json.dumps(dict(EVENT_DICT, read=5)), "r1: prompt 10 != reused 4 + moved 0 + read 5", id="identity",
    ),
    pytest.param(
        json.dumps(dict(EVENT_DICT, extra=1)),
        "RequestEvent.__init__() got an unexpected keyword argument 'extra'",
        id="unknown-field",
    ),
    pytest.param(
        json.dumps({k: v for k, v in EVENT_DICT.items() if k != "rid"}),
        "RequestEvent.__init__() missing 1 required positional argument: 'rid'",
        id="missing-field",
    ),
]


@pytest.mark.parametrize("bad_line, reason", BAD_LINES)
def test_read_events_bad_line_reports_path_and_line(tmp_path, bad_line, reason):
    path = tmp_path / "events.jsonl"
    # line 1: good, line 2: blank (still counted), line 3: bad, line 4: good (never reached)
    path.write_text(EVENT_LINE + "\n\n" + bad_line + "\n" + EVENT_LINE + "\n")
    events = read_events(str(path))
    assert next(events) == make_event()
    with pytest.raises(ValueError) as info:
        next(events)
    assert str(info.value) == f"{path}:3: {reason}"


# ---------------------------------------------------------------------- start-up records


def make_startup(policy="radix", pid=7, ts=50.0) -> dict:
    return startup_record(policy, {"piece_tokens": 64} if policy == "exact" else {},
                          {"sglang": "0.5.16", "torch": "2.9.0", "transformers": None, "overlay": "0.1.0"},
                          ["--model-path", "m", "--page-size", "1"], pid, ts, "matched")


def test_startup_record_exact():
    assert make_startup() == {
        "record": "startup", "policy": "radix", "settings": {},
        "versions": {"sglang": "0.5.16", "torch": "2.9.0", "transformers": None, "overlay": "0.1.0"},
        "server_args": ["--model-path", "m", "--page-size", "1"], "serving_profile": "matched",
        "pid": 7, "ts": 50.0, "start": 1, "restart": False, "cache": "cold", "previous": None,
    }


@pytest.mark.parametrize(
    "rows, startups, rids",
    [
        pytest.param([], [], [], id="empty"),
        pytest.param(["s1"], [1], [], id="startup-only"),
        pytest.param(["s1", "e:a", "e:b"], [1], ["a", "b"], id="startup-then-events"),
        pytest.param(["s1", "e:a", "s2", "e:b"], [1, 2], ["a", "b"], id="restart-appends-a-second-record"),
        pytest.param(["e:a", "e:b"], [], ["a", "b"], id="file-from-before-startup-records"),
    ],
)
def test_read_events_skips_startups_and_read_startups_keeps_their_order(tmp_path, rows, startups, rids):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    for row in rows:
        if row.startswith("s"):
            write_startup(str(path), make_startup(pid=int(row[1:])))
        else:
            writer.write(make_event(rid=row[2:]))
    writer.close()
    path.touch()
    assert [e.rid for e in read_events(str(path))] == rids
    assert [s["pid"] for s in read_startups(str(path))] == startups


def test_write_startup_line_format_exact(tmp_path):
    path = tmp_path / "deep" / "events.jsonl"
    write_startup(str(path), make_startup("exact"))
    assert path.read_text() == json.dumps(make_startup("exact"), sort_keys=True) + "\n"


def test_read_startups_reports_a_bad_line(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(make_startup()) + "\nnot json\n")
    with pytest.raises(ValueError) as info:
        read_startups(str(path))
    assert str(info.value) == f"{path}:2: Expecting value: line 1 column 1 (char 0)"


# ---------------------------------------------------------------------- EventWriter


def read_lines(path) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


def test_writer_writes_json_lines_in_order(tmp_path):
    path = tmp_path / "events.jsonl"
    first = make_event(rid="a")
    second = make_event(rid="b", prefix_reused=0, read=10)
    writer = EventWriter(str(path))
    try:
        writer.write(first)
        writer.write(second)
    finally:
        writer.close()
    lines = read_lines(path)
    assert len(lines) == 2
    assert [json.loads(line) for line in lines] == [first.to_dict(), second.to_dict()]
    assert lines == [json.dumps(first.to_dict(), sort_keys=True), json.dumps(second.to_dict(), sort_keys=True)]
    assert path.read_text().endswith("\n")
    assert list(read_events(str(path))) == [first, second]


def test_writer_line_format_exact(tmp_path):
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path))
    writer.write(make_event())
    writer.close()
    assert path.read_text() == EVENT_LINE + "\n"


def test_second_writer_appends(tmp_path):
    path = tmp_path / "events.jsonl"
    events = [make_event(rid=f"r{i}") for i in range(3)]
    first = EventWriter(str(path))
    first.write(events[0])
    first.write(events[1])
    first.close()
    second = EventWriter(str(path))
    second.write(events[2])
    second.close()
    assert list(read_events(str(path))) == events
    assert len(read_lines(path)) == 3


def test_two_open_writers_interleave_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    a, b = EventWriter(str(path)), EventWriter(str(path))
    try:
        a.write(make_event(rid="a1"))
        b.write(make_event(rid="b1"))
        a.write(make_event(rid="a2"))
    finally:
        a.close()
        b.close()
    assert [e.rid for e in read_events(str(path))] == ["a1", "b1", "a2"]


def test_writer_creates_missing_directories(tmp_path):
    path = tmp_path / "deep" / "er" / "events.jsonl"
    writer = EventWriter(str(path))
    writer.write(make_event())
    writer.close()
    assert read_lines(path) == [EVENT_LINE]


def test_writer_relative_path_in_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    writer = EventWriter("events.jsonl")
    writer.write(make_event())
    writer.close()
    assert read_lines(tmp_path / "events.jsonl") == [EVENT_LINE]


@pytest.mark.parametrize("module", ["policy.events", "serving.event_writer"])
def test_event_modules_do_not_import_sglang(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch')))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
