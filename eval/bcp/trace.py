"""The trace of a BCP run (``run --server-trace FILE`` -> ``run_dir/trace.jsonl``).

Conversation = the question id (``journal.safe_qid``), turn = the call's index among the question's answered calls.
Only each question's final attempt counts (the rids in its run file); a call the server never
answered (the client gave up, or the context overflowed and the agent rolled back) has no
server line and is left out, so the turns stay 0, 1, 2, ... as the trace format wants; the
agent's own call index is kept in ``meta.call``. Calls are in the order the client sent them
(``client_requests.jsonl``'s ``t_send``), which interleaves questions run concurrently. The
agent's messages per call are not kept by the run, so the trace has token ids only.
"""

from __future__ import annotations

import json
from pathlib import Path

from eval.bcp.journal import safe_qid
from eval.traces.record import ClientCall, record_trace

TRACE = "trace.jsonl"


def client_calls(client_rows: list[dict], records: list[dict], chat_template_kwargs: dict | None) -> list[ClientCall]:
    """The answered calls of the records' final attempts, in sending order, numbered per question."""
    final = {rid for record in records for rid in record.get("rids", [])}
    answered = [row for row in client_rows if row.get("rid") in final and "error" not in row]
    answered.sort(key=lambda row: row.get("t_send", 0.0))
    turns: dict[str, int] = {}
    calls = []
    for row in answered:
        qid = safe_qid(row["qid"])
        turn = turns.get(qid, 0)
        turns[qid] = turn + 1
        calls.append(ClientCall(rid=row["rid"], conversation=qid, turn=turn, kind=row.get("kind"),
                                meta={"qid": row["qid"], "call": row.get("turn")},
                                chat_template_kwargs=dict(chat_template_kwargs) if chat_template_kwargs else None))
    return calls


def collect_trace(source: Path, run_dir: Path, records: list[dict], chat_template_kwargs: dict | None = None,
                  timeout: float = 30.0) -> int:
    """Write ``run_dir/trace.jsonl`` from the server's ``--cache-trace`` file; returns the calls.

    Raises ``TraceError`` naming a call with no line in ``source`` (a resumed run needs the same
    server trace file as the interrupted one)."""
    rows_path = run_dir / "client_requests.jsonl"
    rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()] \
        if rows_path.exists() else []
    calls = client_calls(rows, records, chat_template_kwargs)
    return len(record_trace(source, calls, run_dir / TRACE, timeout=timeout))
