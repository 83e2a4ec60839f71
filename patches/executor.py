"""Runs the selected policy inside a scheduler process: SGLang requests in, plans out, events written.

Hooks installed by ``patches.plugin`` (and, for ``exact``, the tree in ``patches/exact_tree.py``)
call into one ``PolicyExecutor``:

| SGLang call                                    | from         | executor method                  |
|------------------------------------------------|--------------|----------------------------------|
| ``Req.init_next_round_input`` (prefix match)    | AFTER hook   | ``on_matched``                   |
| ``ExactRadixCache.match_prefix``                | exact tree   | ``plan_exact``                   |
| ``ExactRadixCache.cache_unfinished_req``        | exact tree   | ``piece_done``, ``snapshot_written`` |
| ``mem_cache.common.release_kv_cache``           | BEFORE hook  | ``on_release``                   |
| ``Scheduler.on_idle``                           | BEFORE hook  | ``on_idle``                      |

Plans are made where the facts they need are known: for ``radix`` after SGLang's own match
(the tree hit is all it needs), for ``exact`` inside the tree walk (matched depth and snapshot
depths). The executor is the only reader of ``Req`` fields outside the exact tree. Per-request
state lives in one dict keyed by rid and is released in one place (``on_release``); ``on_idle``
checks it is empty when the scheduler has no requests, so a leak shows up as an ERROR line
(``STALE_LOG``), not as slow growth.

Containment: an exception inside a policy call never reaches SGLang's scheduler (which would
stop the server). Where a plain read is still correct it serves one: ``radix``'s plan is only a
description of SGLang's own match, and ``exact`` plans a cold read (resume 0, pieces from 0: a
cold read is exact by definition) when planning fails; where it is not (the exact tree served
something other than the plan), the request is aborted with the reason. Either way the log says
``cache-policy executor: fallback rid=… step=… outcome=… reason=…`` and the event's ``fallback``
carries it. ``match_cap`` records when SGLang capped the prefix match (``logprob_start_len``), so
``exact_cache.replay`` can be given the same cap.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from patches import faults
from patches.events import EventWriter
from policy.api import Arrival, Extend, Plan, Release
from policy.events import RequestEvent

logger = logging.getLogger(__name__)

STALE_LOG = "cache-policy executor: dropped state of %d request(s) the idle scheduler no longer has: %s"
OFF_PLAN_LOG = "cache-policy executor: %s read [%d, %d) but its plan's next forward is %s"
FALLBACK_LOG = "cache-policy executor: fallback rid=%s step=%s outcome=%s reason=%s"


@dataclass
class _Tracked:
    queued_ts: float
    tokens: tuple[int, ...]  # the prompt, copied once: a waiting request is re-matched every pass
    plan: Plan
    read_until: int = 0  # end of the last prefill forward seen
    forwards_off_plan: int = 0
    snapshots: list = field(default_factory=list)  # [position, kind] written into the tree
    fallback: str | None = None  # why a policy step failed (the event's ``fallback``)
    match_cap: int | None = None  # SGLang limited the prefix match to this many tokens


class PolicyExecutor:
    def __init__(self, policy, events: EventWriter | None = None, plans_in_tree: bool = False):
        self.policy = policy
        self.events = events
        self.plans_in_tree = plans_in_tree  # the tree calls plan_exact; on_matched only checks
        self._tracked: dict[str, _Tracked] = {}

    # ------------------------------------------------------------------ admission

    def _prompt(self, req) -> tuple[int, ...]:
        previous = self._tracked.get(req.rid)
        if previous is not None and len(previous.tokens) == len(req.origin_input_ids):
            return previous.tokens
        # First sighting, or SGLang rewrote the prompt (an abort shortens it to one token).
        return tuple(req.origin_input_ids)

    def _track(self, req, tokens: tuple[int, ...], plan: Plan | None, fallback: str | None = None) -> Plan | None:
        if plan is not None:
            plan.validate(len(tokens))
        previous = self._tracked.get(req.rid)
        queued_ts = previous.queued_ts if previous else time.time()
        self._tracked[req.rid] = _Tracked(
            queued_ts=queued_ts, tokens=tokens, plan=plan, read_until=plan.resume if plan else 0,
            fallback=fallback or (previous.fallback if previous else None), match_cap=match_cap(req, len(tokens)))
        return plan

    def _failed(self, req, step: str, outcome: str, exc: BaseException) -> str:
        """Log a contained failure of a policy step; returns the reason recorded in the event."""
        reason = f"{step}: {type(exc).__name__}: {exc}"
        logger.exception("cache-policy executor: policy step %s failed for rid=%s", step, req.rid)
        logger.error(FALLBACK_LOG, req.rid, step, outcome, reason)
        tracked = self._tracked.get(req.rid)
        if tracked is not None:
            tracked.fallback = tracked.fallback or reason
        return reason

    def _abort(self, req, reason: str) -> None:
        """End the request with an error: its answer can no longer be what the policy promises."""
        req.to_finish = abort_reason(f"cache policy {self.policy.name}: {reason}")

    def on_matched(self, req) -> None:
        """After SGLang matched ``req`` against the prefix tree.

        SGLang matches a waiting request again at every scheduling attempt until it is admitted;
        the latest plan wins and the first sighting's time is kept.
        """
        tree_hit = len(req.prefix_indices)
        if self.plans_in_tree:
            tracked = self._tracked.get(req.rid)
            if tracked is None or tracked.plan is None or tracked.plan.resume != tree_hit:
                # The exact tree checks this itself; reaching here means the resume point is
                # not the plan's, so the answer could not be exact: end the request.
                exc = AssertionError(f"SGLang resumes at {tree_hit}, the plan at "
                                     f"{tracked.plan.resume if tracked and tracked.plan else None}")
                self._abort(req, self._failed(req, "match", "abort", exc))
            return
        tokens = self._prompt(req)
        try:
            self._plan_radix(req, tokens, tree_hit)
        except Exception as exc:  # noqa: BLE001 - SGLang's own match stands: a plain radix read
            self._track(req, tokens, None)
            self._failed(req, "plan", "plain_read", exc)

    def _plan_radix(self, req, tokens: tuple[int, ...], tree_hit: int) -> None:
        faults.check(f"{self.policy.name}.plan", req.rid)
        arrival = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=tree_hit)
        plan = self.policy.plan(arrival)
        if plan.resume != tree_hit:
            raise NotImplementedError(
                f"plan {plan.rid}: resume {plan.resume} differs from the tree hit {tree_hit}; "
                "only a policy that plans inside the tree may move the resume point"
            )
        for step in plan.steps:
            if not isinstance(step, Extend):
                raise NotImplementedError(f"plan {plan.rid}: step {step!r} needs a policy that plans inside the tree")
        self._track(req, tokens, plan)

    def plan_exact(self, req, matched: int, states: tuple[int, ...]) -> Plan:
        """Called by the exact tree during its match: plan from the matched depth and snapshot depths.

        If planning fails, the request is planned as a cold read (nothing matched): exact by
        definition, only slower. If that fails too, the exception reaches the tree, which aborts."""
        tokens = self._prompt(req)
        arrival = Arrival(
            rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=max(states, default=0),
            tree_match=matched, tree_states=states,
        )
        try:
            faults.check("exact.plan", req.rid)
            return self._track(req, tokens, self.policy.plan(arrival))
        except Exception as exc:  # noqa: BLE001 - a cold read is still exact
            cold = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=0, tree_match=0,
                           tree_states=())
            plan = self._track(req, tokens, self.policy.plan(cold))
            self._failed(req, "plan", "cold_read", exc)
            return plan

    def piece_done(self, req, end: int) -> str | None:
        """A prefill forward of ``req`` ended at ``end``: returns the snapshot kind to keep there, or None.

        Checks the forward against the plan; a forward that is not the plan's next piece is logged
        (``OFF_PLAN_LOG``) and counted in the request's event, and takes no snapshot.
        """
        tracked = self._tracked.get(req.rid)
        if tracked is None or tracked.plan is None:
            return None  # nothing planned (a contained failure): keep nothing, read on
        try:
            faults.check("exact.piece", req.rid)
            return self._piece_done(req, tracked, end)
        except Exception as exc:  # noqa: BLE001 - keeping no snapshot is always safe
            self._failed(req, "piece", "no_snapshot", exc)
            return None

    def _piece_done(self, req, tracked: _Tracked, end: int) -> str | None:
        prompt_len = len(tracked.tokens)
        if end > prompt_len:  # the call after the last prefill forward counts the first output token
            end = prompt_len
        if end == tracked.read_until:
            return None
        forwards = tracked.plan.forwards()
        expected = next((f for f in forwards if f[0] == tracked.read_until), None)
        start, tracked.read_until = tracked.read_until, end
        if expected != (start, end):
            tracked.forwards_off_plan += 1
            logger.error(OFF_PLAN_LOG, req.rid, start, end, expected)
            return None
        return tracked.plan.snapshots().get(end)

    def next_piece_len(self, req) -> int | None:
        """Length of the planned forward that starts where ``req`` has read to, if any."""
        tracked = self._tracked.get(req.rid)
        if tracked is None or tracked.plan is None:
            return None
        start = len(req.prefix_indices)
        return next((end - begin for begin, end in tracked.plan.forwards() if begin == start), None)

    def snapshot_written(self, req, position: int, kind: str) -> None:
        tracked = self._tracked.get(req.rid)
        if tracked is not None:
            tracked.snapshots.append([position, kind])

    # ------------------------------------------------------------------ release

    def on_release(self, req) -> None:
        """Before SGLang frees the request's KV: report it to the policy and write its event."""
        if not req.finished():
            return
        tracked = self._tracked.pop(req.rid, None)
        prompt_tokens = len(req.origin_input_ids)
        decode_tokens = len(req.output_ids)
        try:
            faults.check(f"{self.policy.name}.release", req.rid)
            self.policy.release(Release(rid=req.rid, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens))
        except Exception as exc:  # noqa: BLE001 - the request is done; keep serving
            reason = self._failed(req, "release", "event_only", exc)
            if tracked is not None:
                tracked.fallback = tracked.fallback or reason
        if self.events is None:
            return
        try:
            self._write_event(req, tracked, prompt_tokens, decode_tokens)
        except Exception:  # noqa: BLE001 - a lost event line must not stop the server
            logger.exception("cache-policy executor: event for rid=%s not written", req.rid)

    def _write_event(self, req, tracked: _Tracked | None, prompt_tokens: int, decode_tokens: int) -> None:
        reused = min(req.cached_tokens, prompt_tokens)
        self.events.write(
            RequestEvent(
                rid=req.rid,
                policy=self.policy.name,
                prompt_tokens=prompt_tokens,
                prefix_reused=reused,
                moved=0,
                read=prompt_tokens - reused,
                decode_tokens=decode_tokens,
                cache_salt=req.extra_key,
                plan_resume=tracked.plan.resume if tracked and tracked.plan else None,
                finish_reason=finish_type(req.finished_reason),
                queued_ts=tracked.queued_ts if tracked else time.time(),
                finished_ts=time.time(),
                snapshots=tracked.snapshots if tracked else [],
                forwards_off_plan=tracked.forwards_off_plan if tracked else 0,
                fallback=tracked.fallback if tracked else None,
                match_cap=tracked.match_cap if tracked else match_cap(req, prompt_tokens),
            )
        )

    def on_abort(self, scheduler, recv_req) -> None:
        """BEFORE ``Scheduler.abort_request``: requests it pops from the waiting queue never reach
        ``release_kv_cache``; forget them here (they read nothing, so they write no event)."""
        for rid in aborted_waiting(scheduler, recv_req):
            self._tracked.pop(rid, None)

    # ------------------------------------------------------------------ idle

    def on_idle(self, scheduler) -> None:
        if not scheduler.is_fully_idle():
            return
        if self._tracked:
            # Requests aborted before admission never reach release_kv_cache.
            logger.error(STALE_LOG, len(self._tracked), sorted(self._tracked)[:5])
            self._tracked.clear()
        try:
            self.policy.check()
        except AssertionError:
            # A broken invariant is a bug to see in the log, not a reason to stop serving.
            logger.exception("cache-policy executor: policy invariant check failed")


def aborted_waiting(scheduler, recv_req) -> list[str]:
    """Rids ``Scheduler.abort_request`` will pop from the waiting queue (its own rule: every
    request when ``abort_all``, else those whose rid starts with the given one)."""
    prefix = getattr(recv_req, "rid", None) or ""
    everything = bool(getattr(recv_req, "abort_all", False))
    return [req.rid for req in scheduler.waiting_queue if everything or req.rid.startswith(prefix)]


def abort_reason(message: str):
    """SGLang's abort finish reason (HTTP 500 to the client, ``message`` in the answer)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT(message)


def match_cap(req, prompt_tokens: int) -> int | None:
    """The prefix-match limit SGLang applied below its usual ``len - 1``, or None: a request that
    asks for prompt logprobs from ``logprob_start_len`` is matched no further than that."""
    start = getattr(req, "logprob_start_len", -1)
    if getattr(req, "return_logprob", False) and start is not None and 0 <= start < prompt_tokens - 1:
        return int(start)
    return None


def finish_type(reason) -> str | None:
    if reason is None:
        return None
    as_json = reason.to_json() if hasattr(reason, "to_json") else None
    if isinstance(as_json, dict) and "type" in as_json:
        return str(as_json["type"])
    return type(reason).__name__
