"""Where each prompt token came from, per request, and the checks that make the numbers trustworthy.

Per request r (``docs/eval.md`` §5.6): prompt P = prefix-reused R + moved M + read F; decode D.
Requests are grouped into conversations (``conversation_of``) to classify them:

* ``first``: the conversation's first request;
* ``edited``: the prefix match (R) stops more than ``EDIT_SLACK`` tokens short of the
  conversation's previous prompt: something before its end changed;
* ``append``: otherwise (the previous prompt is reused up to the slack).

A restart of the server (a later start-up record in the same events file, ``policy.events``)
empties its cache, so a conversation's previous prompt from before it is not compared with: the
conversation's first request after the restart is ``first`` again (``Served.segment``).

PFLOPs per request (``flops.py``): ``pflops`` = 2·N_body·(F + D)/1e15 (the paper's count),
``pflops_naive`` = 2·N_body·(P + D)/1e15 (no cache), ``pflops_attn_approx`` = ``pflops`` + the
attention term (393,216 FLOPs per query-key pair for Qwen3.6-27B; an upper bound under scr).

Checks (a failure makes a run unreportable; ``eval.report`` exits 2):
I1 per request R, M, F >= 0 and R + M + F = P, on the raw counts (nothing upstream clamps them);
I2 totals: sum(P - R) = sum(M) + sum(F), and
PFLOPs summed from rows = PFLOPs from the totals (rel. 1e-9); I3 policies without relocation
(radix, exact) have M = 0 everywhere; C1 (``check_client``) every client request is joined to
exactly one server row and every server row to one client request, with the same prompt and
decode counts, and (``lost_writes_failure``) how many answered calls have no event next to the
lost writes the events files record; X1 (``check_against_events``) a log's rows agree with the
server's events file.
The server-log checks (duplicate ``Finish:``, dropped splice lines, blocks <= K) are in
``server_log.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from eval.accounting.flops import QWEN36_27B, flops_per_pair, naive_pflops, prefix_reuse_pflops, with_attention_pflops

QWEN36_27B_PAIR_FLOPS = flops_per_pair(QWEN36_27B)  # 393,216
EDIT_SLACK = 64  # tokens; the rule for "edited"
NO_RELOCATION = ("radix", "exact")


@dataclass(frozen=True)
class Counts:
    """What a served request and its row both carry: which request, and where its prompt tokens
    came from (prompt = prefix reused + moved + read)."""

    rid: str
    policy: str
    conversation: str
    prompt_tokens: int
    prefix_reused: int
    moved: int
    read: int
    decode: int


@dataclass(frozen=True)
class Row(Counts):
    klass: str
    pflops: float
    pflops_naive: float = 0.0
    pflops_attn_approx: float = 0.0
    blocks: int = 0  # relocated blocks (server log under scr)
    cached_tokens: int | None = None  # SGLang's Finish-line count (server log); R + 2M under scr
    session: str = ""  # scr session id (kv6trace ev=req), if logged
    prev_prompt_tokens: int | None = None  # the conversation's previous prompt (what the class compares to)
    start: int | None = None  # start-up records before the request's event in its file (None: not from events)


@dataclass(frozen=True)
class Served(Counts):
    """One request as a source saw it, before classification (in finishing order)."""

    blocks: int = 0
    cached_tokens: int | None = None
    session: str = ""
    segment: tuple[str, int] | None = None  # (events file, start index) of the server that served it


def conversation_of(rid: str, cache_salt: str | None) -> str:
    """The conversation a request belongs to: the rid up to its last ``.`` (the workload driver's
    ``run.question.turn`` / ``conversation.turn`` ids), else its cache salt, else the rid itself."""
    if "." in rid:
        return rid.rsplit(".", 1)[0]
    return cache_salt if cache_salt else rid


def classify(prefix_reused: int, previous_prompt: int | None) -> str:
    if previous_prompt is None:
        return "first"
    return "edited" if prefix_reused < previous_prompt - EDIT_SLACK else "append"


def classify_rows(served: Iterable[Served], body_params: float,
                  pair_flops: int = QWEN36_27B_PAIR_FLOPS) -> list[Row]:
    """Requests in finishing order -> rows with their class (against the conversation's previous
    prompt) and PFLOPs."""
    rows, previous = [], {}
    for s in served:
        before, before_segment = previous.get(s.conversation, (None, None))
        if restarted_between(before_segment, s.segment):
            before = None
        rows.append(Row(
            rid=s.rid, policy=s.policy, conversation=s.conversation, prompt_tokens=s.prompt_tokens,
            prefix_reused=s.prefix_reused, moved=s.moved, read=s.read, decode=s.decode,
            klass=classify(s.prefix_reused, before),
            pflops=prefix_reuse_pflops(s.read, s.decode, body_params),
            pflops_naive=naive_pflops(s.prompt_tokens, s.decode, body_params),
            pflops_attn_approx=with_attention_pflops(s.prompt_tokens, s.read, s.decode, body_params, pair_flops),
            blocks=s.blocks, cached_tokens=s.cached_tokens, session=s.session, prev_prompt_tokens=before,
            start=None if s.segment is None else s.segment[1],
        ))
        previous[s.conversation] = (s.prompt_tokens, s.segment)
    return rows


def restarted_between(earlier: tuple[str, int] | None, later: tuple[str, int] | None) -> bool:
    """The server of one events file started again between two requests (its cache is gone)."""
    return earlier is not None and later is not None and earlier[0] == later[0] and earlier[1] != later[1]


def rows_from_events(events: Iterable, body_params: float, pair_flops: int = QWEN36_27B_PAIR_FLOPS,
                     segments: Sequence[tuple[str, int]] | None = None) -> list[Row]:
    """``policy.events.RequestEvent``s (in finishing order) -> classified rows with PFLOPs;
    ``segments``: each event's (events file, start index), when known."""
    events = list(events)
    segments = [None] * len(events) if segments is None else list(segments)
    return classify_rows((Served(
        rid=e.rid, policy=e.policy, conversation=conversation_of(e.rid, e.cache_salt),
        prompt_tokens=e.prompt_tokens, prefix_reused=e.prefix_reused, moved=e.moved, read=e.read,
        decode=e.decode_tokens, blocks=getattr(e, "blocks", 0), segment=segment)
        for e, segment in zip(events, segments, strict=True)), body_params, pair_flops)


def _i1(row: Row) -> str | None:
    """I1 for one row, on the counts as the source recorded them.

    Nothing upstream clamps them (``policy.events`` and ``server_log`` keep R = C - 2M raw), so a
    wrong double-count rule or a misparsed line shows up here as a negative part, never as a
    quietly plausible row.
    """
    parts = {"reused": row.prefix_reused, "moved": row.moved, "read": row.read}
    adds_up = sum(parts.values()) == row.prompt_tokens
    negative = [name for name, value in parts.items() if value < 0]
    if adds_up and not negative:
        return None
    text = (f"I1 {row.rid}: prompt {row.prompt_tokens} {'==' if adds_up else '!='} reused {row.prefix_reused} "
            f"+ moved {row.moved} + read {row.read}")
    return text + (f"; negative: {', '.join(negative)}" if negative else "")


def check(rows: Sequence[Row], body_params: float) -> list[str]:
    """Every failed check as ``"<id> <what>"``; empty when the run is consistent."""
    failures = []
    for row in rows:
        problem = _i1(row)
        if problem:
            failures.append(problem)
        if row.policy in NO_RELOCATION and row.moved != 0:
            failures.append(f"I3 {row.rid}: policy {row.policy} moved {row.moved} tokens")
    fresh = sum(r.prompt_tokens - r.prefix_reused for r in rows)
    moved, read, decode = (sum(getattr(r, f) for r in rows) for f in ("moved", "read", "decode"))
    if fresh != moved + read:
        failures.append(f"I2 totals: sum(P - R) = {fresh} != sum(M) + sum(F) = {moved + read}")
    from_rows = sum(r.pflops for r in rows)
    from_totals = prefix_reuse_pflops(read, decode, body_params)
    if abs(from_rows - from_totals) > 1e-9 * max(1.0, abs(from_totals)):
        failures.append(f"I2 PFLOPs: rows {from_rows} != totals {from_totals}")
    return failures


def check_client(rows: Sequence[Row], client: Sequence[dict]) -> list[str]:
    """C1: the client's requests (``eval.workload``'s ``client.jsonl`` records: rid, usage) and the
    server's rows are the same requests, one to one, with the same prompt and completion counts.
    A server row without a client request (warm-up, judge traffic, another client) fails too."""
    failures = []
    server = {row.rid: row for row in rows}
    seen: dict[str, int] = {}
    for record in client:
        seen[record["rid"]] = seen.get(record["rid"], 0) + 1
    for rid, count in seen.items():
        if count > 1:
            failures.append(f"C1 {rid}: {count} client requests with this rid")
    for record in client:
        rid = record["rid"]
        row = server.get(rid)
        if row is None:
            failures.append(f"C1 {rid}: client request without a server row")
            continue
        usage = record.get("usage") or {}
        for name, value in (("prompt_tokens", row.prompt_tokens), ("completion_tokens", row.decode)):
            if name in usage and usage[name] != value:
                failures.append(f"C1 {rid}: client {name} {usage[name]} != server {value}")
    for row in rows:
        if row.rid not in seen:
            failures.append(f"C1 {row.rid}: server row without a client request (foreign request)")
    return failures


def missing_events(client: Sequence[dict], served: Iterable[str]) -> list[str]:
    """The client's rids (in its order, once each) with no server event or row among ``served``."""
    served, missing = set(served), []
    for record in client:
        if record["rid"] not in served and record["rid"] not in missing:
            missing.append(record["rid"])
    return missing


def lost_writes_failure(missing: int, lost_writes: int) -> list[str]:
    """C1 in one line, when answered calls have no event: how many, next to the writes the events
    files record as lost (a full disk loses both)."""
    if not missing:
        return []
    lost = f"{lost_writes} lost writes (disk full?)" if lost_writes else "no lost writes"
    return [f"C1: {missing} answered calls have no event; the events files record {lost}"]


def check_against_events(rows: Sequence[Row], events: Iterable) -> list[str]:
    """X1: a log's rows and the server's own events file (``--cache-events``) agree per rid on
    P, R, M, F, D and relocated blocks; every rid in one is in the other."""
    failures = []
    by_rid = {e.rid: e for e in events}
    for row in rows:
        event = by_rid.pop(row.rid, None)
        if event is None:
            failures.append(f"X1 {row.rid}: in the log but not in the events file")
            continue
        log = (row.prompt_tokens, row.prefix_reused, row.moved, row.read, row.decode, row.blocks)
        ev = (event.prompt_tokens, event.prefix_reused, event.moved, event.read, event.decode_tokens,
              getattr(event, "blocks", 0))
        if log != ev:
            failures.append(f"X1 {row.rid}: log (P, R, M, F, D, blocks) = {log} != events {ev}")
    for rid in by_rid:
        failures.append(f"X1 {rid}: in the events file but not in the log")
    return failures


def summary(rows: Sequence[Row]) -> dict:
    """Totals and shares for a run (all requests, the edited ones, each class) and PFLOPs per
    request and per conversation."""

    def block(selected: Sequence[Row]) -> dict:
        prompt = sum(r.prompt_tokens for r in selected)
        totals = {f: sum(getattr(r, f) for r in selected) for f in ("prefix_reused", "moved", "read", "decode")}
        shares = {f"{f}_share": (totals[f] / prompt if prompt else 0.0) for f in ("prefix_reused", "moved", "read")}
        flops = {f: sum(getattr(r, f) for r in selected) for f in ("pflops", "pflops_naive", "pflops_attn_approx")}
        return {"requests": len(selected), "prompt_tokens": prompt, **totals, **shares, **flops,
                "blocks": sum(r.blocks for r in selected),
                "requests_with_relocation": sum(1 for r in selected if r.moved > 0)}

    classes = {k: sum(1 for r in rows if r.klass == k) for k in ("first", "append", "edited")}
    conversations = len({r.conversation for r in rows})
    total = block(rows)
    per = {f"{f}_per_{unit}": (total[f] / n if n else 0.0)
           for f in ("pflops", "pflops_naive", "pflops_attn_approx")
           for unit, n in (("request", len(rows)), ("conversation", conversations))}
    return {"all": total, "edited": block([r for r in rows if r.klass == "edited"]), "classes": classes,
            "by_class": {k: block([r for r in rows if r.klass == k]) for k in classes},
            "conversations": conversations, "policies": sorted({r.policy for r in rows}), **per}
