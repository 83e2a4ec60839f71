"""Where each prompt token came from, per request, and the checks that make the numbers trustworthy.

Per request r (``eval_spec.md`` §5.6): prompt P = prefix-reused R + moved M + read F; decode D.
Requests are grouped into conversations (``conversation_of``) to classify them:

* ``first``: the conversation's first request;
* ``edited``: the prefix match (R) stops more than ``EDIT_SLACK`` tokens short of the
  conversation's previous prompt: something before its end changed;
* ``append``: otherwise (the previous prompt is reused up to the slack).

Checks (a failure makes a run unreportable; ``eval.report`` exits 2):
I1 per request R, M, F >= 0 and R + M + F = P; I2 totals: sum(P - R) = sum(M) + sum(F), and
PFLOPs summed from rows = PFLOPs from the totals (rel. 1e-9); I3 policies without relocation
(radix, exact) have M = 0 everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from eval.accounting.flops import prefix_reuse_pflops

EDIT_SLACK = 64  # tokens; the rule for "edited"
NO_RELOCATION = ("radix", "exact")


@dataclass(frozen=True)
class Row:
    rid: str
    policy: str
    conversation: str
    prompt_tokens: int
    prefix_reused: int
    moved: int
    read: int
    decode: int
    klass: str
    pflops: float


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


def rows_from_events(events: Iterable, body_params: float) -> list[Row]:
    """``policy.events.RequestEvent``s (in finishing order) -> classified rows with PFLOPs."""
    rows, previous = [], {}
    for event in events:
        conversation = conversation_of(event.rid, event.cache_salt)
        rows.append(Row(
            rid=event.rid, policy=event.policy, conversation=conversation,
            prompt_tokens=event.prompt_tokens, prefix_reused=event.prefix_reused, moved=event.moved,
            read=event.read, decode=event.decode_tokens,
            klass=classify(event.prefix_reused, previous.get(conversation)),
            pflops=prefix_reuse_pflops(event.read, event.decode_tokens, body_params),
        ))
        previous[conversation] = event.prompt_tokens
    return rows


def check(rows: Sequence[Row], body_params: float) -> list[str]:
    """Every failed check as ``"<id> <what>"``; empty when the run is consistent."""
    failures = []
    for row in rows:
        parts = (row.prefix_reused, row.moved, row.read)
        if min(parts) < 0 or sum(parts) != row.prompt_tokens:
            failures.append(f"I1 {row.rid}: prompt {row.prompt_tokens} != reused {row.prefix_reused} "
                            f"+ moved {row.moved} + read {row.read} (or a part is negative)")
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


def summary(rows: Sequence[Row]) -> dict:
    """Totals and shares for a run (all requests and the edited ones)."""

    def block(selected: Sequence[Row]) -> dict:
        prompt = sum(r.prompt_tokens for r in selected)
        totals = {f: sum(getattr(r, f) for r in selected) for f in ("prefix_reused", "moved", "read", "decode")}
        shares = {f"{f}_share": (totals[f] / prompt if prompt else 0.0) for f in ("prefix_reused", "moved", "read")}
        return {"requests": len(selected), "prompt_tokens": prompt, **totals, **shares,
                "pflops": sum(r.pflops for r in selected)}

    classes = {k: sum(1 for r in rows if r.klass == k) for k in ("first", "append", "edited")}
    return {"all": block(rows), "edited": block([r for r in rows if r.klass == "edited"]), "classes": classes,
            "conversations": len({r.conversation for r in rows}), "policies": sorted({r.policy for r in rows})}
