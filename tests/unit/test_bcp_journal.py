"""The run journal: an interrupted run resumes without redoing or losing questions."""

from __future__ import annotations

import json

import pytest

from eval.bcp import journal as journal_mod
from eval.bcp.config import AgentConfig
from eval.bcp.data import Query
from eval.bcp.execute import RunSetup, execute
from tests.unit.test_bcp_agent import ANSWER, FakeEndpoint, FakeToolBox, native_call

QUERIES = [Query(str(i), f"question {i}?", f"answer {i}", (str(10 + i),), (str(10 + i),)) for i in range(1, 5)]


def two_turn_script(n_questions):
    script = []
    for _ in range(n_questions):
        script += [native_call("search", query="x"), {"content": ANSWER}]
    return script


def setup(tmp_path, endpoint, queries=QUERIES):
    config = AgentConfig(mode="plain", finish_policy="text", max_steps=5)
    manifest = {"schema": 1, "run_id": "run1", "policy": "radix", "agent": {"config": config.to_dict()},
                "dataset": {"fingerprint": "f", "question_ids": [q.query_id for q in queries]},
                "server": {"kind": "stub"}, "run": {"concurrency": 1, "git": {"commit": "c"}, "code_fingerprint": "x"}}
    return RunSetup(run_dir=tmp_path / "run1", run_id="run1", policy="radix", config=config, queries=queries,
                    make_toolbox=FakeToolBox, post=endpoint, model="m", manifest=manifest, progress=False)


class Interrupt(BaseException):
    """Stands for Ctrl-C / a killed process in the middle of a request."""


def test_resume_after_an_interruption_neither_redoes_nor_loses_questions(tmp_path):
    # Questions 1 and 2 finish; the run dies in the middle of question 3 (its second request).
    first = FakeEndpoint(two_turn_script(2) + [native_call("search", query="x"), Interrupt()])
    with pytest.raises(Interrupt):
        execute(setup(tmp_path, first))
    run_dir = tmp_path / "run1"
    assert sorted(p.name for p in (run_dir / "questions").iterdir()) == ["1.json", "2.json"]
    assert len(first.payloads) == 6

    second = FakeEndpoint(two_turn_script(2))  # only questions 3 and 4 may be asked
    records = execute(setup(tmp_path, second))
    assert [r["query_id"] for r in records] == ["1", "2", "3", "4"]
    assert all(r["status"] == "completed" for r in records)
    assert [p["rid"] for p in second.payloads] == ["run1.3~1.0000", "run1.3~1.0001", "run1.4.0000", "run1.4.0001"]
    assert records[2]["attempt"] == 1 and records[0]["attempt"] == 0
    # The finished questions' files are the ones written before the interruption.
    assert records[0]["rids"] == ["run1.1.0000", "run1.1.0001"]
    # Journal: four done lines, one per question; question 3 started twice.
    lines = [json.loads(l) for l in (run_dir / "journal.jsonl").read_text().splitlines()]
    assert sorted(l["qid"] for l in lines if l["event"] == "done") == ["1", "2", "3", "4"]
    assert [l["attempt"] for l in lines if l["event"] == "start" and l["qid"] == "3"] == [0, 1]
    assert any(l["event"] == "resume" for l in lines)
    # Client rows: every request once, including the interrupted attempt's finished one.
    rows = [json.loads(l) for l in (run_dir / "client_requests.jsonl").read_text().splitlines()]
    assert [r["rid"] for r in rows].count("run1.3.0000") == 1
    assert len(rows) == 6 + 4  # the interrupted request is logged too, without usage
    assert [r for r in rows if r["rid"] == "run1.3.0001"][0].get("usage") is None

    # A third invocation has nothing left to do.
    third = FakeEndpoint([])
    assert len(execute(setup(tmp_path, third))) == 4 and third.payloads == []


def test_a_run_file_without_its_done_line_is_adopted(tmp_path):
    first = FakeEndpoint(two_turn_script(1) + [Interrupt()])
    with pytest.raises(Interrupt):
        execute(setup(tmp_path, first))
    run_dir = tmp_path / "run1"
    # Simulate a crash between writing the run file and appending its done line.
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    (run_dir / "journal.jsonl").write_text("\n".join(l for l in lines if '"done"' not in l) + "\n")
    jr = journal_mod.Journal(run_dir)
    assert not jr.is_done("1")
    assert jr.reconcile() == 1 and jr.is_done("1")


def test_resume_refuses_a_different_run_in_the_same_folder(tmp_path):
    execute(setup(tmp_path, FakeEndpoint(two_turn_script(1)), QUERIES[:1]))
    other = setup(tmp_path, FakeEndpoint([]), QUERIES[:1])
    other.manifest["agent"]["config"] = {**other.manifest["agent"]["config"], "temperature": 0.0}
    with pytest.raises(SystemExit, match="different run"):
        execute(other)


def test_rid_helpers():
    assert journal_mod.rid_prefix("r", "a.b/c", 0) == "r.a_b_c"
    assert journal_mod.rid_prefix("r", "7", 2) == "r.7~2"
    assert journal_mod.parse_rid("my.run.7~2.0013") == ("my.run", "7", 2, 13)
    assert journal_mod.parse_rid("my.run.7.0000") == ("my.run", "7", 0, 0)
    assert journal_mod.parse_rid("0123abcdef") is None


def test_inline_judging_and_the_progress_bar(tmp_path, capsys):
    from tests.unit.test_bcp_compare import FakeJudge

    run_setup = setup(tmp_path, FakeEndpoint(two_turn_script(2)), QUERIES[:2])
    run_setup.judge = FakeJudge({"1": True, "2": None})
    run_setup.progress = True
    execute(run_setup)
    bar = capsys.readouterr().err
    assert "2/2" in bar and "acc=50.0%" in bar and "tok=" in bar
    judge_dir = tmp_path / "run1" / "judge"
    assert json.loads((judge_dir / "1.json").read_text())["correct"] is True
    failed = json.loads((judge_dir / "2.json").read_text())
    assert failed["parse_error"] is True and failed["correct"] is False


def test_concurrent_questions(tmp_path):
    import threading

    from tests.unit.test_bcp_agent import FakeEndpoint as _Base

    class Reactive(_Base):
        """Search first, answer once a tool result is in the context; thread-safe."""

        def __init__(self):
            super().__init__([])
            self.lock = threading.Lock()

        def __call__(self, path, payload):
            with self.lock:
                last = payload["messages"][-1]["role"]
                self.script = [{"content": ANSWER} if last == "tool" else native_call("search", query="x")]
                return super().__call__(path, payload)

    endpoint = Reactive()
    run_setup = setup(tmp_path, endpoint)
    run_setup.concurrency = 3
    records = execute(run_setup)
    assert [r["query_id"] for r in records] == ["1", "2", "3", "4"]
    assert all(r["status"] == "completed" and len(r["rids"]) == 2 for r in records)
    rows = [json.loads(l) for l in (tmp_path / "run1" / "client_requests.jsonl").read_text().splitlines()]
    assert sorted(r["rid"] for r in rows) == sorted(rid for r in records for rid in r["rids"])
    lines = [json.loads(l) for l in (tmp_path / "run1" / "journal.jsonl").read_text().splitlines()]
    assert sorted(l["qid"] for l in lines if l["event"] == "done") == ["1", "2", "3", "4"]
