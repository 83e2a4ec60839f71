"""What a chaos scenario must still hold after its faults (pure: files read in, verdicts out).

Each check is a ``Verdict`` (``ok`` True / False, or None where it does not apply, and one line of
detail) under a fixed name (``CHECKS``, the rows of the table):

| check            | holds when                                                                          |
|------------------|-------------------------------------------------------------------------------------|
| answered once    | every call of the trace has exactly one client record (retries included)           |
| forced ids       | no call came back with ids other than the trace's (the replay's Mismatch)           |
| identities       | ``eval.report ingest`` over every events file passes every check but C1's missing events |
| no event twice   | no rid has two events, except a copy in a segment a restart ended (a retried call) |
| no event lost    | the calls without an event are the last calls answered while the disk was full    |
| disk full logged | missing events = lost lines logged = the file's ``lost`` markers = the report's count |
| restart said     | every file whose server the scenario restarted has a ``restart`` start-up record, and ingest split it |
| exact = replay   | exact: each server start's reuse equals ``exact_cache.replay`` over its own calls (a shrunk pool: never more) |
| exact warm = cold| exact: warm and cold reads of the probes equal in ids and logprobs, bit for bit     |
| scr own rows     | scr: some call relocated rows, and each only when its conversation has an earlier call in the same server start |
| re-pinned        | router: every conversation of the killed worker was served after the kill          |
| no fatal lines   | no server log has a traceback or a broken invariant                                 |
"""

from __future__ import annotations

from dataclasses import dataclass

CHECKS = ("answered once", "forced ids", "identities", "no event twice", "no event lost", "disk full logged",
          "restart said", "exact = replay", "exact warm = cold", "scr own rows", "re-pinned", "no fatal lines")
MISSING_MARK = "have no event"  # the words of ingest's C1 count line for answered calls without an event
NO_ROW = "client request without a server row"  # ingest's per-rid C1 line


@dataclass(frozen=True)
class Verdict:
    ok: bool | None
    detail: str = ""

    @property
    def cell(self) -> str:
        return "n/a" if self.ok is None else ("pass" if self.ok else "FAIL")


def na(detail: str = "") -> Verdict:
    return Verdict(None, detail)


def conversation_of(rid: str) -> str:
    """``<run>.<conversation>.<turn>`` -> conversation."""
    return rid.split(".")[1] if rid.count(".") >= 2 else rid


@dataclass(frozen=True)
class Segment:
    """The events one server start wrote: ``file``, ``start`` (1-based; 0 before any start-up record)."""

    file: str
    start: int
    startup: dict | None
    events: tuple
    last: bool  # no later start in this file: its server may still be the one running


def segments(path: str) -> list[Segment]:
    """An events file cut at its start-up records (the reader skips cut lines and lost markers)."""
    from policy.events import STARTUP, read_jsonl

    parts: list[list] = [[None, []]]
    for _, row in read_jsonl(path).rows:
        if row.get("record") == STARTUP:
            parts.append([row, []])
        elif "rid" in row:
            parts[-1][1].append(row)
    found = [(i, s, e) for i, (s, e) in enumerate(parts) if s is not None or e]
    return [Segment(path, i, s, tuple(e), i == len(parts) - 1) for i, s, e in found]


def answered_once(trace_rids: list[str], client_rows: list[dict]) -> Verdict:
    seen: dict[str, int] = {}
    for row in client_rows:
        seen[row["rid"]] = seen.get(row["rid"], 0) + 1
    missing = [r for r in trace_rids if r not in seen]
    twice = [r for r, n in seen.items() if n > 1]
    extra = [r for r in seen if r not in set(trace_rids)]
    ok = not (missing or twice or extra)
    return Verdict(ok, f"{len(seen)}/{len(trace_rids)} calls" + (
        "" if ok else f"; missing {missing[:3]}, twice {twice[:3]}, not in the trace {extra[:3]}"))


def identities(failures: list[str], explained: set[str]) -> Verdict:
    """Every ingest failure, except C1's for the calls whose events the full disk took
    (``explained``: those rids): the per-rid line and the count line."""
    def accepted(failure: str) -> bool:
        if not explained:
            return False
        if MISSING_MARK in failure:
            return True
        head = failure.split(":", 1)[0].split()
        return len(head) == 2 and head[0] == "C1" and head[1] in explained and NO_ROW in failure

    other = [f for f in failures if not accepted(f)]
    return Verdict(not other, "every check passed" if not other else "; ".join(other[:3]))


def no_event_twice(segs: list[Segment], answered: set[str]) -> Verdict:
    """A rid in two segments is a retry only when every copy but the one that finished last is in
    a segment whose server was restarted since (it died with the answer on the wire)."""
    copies: dict[str, list[tuple[float, Segment]]] = {}
    for seg in segs:
        for event in seg.events:
            if event["rid"] in answered:
                copies.setdefault(event["rid"], []).append((event.get("finished_ts", 0.0), seg))
    bad, retried = [], []
    for rid, where in copies.items():
        if len(where) == 1:
            continue
        earlier = [seg for _, seg in sorted(where, key=lambda c: c[0])[:-1]]
        if all(not s.last for s in earlier) and len({(s.file, s.start) for _, s in where}) == len(where):
            retried.append(rid)
        else:
            bad.append(rid)
    detail = f"{len(retried)} retried after a crash (earlier copy in an ended segment)" if not bad else f"twice: {bad[:3]}"
    return Verdict(not bad, detail)


def no_event_lost(segs: list[Segment], answered: set[str], window: list[str]) -> Verdict:
    """The answered calls without an event must be the last calls of the full-disk window, in the
    order they were sent (once the disk is full every write fails; the first calls of a window may
    still fit in the page the events file already has), and at least one when there was a window."""
    have = {event["rid"] for seg in segs for event in seg.events}
    missing = [rid for rid in window if rid not in have]
    outside = sorted(answered - have - set(window))
    suffix = bool(missing) and window[len(window) - len(missing):] == missing
    ok = not outside and (suffix if window else not missing)
    detail = f"{len(missing)} of the {len(window)} calls in the full-disk window without an event"
    return Verdict(ok, detail + (f"; also without one: {outside[:4]}" if outside else "")
                   + ("" if ok or outside else f"; not the window's last calls: {missing[:4]}"))


def disk_full_logged(window: list[str], missing: int, lost_lines: int, lost_in_files: int,
                     missing_records: int | None) -> Verdict:
    """Every count of the losses agrees: events missing, lines the server logged, records the
    file's ``lost`` markers count, and what the report calls missing."""
    if not window:
        return na()
    ok = missing == lost_lines == lost_in_files == missing_records and missing > 0
    return Verdict(ok, f"{missing} events missing, {lost_lines} lost lines logged, {lost_in_files} counted "
                       f"in the file, report: {missing_records} missing")


def restart_said(segs: list[Segment], restarted: set[str], starts_by_file: dict[str, int]) -> Verdict:
    """``restarted``: the events files whose server the scenario restarted (from what it did, not
    from the files); each must have a start-up record saying ``restart`` and ``cache: cold``, and
    ingest must report at least two starts for it."""
    if not restarted:
        return na()
    said = {s.file for s in segs if s.startup and s.startup.get("restart") and s.startup.get("cache") == "cold"}
    unsaid = sorted(restarted - said)
    served_after = {s.file for s in segs if s.start >= 2 and s.events}  # a start that served nothing has no split
    unsplit = sorted(f for f in restarted & served_after if starts_by_file.get(f, 0) < 2)
    ok = not unsaid and not unsplit
    return Verdict(ok, f"{len(restarted)} restarted file(s): restart records in {len(restarted) - len(unsaid)}, "
                       f"ingest split {len(restarted) - len(unsplit)}" + (f"; not said: {unsaid}" if unsaid else "")
                   + (f"; not split: {unsplit}" if unsplit else ""))


def exact_equals_replay(agreements: list[dict], shrunk: set[tuple[str, int]]) -> Verdict:
    """``agreements``: per segment ``{"file", "start", "calls", "differ": [{served, predicted}]}``."""
    if not agreements:
        return na()
    bad, below = [], 0
    for a in agreements:
        for d in a["differ"]:
            if (a["file"], a["start"]) in shrunk and d["served"] < d["predicted"]:
                below += 1
            else:
                bad.append(d)
    calls = sum(a["calls"] for a in agreements)
    detail = f"{calls - below - len(bad)}/{calls} equal" + (f", {below} below (evicted: the shrunk pool)" if shrunk else "")
    return Verdict(not bad, detail if not bad else f"{detail}; off: {bad[:2]}")


def exact_warm_cold(probes: list[dict] | None, required: bool = False) -> Verdict:
    """exact's probes: each warm read bit-identical to a cold one. ``required`` (an exact run): a
    run that took no probe at all showed nothing, so it fails instead of reading as n/a."""
    if probes is None:
        return Verdict(False, "no warm/cold probe was taken") if required else na()
    bad = [p for p in probes if p["problems"]]
    unwarm = [p for p in probes if not p["warm_cached"]]
    uncold = [p for p in probes if p["cold_cached"]]  # the fresh namespace must have reused nothing
    ok = bool(probes) and not bad and not unwarm and not uncold
    return Verdict(ok, f"{len(probes) - len(bad)}/{len(probes)} bit-identical"
                       + (f"; {bad[0]['rid']}: {bad[0]['problems']}" if bad else "")
                       + (f"; {len(unwarm)} warm reads reused nothing" if unwarm else "")
                       + (f"; {len(uncold)} cold reads reused something" if uncold else ""))


def scr_own_rows(segs: list[Segment]) -> Verdict:
    """A relocated row must come from this server start's side buffer: the conversation's own
    earlier call there (the chaos trace's conversations never share a session). A run in which
    scr relocated nothing shows nothing: not a pass."""
    bad, relocated, fallbacks = [], 0, 0
    for seg in segs:
        seen: set[str] = set()
        for event in sorted(seg.events, key=lambda e: e["queued_ts"]):
            conv = conversation_of(event["rid"])
            if event.get("moved", 0) > 0:
                relocated += 1
                if conv not in seen:
                    bad.append(event["rid"])
            elif conv not in seen and not event["rid"].endswith(".0"):
                fallbacks += 1  # a conversation resumed on a server that never saw it: a plain read
            seen.add(conv)
    if bad:
        return Verdict(False, f"rows relocated without a session in this start: {bad[:3]}")
    if not relocated:
        return Verdict(False, "scr relocated nothing in this run, so the rule was never exercised")
    return Verdict(True, f"{relocated} calls relocated rows, each after its conversation's earlier call in the "
                         f"same start; {fallbacks} conversations resumed on a server without their session, read plainly")


def re_pinned(victims: set[str], after_kill: dict[str, set[str]]) -> Verdict:
    """``after_kill``: conversation -> the servers (file, start) that served it after the kill."""
    if not victims:
        return na("no conversation was on the killed worker")
    lost = sorted(v for v in victims if not after_kill.get(v))
    return Verdict(not lost, f"{len(victims) - len(lost)}/{len(victims)} conversations of the killed worker "
                   "served again" + (f"; never: {lost}" if lost else ""))


def no_fatal(fatal: dict[str, list[str]]) -> Verdict:
    return Verdict(not fatal, "none" if not fatal else f"{next(iter(fatal))}: {next(iter(fatal.values()))[0][:120]}")
