"""A scenario's files in, its verdicts out: ingest every events file, then ``checks.py``."""

from __future__ import annotations

import json
from pathlib import Path

from eval.chaos import checks
from eval.chaos.checks import Segment, Verdict, segments
from eval.chaos.run import RUN, Record, fatal, lost_count


def exact_agreements(segs: list[Segment], calls, unrecorded: dict[str, float] | None = None) -> list[dict]:
    """Per server start: its calls against ``exact_cache.replay`` over exactly the prompts that
    start read, in queue order. ``unrecorded``: rid -> send time of calls answered by the first
    start whose events the full disk took; their prompts are in the replay (the server read and
    kept them) but they have no served count to compare."""
    from eval.bench_policies import exact_agreement
    from exact_cache.config import ExactConfig

    result = []
    for seg in segs:
        if not seg.events or seg.startup is None:
            continue
        agreement = exact_agreement(calls, {e["rid"]: e for e in seg.events}, RUN,
                                    config=ExactConfig(**seg.startup["settings"]),
                                    unrecorded=unrecorded if seg.start == 1 else None)
        result.append({"file": seg.file, "start": seg.start, **agreement})
    return result


def after_kill(segs: list[Segment], victim_file: str | None) -> dict[str, set[str]]:
    """conversation -> the server starts other than the killed worker's (any of its starts: a
    restarted worker serving its own conversations again is no re-pinning) that served it."""
    served: dict[str, set[str]] = {}
    for seg in segs:
        if seg.file == victim_file:
            continue
        for event in seg.events:
            served.setdefault(checks.conversation_of(event["rid"]), set()).add(f"{seg.file}#{seg.start}")
    return served


def starts_per_file(summary: dict) -> dict[str, int]:
    """Events file -> the starts ingest reported for it (``summary.json`` ``starts``)."""
    counts: dict[str, int] = {}
    for start in summary.get("starts", []):
        counts[str(start["file"])] = counts.get(str(start["file"]), 0) + 1
    return counts


EVICT_RETRY = "[kvreuse] evict-before-fail: requested="  # scr.authors_log LINES["evict_retry"]


def evict_retries(logs: list[Path]) -> int:
    """scr's evict-then-retry lines in the server logs (the shrunk pool's effect on scr)."""
    return sum(p.read_text(errors="replace").count(EVICT_RETRY) for p in logs if p.exists())


def lost_lines(logs: list[Path]) -> int:
    return sum(lost_count(p) for p in logs)


def restarted_files(record: Record, files: list[Path]) -> set[str]:
    """The events files (as judged) whose server the scenario killed and started again."""
    if record.setup == "alone":
        return {str(p) for p in files} if "killed" in record.notes else set()
    name = record.notes.get("restarted")
    return {str(p) for p in files if name and p.name.startswith(name)}


def _ingested(record: Record, present: list[Path], client_path: Path | None) -> tuple[list, list[str], int, dict]:
    """The events files read and ingested with every check (``eval.report ingest``): their
    segments, the failed checks, the lines the writer reported lost, ingest's summary. A file that
    cannot be read is a failed check, not a usage error."""
    from eval.report import ingest
    from policy.events import read_jsonl

    summary: dict = {}
    try:
        segs = [s for path in present for s in segments(str(path))]
        if not present:
            failures = ["no events file was written"]
        else:
            _, failures = ingest(present, record.out / "report", client_path=client_path, policy=record.policy)
            summary = json.loads((record.out / "report" / "summary.json").read_text())
        lost_in_files = sum(read_jsonl(str(p)).lost for p in present)
    except ValueError as exc:  # an unreadable file or a call served twice: a failed check, not a usage error
        segs, failures, lost_in_files = [], [f"the events files cannot be ingested: {exc}"], 0
    return segs, failures, lost_in_files, summary


def judge(record: Record, calls, error: str | None = None) -> dict[str, Verdict]:
    """Every check of ``checks.CHECKS`` for one scenario (a scenario that raised fails the first two)."""
    notes = record.notes
    files = [Path(p) for p in notes.get("events_at_end", [str(p) for p in record.events])]
    client_rows = []
    client_path = record.out / "client.jsonl"
    if client_path.exists():
        client_rows = [json.loads(line) for line in client_path.read_text().splitlines() if line.strip()]
    answered = {row["rid"] for row in client_rows}
    window = list(notes.get("lost_window", []))
    segs, failures, lost_in_files, summary = _ingested(record, [p for p in files if p.exists()],
                                                       client_path if client_rows else None)
    have = {event["rid"] for seg in segs for event in seg.events}
    restarted = restarted_files(record, files)
    victims = {c for c, w in notes.get("pins_before_kill", {}).items() if w == notes.get("restarted")}
    victim_file = next((str(p) for p in files if notes.get("restarted") and p.name.startswith(notes["restarted"])),
                       None)
    shrunk = {(s.file, s.start) for s in segs if record.setup == "alone" and s.start >= 2}
    verdicts = {
        "answered once": checks.answered_once([c.rid(RUN) for c in calls], client_rows),
        "forced ids": Verdict(error is None or "Mismatch" not in error,
                             error if error and "Mismatch" in error else "no answer's ids differ from the trace"),
        "identities": checks.identities(failures, {rid for rid in window if rid not in have}),
        "no event twice": checks.no_event_twice(segs, answered),
        "no event lost": checks.no_event_lost(segs, answered, window),
        "disk full logged": checks.disk_full_logged(window, sum(1 for rid in window if rid not in have),
                                                    lost_lines(record.logs),
                                                    lost_in_files,
                                                    summary.get("missing_records")),
        "restart said": checks.restart_said(segs, restarted, starts_per_file(summary)),
        "exact = replay": (checks.exact_equals_replay(exact_agreements(segs, calls, notes.get("window_sent_ts")), shrunk)
                           if record.policy == "exact" else checks.na()),
        "exact warm = cold": checks.exact_warm_cold(notes.get("probes"), required=True) if record.policy == "exact" else checks.na(),
        "scr own rows": checks.scr_own_rows(segs) if record.policy == "scr" else checks.na(),
        "re-pinned": checks.re_pinned(victims, after_kill(segs, victim_file)) if record.setup == "router" else checks.na(),
        "no fatal lines": checks.no_fatal(fatal(record.logs)),
    }
    if error is not None:
        verdicts["answered once"] = Verdict(False, f"the scenario stopped: {error[:200]}")
    return verdicts
