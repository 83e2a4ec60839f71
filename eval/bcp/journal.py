"""The run journal: an append-only record of which questions a run has finished, so that an
interrupted run continues without losing or redoing finished questions.

A question is finished when its run file ``questions/<qid>.json`` exists (written to a temporary
name, flushed and renamed: it is either whole or absent) *and* the journal has its ``done`` line.
The run file is written first, so a crash between the two leaves a whole file without a ``done``
line; ``reconcile`` adopts such files on resume. A question that was started but not finished is
run again as a new *attempt*: its rids carry the attempt (``<run>.<qid>~<attempt>.<turn>``), so they
never collide with the interrupted attempt's rids in the server's events, and the accounting can
set the abandoned requests apart.

Journal lines (``journal.jsonl``)::

    {"event": "start", "qid": ..., "attempt": n, "t": ...}
    {"event": "done",  "qid": ..., "attempt": n, "status": ..., "t": ...}
    {"event": "resume", "done": k, "t": ...}
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

JOURNAL = "journal.jsonl"
QUESTIONS = "questions"


def write_json_atomic(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def safe_qid(qid: str) -> str:
    """A query id usable in a file name and a rid (no ``/``, ``.`` or ``~``)."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in str(qid))


class Journal:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JOURNAL
        self.questions = self.run_dir / QUESTIONS
        self.questions.mkdir(parents=True, exist_ok=True)
        self.done: dict[str, dict] = {}
        self.attempts: dict[str, int] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash
                qid = entry.get("qid")
                if entry.get("event") == "start":
                    self.attempts[qid] = max(self.attempts.get(qid, -1), int(entry.get("attempt", 0)))
                elif entry.get("event") == "done":
                    self.done[qid] = entry

    def _append(self, entry: dict) -> None:
        entry = {**entry, "t": round(time.time(), 3)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def question_path(self, qid: str) -> Path:
        return self.questions / f"{safe_qid(qid)}.json"

    def reconcile(self) -> int:
        """Adopt whole run files that lack a ``done`` line; forget ``done`` lines whose file is gone.
        Returns the number of finished questions."""
        for path in sorted(self.questions.glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                path.unlink()  # cannot happen with atomic writes, but never trust a broken file
                continue
            qid = str(record["query_id"])
            if qid not in self.done:
                self._append({"event": "done", "qid": qid, "attempt": record.get("attempt", 0),
                              "status": record.get("status"), "adopted": True})
                self.done[qid] = {"qid": qid, "status": record.get("status")}
        for qid in [q for q in self.done if not self.question_path(q).exists()]:
            del self.done[qid]
        return len(self.done)

    def is_done(self, qid: str) -> bool:
        return qid in self.done

    def start(self, qid: str) -> int:
        """Record the start of a question; returns its attempt number (0 the first time)."""
        attempt = self.attempts.get(qid, -1) + 1
        self.attempts[qid] = attempt
        self._append({"event": "start", "qid": qid, "attempt": attempt})
        return attempt

    def finish(self, qid: str, attempt: int, record: dict) -> None:
        write_json_atomic(self.question_path(qid), record)
        self._append({"event": "done", "qid": qid, "attempt": attempt, "status": record.get("status")})
        self.done[qid] = {"qid": qid, "attempt": attempt, "status": record.get("status")}

    def note_resume(self) -> None:
        self._append({"event": "resume", "done": len(self.done)})

    def records(self) -> list[dict]:
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(self.questions.glob("*.json"))]


def rid_prefix(run_id: str, qid: str, attempt: int) -> str:
    """``<run>.<qid>`` (attempt 0) or ``<run>.<qid>~<attempt>``; the turn is appended by the agent."""
    base = f"{run_id}.{safe_qid(qid)}"
    return base if attempt == 0 else f"{base}~{attempt}"


def parse_rid(rid: str) -> tuple[str, str, int, int] | None:
    """(run_id, safe qid, attempt, turn) of an agent rid, or None if it is not one."""
    parts = rid.rsplit(".", 2)
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    run_id, qpart, turn = parts
    qid, _, attempt = qpart.partition("~")
    return run_id, qid, int(attempt or 0), int(turn)
