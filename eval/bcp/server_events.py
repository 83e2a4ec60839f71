"""The server's events file (``--cache-events``) as a BCP run reads it: the per-request lines of
the run's rids are copied into the run directory (``events.jsonl``); the start-up record that
opens the file (it has no ``rid``) is checked and copied into the manifest by ``eval/bcp/startup.py``.

The scheduler writes a request's line as the request leaves it, which may be just after the client
has its answer, hence the wait.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def event_rids(path: Path) -> set[str]:
    """The rids that have a line in the events file (lines without a rid are skipped)."""
    rids: set[str] = set()
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            if line.strip():
                rid = json.loads(line).get("rid")
                if rid is not None:
                    rids.add(rid)
    return rids


def wait_for_rids(path: Path, rids, timeout: float, poll_s: float = 0.2) -> bool:
    """Waits until every rid has its line, or ``timeout`` runs out; returns whether all arrived."""
    deadline = time.monotonic() + timeout
    wanted = set(rids)
    while True:
        if wanted <= event_rids(path):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)


def collect_events(source: Path, run_dir: Path, run_id: str, rids: list[str], timeout: float = 30.0) -> int:
    """Copy the server's events of this run's requests into ``run_dir/events.jsonl``; returns how many."""
    wait_for_rids(source, rids, timeout=timeout)
    prefix = f"{run_id}."
    lines = []
    if Path(source).exists():
        for line in Path(source).read_text().splitlines():
            if line.strip() and json.loads(line).get("rid", "").startswith(prefix):
                lines.append(line)
    (run_dir / "events.jsonl").write_text("".join(l + "\n" for l in lines))
    return len(lines)
