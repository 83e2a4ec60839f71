"""What the policy executor remembers about each request, for its plan checks and its event.

``patches/executor.py`` reads SGLang's ``Req`` and hands plain values here: the prompt, the plan
(a ``policy.api.Plan``), where each prefill forward ended, the rows moved in. One
``TrackedRequest`` per request, for every policy, kept in a ``RequestBook`` keyed by rid from
the plan (at enqueue or at the first prefix match) to the release hook, which pops it (the
executor's idle check reports any left over). A policy whose steps need engine-time state of
their own (SCR's relocation progress) keeps it in ``progress``, which only its step carrier reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from policy.api import Read
from policy.events import RequestEvent


class Forward(NamedTuple):
    """A prefill forward over ``[start, end)``, checked against the plan."""

    start: int
    end: int
    expected: tuple[int, int] | None  # the plan's forward starting at ``start`` (None: there is none)
    keep: str | None  # snapshot kind to keep at ``end``; None also when the forward is off the plan

    @property
    def on_plan(self) -> bool:
        return self.expected == (self.start, self.end)


@dataclass
class TrackedRequest:
    queued_ts: float
    tokens: tuple[int, ...]  # the prompt, copied once: a waiting request is re-matched every pass
    plan: Any  # the ``policy.api.Plan``; None after a contained planning failure (a plain read)
    read_until: int = 0  # end of the last prefill forward seen
    forwards_off_plan: int = 0
    snapshots: list = field(default_factory=list)  # [position, kind] written into the tree
    pieces: list = field(default_factory=list)  # [start, end] of each prefill forward seen
    fallback: str | None = None  # why a policy step failed (the event's ``fallback``)
    match_cap: int | None = None  # SGLang limited the prefix match to this many tokens
    moved: int = 0  # rows relocated into the prefix (``Relocate`` steps carried out)
    blocks: int = 0  # relocations carried out
    retractions: int = 0  # times SGLang retracted or preempted the request after admission
    progress: Any = None  # the policy step carrier's own per-request state (None: it has none)

    def read_to(self, end: int) -> Forward | None:
        """Record a prefill forward that ended at ``end``; None when it read nothing new.

        SGLang's call after the last prefill forward counts the first output token, so ``end`` is
        clipped to the prompt. A forward that is not the plan's next piece is counted.
        """
        end = min(end, len(self.tokens))
        if end == self.read_until:
            return None
        expected = next((f for f in self.plan.forwards() if f[0] == self.read_until), None)
        start, self.read_until = self.read_until, end
        self.pieces.append([start, end])
        if expected != (start, end):
            self.forwards_off_plan += 1
            return Forward(start, end, expected, None)
        return Forward(start, end, expected, self.plan.snapshots().get(end))

    def inner_keeps(self, start: int, end: int) -> list[tuple[int, str]]:
        """The plan's keep points strictly inside its forward ``[start, end)``, ascending, with their
        kinds (a forward that is not the plan's keeps nothing inside)."""
        if self.plan is None or (start, end) not in self.plan.forwards():
            return []
        return sorted((at, kind) for at, kind in self.plan.snapshots().items() if start < at < end)

    def next_piece_len(self, start: int) -> int | None:
        """Length of the planned forward that starts at ``start``, if there is one."""
        if self.plan is None:
            return None
        return next((end - begin for begin, end in self.plan.forwards() if begin == start), None)


class RequestBook(dict):
    """rid -> ``TrackedRequest``."""

    def prompt(self, rid: str, ids) -> tuple[int, ...]:
        """The prompt as a tuple, copied only on first sight or when SGLang rewrote it (an abort
        shortens it to one token)."""
        previous = self.get(rid)
        if previous is not None and len(previous.tokens) == len(ids):
            return previous.tokens
        return tuple(ids)

    def track(self, rid: str, tokens: tuple[int, ...], plan, match_cap: int | None):
        """(Re)plan ``rid``: the latest plan wins; the first sighting's time, fallback and
        retraction count stay. Raises ``ValueError`` for a plan that does not tile the prompt."""
        if plan is not None:
            plan.validate(len(tokens))
        previous = self.get(rid)
        self[rid] = TrackedRequest(
            queued_ts=previous.queued_ts if previous else time.time(), tokens=tokens, plan=plan,
            read_until=plan.resume if plan else 0,
            fallback=previous.fallback if previous else None, match_cap=match_cap,
            retractions=previous.retractions if previous else 0)
        return plan

    def note_fallback(self, rid: str, reason: str) -> None:
        """Keep the first failure reason of a tracked request for its event."""
        tracked = self.get(rid)
        if tracked is not None:
            tracked.fallback = tracked.fallback or reason

    def planned_resume(self, rid: str) -> int | None:
        """Where the plan of ``rid`` resumes; None when it has none."""
        tracked = self.get(rid)
        return tracked.plan.resume if tracked is not None and tracked.plan is not None else None

    def next_piece_len(self, rid: str, start: int) -> int | None:
        """Length of the planned forward of ``rid`` that starts at ``start``, if any."""
        tracked = self.get(rid)
        return tracked.next_piece_len(start) if tracked is not None else None

    def snapshot_written(self, rid: str, position: int, kind: str) -> None:
        """The tree kept a snapshot of ``rid`` at ``position`` (the event lists it)."""
        tracked = self.get(rid)
        if tracked is not None:
            tracked.snapshots.append([position, kind])


def forget_stale(book: dict, logger, message: str) -> list:
    """The idle scheduler no longer has the requests left in ``book`` (aborted before admission, so
    never released): log them with ``message`` (an ERROR: state that leaked), forget them, return
    what was forgotten."""
    stale = list(book.values())
    if stale:
        logger.error(message, len(book), sorted(book)[:5])
        book.clear()
    return stale


def check_invariants(policy, logger, message: str) -> None:
    """``policy.check()`` at idle: a broken invariant is a bug to see in the log (``message`` and
    the traceback), not a reason to stop serving."""
    try:
        policy.check()
    except AssertionError:
        logger.exception(message)


def tree_plan_problem(plan, tree_hit: int) -> str | None:
    """Why a plan made after SGLang's tree match cannot be applied as that match (the executor's
    plain path), or None: it moves the resume point off the tree hit, or it has steps other than
    reads (a snapshot, a relocation)."""
    if plan.resume != tree_hit:
        return (f"plan {plan.rid}: resume {plan.resume} differs from the tree hit {tree_hit}; "
                "only a policy that plans inside the tree may move the resume point")
    for step in plan.steps:
        if not isinstance(step, Read):
            return f"plan {plan.rid}: step {step!r} needs a policy that plans inside the tree"
    return None


def event_fields(tracked: TrackedRequest | None, match_cap: int | None) -> dict:
    """The ``RequestEvent`` fields the executor's bookkeeping supplies (``match_cap``: SGLang's, for
    a request that was never tracked). ``plan_resume`` is the resume of a plan made at the match;
    a plan made at enqueue has none of its own (it resumes wherever the match ends)."""
    if tracked is None:
        return dict(plan_resume=None, queued_ts=time.time(), snapshots=[], forwards_off_plan=0, pieces=[],
                    fallback=None, match_cap=match_cap, blocks=0, retractions=0)
    plan = tracked.plan
    return dict(plan_resume=plan.resume if plan is not None and plan.resume_limit is None else None,
                queued_ts=tracked.queued_ts, snapshots=tracked.snapshots, forwards_off_plan=tracked.forwards_off_plan,
                pieces=tracked.pieces, fallback=tracked.fallback, match_cap=tracked.match_cap, blocks=tracked.blocks,
                retractions=tracked.retractions)


def accounting(prompt_len: int, cached_tokens: int, moved: int) -> tuple[int, int]:
    """``(prefix_reused, read)`` of a request's event::

        |0 .. prefix_reused|moved|read ... prompt_len|

    Without relocated rows SGLang's ``cached_tokens`` (at most the prompt) were reused. With them,
    SGLang counts each relocated row twice in ``cached_tokens`` (once attached, once in
    ``prepare_for_extend``), and nothing is clamped, so check I1 sees any error in the rule."""
    if moved == 0:
        reused = min(cached_tokens, prompt_len)
    else:
        reused = cached_tokens - 2 * moved
    return reused, prompt_len - reused - moved


def request_event(tracked: TrackedRequest | None, match_cap: int | None, *, prompt_tokens: int,
                  cached_tokens: int, **fields) -> RequestEvent:
    """The event of a request the executor served (``accounting``). ``fields``: ``rid``,
    ``policy``, ``decode_tokens``, ``cache_salt``, ``finish_reason``."""
    moved = tracked.moved if tracked is not None else 0
    reused, read = accounting(prompt_tokens, cached_tokens, moved)
    return RequestEvent(prompt_tokens=prompt_tokens, prefix_reused=reused, moved=moved, read=read,
                        finished_ts=time.time(), **event_fields(tracked, match_cap), **fields)


def piece_shortfall(piece_len: int | None, budget: int) -> int:
    """Tokens a forward budget lacks to read the whole planned piece of ``piece_len`` tokens (0: it
    does not, or no piece is planned). A budget at 0 or below is not stretched: SGLang already
    over-commits then, and schedules the chunked request in full (docs/exact.md §1.5)."""
    if piece_len is None or not 0 < budget < piece_len:
        return 0
    return piece_len - budget


def prefix_match_cap(return_logprob: bool, logprob_start_len: int | None, prompt_tokens: int) -> int | None:
    """The prefix-match limit SGLang applies below its usual ``len - 1``, or None: a request that
    asks for prompt logprobs from ``logprob_start_len`` is matched no further than that."""
    start = logprob_start_len
    if return_logprob and start is not None and 0 <= start < prompt_tokens - 1:
        return int(start)
    return None


def finish_type(reason) -> str | None:
    """The ``type`` of an SGLang finish reason (``stop``, ``length``, ``abort``, ...), or None."""
    if reason is None:
        return None
    as_json = reason.to_json() if hasattr(reason, "to_json") else None
    if isinstance(as_json, dict) and "type" in as_json:
        return str(as_json["type"])
    return type(reason).__name__
