"""Runs the selected policy inside a scheduler process: SGLang requests in, plans out, events written.

The hooks of ``patches/policy_hooks.py`` (and for ``exact`` the tree in ``patches/exact_tree.py``)
call one ``PolicyExecutor``; docs/ARCHITECTURE.md draws the request path. Per-request state is a
``serving.request_book.RequestBook``, released in one place (``on_release``); ``on_idle`` checks
it is empty when the scheduler has no requests, so a leak is an ERROR line (``STALE_LOG``).

Containment: an exception inside a policy call never reaches SGLang's scheduler. Where a plain
read is still correct it serves one (``radix``'s plan only describes SGLang's match; ``exact``
plans a cold read, exact by definition); where it is not (the exact tree served something other
than the plan), the request is aborted. Either way the log says ``FALLBACK_LOG`` and the event's
``fallback`` carries the reason.
"""

from __future__ import annotations

import logging

from serving import faults
from serving.event_writer import EventWriter
from policy.api import Arrival, Plan, Release
from policy.events import RequestEvent
from serving.request_book import (RequestBook, check_invariants, finish_type, forget_stale, prefix_match_cap,
                                  request_event, tree_plan_problem)

logger = logging.getLogger(__name__)

STALE_LOG = "cache-policy executor: dropped state of %d request(s) the idle scheduler no longer has: %s"
OFF_PLAN_LOG = "cache-policy executor: %s read [%d, %d) but its plan's next forward is %s"
FALLBACK_LOG = "cache-policy executor: fallback rid=%s step=%s outcome=%s reason=%s"


class PolicyExecutor:
    def __init__(self, policy, events: EventWriter | None = None, plans_in_tree: bool = False):
        self.policy = policy
        self.events = events
        self.plans_in_tree = plans_in_tree  # the tree calls plan_exact; on_matched only checks
        self._tracked = RequestBook()

    def _track(self, req, tokens: tuple[int, ...], plan: Plan | None) -> Plan | None:
        return self._tracked.track(req.rid, tokens, plan, match_cap(req, len(tokens)))

    def _failed(self, req, step: str, outcome: str, exc: BaseException) -> str:
        """Log a contained failure of a policy step; returns the reason recorded in the event."""
        reason = f"{step}: {type(exc).__name__}: {exc}"
        logger.exception("cache-policy executor: policy step %s failed for rid=%s", step, req.rid)
        logger.error(FALLBACK_LOG, req.rid, step, outcome, reason)
        self._tracked.note_fallback(req.rid, reason)
        return reason

    def abort(self, req, step: str, exc: BaseException) -> None:
        """End the request with an error: its answer can no longer be what the policy promises."""
        reason = self._failed(req, step, "abort", exc)
        req.to_finish = abort_reason(f"cache policy {self.policy.name}: {reason}")

    def after_match(self, result, req, tree_cache=None, *args, **kwargs) -> None:
        """AFTER ``Req.init_next_round_input``: a match against the tree (not the chunked path's call)."""
        if tree_cache is not None:
            self.on_matched(req)

    def on_matched(self, req) -> None:
        """After SGLang matched ``req`` against the prefix tree (again at every scheduling attempt
        until it is admitted: the latest plan wins, the first sighting's time is kept)."""
        tree_hit = len(req.prefix_indices)
        if self.plans_in_tree:
            planned = self._tracked.planned_resume(req.rid)
            if planned != tree_hit:
                # The exact tree checks this itself; reaching here means the answer cannot be exact.
                self.abort(req, "match", AssertionError(f"SGLang resumes at {tree_hit}, the plan at {planned}"))
            return
        tokens = self._tracked.prompt(req.rid, req.origin_input_ids)
        try:
            self._plan_radix(req, tokens, tree_hit)
        except Exception as exc:  # noqa: BLE001 - SGLang's own match stands: a plain radix read
            self._track(req, tokens, None)
            self._failed(req, "plan", "plain_read", exc)

    def _plan_radix(self, req, tokens: tuple[int, ...], tree_hit: int) -> None:
        faults.check(f"{self.policy.name}.plan", req.rid)
        plan = self.policy.plan(Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=tree_hit))
        problem = tree_plan_problem(plan, tree_hit)
        if problem is not None:
            raise NotImplementedError(problem)
        self._track(req, tokens, plan)

    def plan_exact(self, req, matched: int, states: tuple[int, ...]) -> Plan:
        """Called by the exact tree during its match: plan from the matched depth and snapshot depths.

        If planning fails, the request is planned as a cold read (nothing matched): exact by
        definition, only slower. If that fails too, the exception reaches the tree, which aborts."""
        tokens = self._tracked.prompt(req.rid, req.origin_input_ids)
        arrival = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=max(states, default=0),
                          tree_match=matched, tree_states=states)
        try:
            faults.check("exact.plan", req.rid)
            return self._track(req, tokens, self.policy.plan(arrival))
        except Exception as exc:  # noqa: BLE001 - a cold read is still exact
            cold = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=0, tree_match=0)
            plan = self._track(req, tokens, self.policy.plan(cold))
            self._failed(req, "plan", "cold_read", exc)
            return plan

    def tree_keys(self, req, ids) -> list[int] | None:
        """The exact tree's keys for ``ids`` of ``req`` (None: the token ids; ``ExactPolicy.tree_keys``)."""
        return self.policy.tree_keys(req.origin_input_ids, ids)  # no copies: called at every match

    def piece_done(self, req, end: int) -> str | None:
        """A prefill forward of ``req`` ended at ``end``: returns the snapshot kind to keep there, or
        None. A forward that is not the plan's next piece is logged (``OFF_PLAN_LOG``), counted in
        the request's event, and keeps nothing."""
        tracked = self._tracked.get(req.rid)
        if tracked is None or tracked.plan is None:
            return None  # nothing planned (a contained failure): keep nothing, read on
        try:
            faults.check("exact.piece", req.rid)
            forward = tracked.read_to(end)
        except Exception as exc:  # noqa: BLE001 - keeping no snapshot is always safe
            self._failed(req, "piece", "no_snapshot", exc)
            return None
        if forward is not None and not forward.on_plan:
            logger.error(OFF_PLAN_LOG, req.rid, forward.start, forward.end, forward.expected)
        return forward.keep if forward is not None else None

    def next_piece_len(self, req) -> int | None:
        """Length of the planned forward that starts where ``req`` has read to, if any."""
        return self._tracked.next_piece_len(req.rid, len(req.prefix_indices))

    def snapshot_written(self, req, position: int, kind: str) -> None:
        self._tracked.snapshot_written(req.rid, position, kind)

    def on_release(self, req, *args, **kwargs) -> None:
        """Before SGLang frees the request's KV: report it to the policy and write its event."""
        if not req.finished():
            return
        tracked = self._tracked.get(req.rid)
        try:
            faults.check(f"{self.policy.name}.release", req.rid)
            self.policy.release(Release(rid=req.rid, prompt_tokens=len(req.origin_input_ids),
                                        decode_tokens=len(req.output_ids)))
        except Exception as exc:  # noqa: BLE001 - the request is done; keep serving
            self._failed(req, "release", "event_only", exc)
        self._tracked.pop(req.rid, None)
        if self.events is None:
            return
        try:
            self.events.write(self._event(req, tracked))
        except Exception:  # noqa: BLE001 - a lost event line must not stop the server
            logger.exception("cache-policy executor: event for rid=%s not written", req.rid)

    def _event(self, req, tracked) -> RequestEvent:
        prompt_tokens = len(req.origin_input_ids)
        return request_event(tracked, match_cap(req, prompt_tokens), rid=req.rid, policy=self.policy.name,
                             prompt_tokens=prompt_tokens, cached_tokens=req.cached_tokens,
                             decode_tokens=len(req.output_ids), cache_salt=req.extra_key,
                             finish_reason=finish_type(req.finished_reason))

    def on_abort(self, scheduler, recv_req, *args, **kwargs) -> None:
        """BEFORE ``Scheduler.abort_request``: requests it pops from the waiting queue never reach
        ``release_kv_cache``; forget them here (they read nothing, so they write no event)."""
        for req in aborted_waiting(scheduler, recv_req):
            self._tracked.pop(req.rid, None)

    def on_idle(self, scheduler, *args, **kwargs) -> None:
        if scheduler.is_fully_idle():
            forget_stale(self._tracked, logger, STALE_LOG)
            check_invariants(self.policy, logger, "cache-policy executor: policy invariant check failed")


def aborted_waiting(scheduler, recv_req) -> list:
    """The requests ``Scheduler.abort_request`` will pop from the waiting queue (its own rule: every
    request when ``abort_all``, else those whose rid starts with the given one)."""
    prefix = getattr(recv_req, "rid", None) or ""
    everything = bool(getattr(recv_req, "abort_all", False))
    return [req for req in scheduler.waiting_queue if everything or req.rid.startswith(prefix)]


def abort_reason(message: str):
    """SGLang's abort finish reason (HTTP 500 to the client, ``message`` in the answer)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT(message)


def match_cap(req, prompt_tokens: int) -> int | None:
    """``serving.request_book.prefix_match_cap`` of an SGLang ``Req``."""
    return prefix_match_cap(getattr(req, "return_logprob", False), getattr(req, "logprob_start_len", -1), prompt_tokens)
