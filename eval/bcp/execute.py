"""Running the agent over a run's questions: journaled, resumable, optionally concurrent and
judged as each question finishes (``docs/eval.md`` §5.5).

Every request id is ``<run_id>.<qid>.<turn:04d>`` (``<qid>~<attempt>`` for a question re-run after
an interruption), so the accounting groups requests into questions by the rid up to its last dot.
At the end the server's events of the run's rids, its log and (``trace_source``) the exact token ids
of the run's calls are copied into the run directory.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from eval.bcp import journal as journal_mod
from eval.bcp.client import ChatClient, Post
from eval.bcp.config import AgentConfig
from eval.bcp.judging import judge_one, read_judgments
from eval.bcp.manifest import prepare_manifest
from eval.bcp.server_events import collect_events

CLIENT_LOG = "client_requests.jsonl"


@dataclasses.dataclass
class RunSetup:
    """Everything ``execute`` needs, built by ``eval.bcp.run`` (or a test, with a fake ``post``)."""

    run_dir: Path
    run_id: str
    policy: str
    config: AgentConfig
    queries: list  # data.Query
    make_toolbox: Callable[[], Any]
    post: Post
    model: str
    manifest: dict
    events_source: Path | None = None
    trace_source: Path | None = None  # the server's --cache-trace file -> run_dir/trace.jsonl
    concurrency: int = 1
    server_log: Path | None = None  # copied to run_dir/server.log at the end (for `eval.report ingest --log`)
    judge: Any = None  # an object with .grade(query, record) -> dict (inline judging)
    progress: bool = True


def _append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


class _Questions:
    """What the workers of one run share, behind one lock: the journal, the finished records and
    the judges' verdicts (``correct`` by qid, for the progress bar)."""

    def __init__(self, setup: RunSetup, journal: journal_mod.Journal):
        self.setup = setup
        self.journal = journal
        self.lock = threading.Lock()
        self.records = {r["query_id"]: r for r in journal.records()}
        self.judged = {qid: j.get("correct") for qid, j in read_judgments(setup.run_dir).items()
                       if qid in self.records}
        self.agent = self._make_agent()

    def _make_agent(self):
        from eval.bcp.agent import Agent

        setup, config = self.setup, self.setup.config
        client = ChatClient(setup.post, model=setup.model, sampling=config.sampling(),
                            chat_template_kwargs=config.chat_template_kwargs, cache_salt=config.cache_salt,
                            max_retries=config.max_retries, protocol=config.tool_protocol, log=self.log_row)
        return Agent(config, client, setup.make_toolbox, model_name=setup.model)

    def log_row(self, row: dict) -> None:
        with self.lock:
            _append_jsonl(self.setup.run_dir / CLIENT_LOG, row)

    def work(self, query) -> None:
        """Runs one question as a new attempt, writes its trajectory (and judgment), journals it."""
        setup = self.setup
        with self.lock:
            attempt = self.journal.start(query.query_id)
        prefix = journal_mod.rid_prefix(setup.run_id, query.query_id, attempt)
        result = self.agent.run(query.query_id, query.text, prefix)
        record = {**result.record, "attempt": attempt, "policy": setup.policy, "run_id": setup.run_id}
        journal_mod.write_json_atomic(setup.run_dir / "trajectories" / f"{journal_mod.safe_qid(query.query_id)}.json",
                                      {"query_id": query.query_id, "attempt": attempt, "messages": result.messages})
        judgment = judge_one(setup.judge, query, record, setup.run_dir) if setup.judge is not None else None
        with self.lock:
            if judgment is not None:
                self.judged[query.query_id] = judgment.get("correct")
            self.journal.finish(query.query_id, attempt, record)
            self.records[query.query_id] = record


class _Progress:
    """The tqdm bar: questions done, tokens so far, and accuracy when judged inline."""

    def __init__(self, setup: RunSetup, questions: _Questions):
        from tqdm import tqdm

        self.setup, self.questions = setup, questions
        done = sum(1 for q in setup.queries if questions.journal.is_done(q.query_id))
        self.bar = tqdm(total=len(setup.queries), initial=done, desc=f"bcp {setup.policy}", unit="q",
                        disable=not setup.progress)

    def show(self) -> None:
        records = self.questions.records
        finished = [records[q.query_id] for q in self.setup.queries if q.query_id in records]
        tokens = sum(r["tokens"]["prompt"] + r["tokens"]["completion"] for r in finished)
        shown = {"done": sum(r["status"] == "completed" for r in finished), "tok": tokens}
        grades = [v for v in self.questions.judged.values() if v is not None]
        if self.setup.judge is not None and grades:
            shown["acc"] = f"{sum(grades) / len(finished):.1%}"
        self.bar.set_postfix(shown)

    def advance(self) -> None:
        self.bar.update(1)
        self.show()


def _run_each(pending: list, work: Callable[[Any], None], advance: Callable[[], None], concurrency: int) -> None:
    """``work`` on every pending question; with concurrency > 1, questions are started in dataset
    order, at most ``concurrency`` at a time."""
    if concurrency <= 1:
        for query in pending:
            work(query)
            advance()
        return
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        for future in as_completed([pool.submit(work, q) for q in pending]):
            future.result()
            advance()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _copy_server_files(setup: RunSetup, records: dict) -> None:
    """The server's events of this run's rids, and its log, into the run directory."""
    if setup.events_source is not None:
        collect_events(setup.events_source, setup.run_dir, setup.run_id,
                       [r for rec in records.values() for r in rec["rids"]])
    if setup.server_log is not None and Path(setup.server_log).exists():
        (setup.run_dir / "server.log").write_bytes(Path(setup.server_log).read_bytes())


def execute(setup: RunSetup) -> list[dict]:
    """Run every question not yet finished; returns all run records (old and new)."""
    journal = journal_mod.Journal(setup.run_dir)
    if journal.reconcile():
        journal.note_resume()
    prepare_manifest(setup.run_dir, setup.manifest)
    questions = _Questions(setup, journal)
    progress = _Progress(setup, questions)
    pending = [q for q in setup.queries if not journal.is_done(q.query_id)]
    progress.show()
    try:
        _run_each(pending, questions.work, progress.advance, setup.concurrency)
    finally:
        progress.bar.close()
        _copy_server_files(setup, questions.records)
    if setup.trace_source is not None:  # a finished run only: an exception above is not masked
        from eval.bcp.trace import collect_trace

        collect_trace(setup.trace_source, setup.run_dir, list(questions.records.values()),
                      setup.config.chat_template_kwargs)
    return [questions.records[q.query_id] for q in setup.queries if q.query_id in questions.records]
