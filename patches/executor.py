"""The one executor: runs the selected policy's plans inside a scheduler process, for every policy.

SGLang's calls reach it through the hook set that matches the policy's ``plans_at``
(``patches/hook_sets.py``); docs/ARCHITECTURE.md draws the request path. It asks the policy for a
``Plan`` (after SGLang's prefix match: ``radix``; inside the exact tree's match: ``exact``; at
enqueue: ``scr``), keeps one record per request (``patches.request_book.TrackedRequest`` in a
``RequestBook``) from the plan to the release hook, checks every prefill forward against the
plan's reads, writes each request's event, forgets requests aborted while waiting, counts
retractions, and checks at idle that no record is left (``lines.stale``). A plan's engine-time
steps (``Relocate``, ``Restore``) are carried out by the policy's step carrier (a
``policy.carrier.StepCarrier``, built by ``StepPolicy.step_carrier``), which the executor calls at
the points below with the request's record; it calls nothing else of the carrier, and of the policy
only the members of ``policy.api.CachePolicy``.

Containment: an exception inside a policy call or a step never reaches SGLang's scheduler. Where
a plain read is still correct it serves one (``radix``'s plan only describes SGLang's match;
``exact`` plans a cold read, exact by definition; a failed relocation reads the rest itself);
where it is not (the exact tree served something other than the plan), the request is aborted.
Either way the log says ``lines.fallback`` and the event's ``fallback`` carries the reason.
"""

from __future__ import annotations

import logging

from patches.request_book import (RequestBook, check_invariants, finish_type, forget_stale, prefix_match_cap,
                                  request_event, tree_plan_problem)
from policy import faults, ranks
from policy.api import Arrival, CachePolicy, Plan, Release, RequestRefused
from policy.carrier import StepCarrier
from policy.events import RequestEvent
from policy.executor_lines import PLAIN, ExecutorLines
from serving.event_writer import EventWriter

logger = logging.getLogger(__name__)

OFF_PLAN_LOG = "cache-policy executor: %s read [%d, %d) but its plan's next forward is %s"
FORCED = "_cache_policy_forced_chunk"  # set on a PrefillAdder whose round belongs to one request's steps


class PolicyExecutor:
    """One per scheduler process. ``steps``: the policy's step carrier (None: its plans only read
    and snapshot); ``log``: where its lines go (the carrier's logger, so a policy's lines stay in
    one stream)."""

    def __init__(self, policy: CachePolicy, events: EventWriter | None = None, steps: StepCarrier | None = None,
                 log: logging.Logger | None = None, scheduler=None):
        self.policy = policy
        self.scheduler = scheduler  # read for its chunked request only
        self.events = events
        self.plans_at = policy.plans_at
        self.steps = steps
        self.lines: ExecutorLines = steps.lines if steps is not None and steps.lines is not None else PLAIN
        self.logger = log or logger
        self._tracked = RequestBook()

    # ------------------------------------------------------------------ containment

    def contain(self, step: str, req, record, outcome: str, fn, *args):
        """Run one policy call or step; an exception ends in ``outcome`` for this request (the
        record's fallback, a log line, the carrier's ``undo``), never a dead scheduler. The engine's
        own code is never run in here (AROUND hooks call ``original`` outside), so only failures of
        the policy are caught. Ranks that disagree are not contained: no fallback can make them
        agree again."""
        try:
            return fn(*args)
        except ranks.RanksDisagree:
            raise
        except Exception as exc:  # noqa: BLE001 - containment is the point
            self._failed(req.rid if req is not None else None, step, outcome, exc, record, req)
            return None

    def _failed(self, rid, step: str, outcome: str, exc: BaseException, record=None, req=None) -> str:
        """Log a contained failure of a policy step (the traceback, then ``lines.fallback``), keep
        its reason for the event, and have the carrier undo what the step left half done."""
        reason = f"{step}: {type(exc).__name__}: {exc}"
        self.logger.exception(self.lines.step_failed, step, rid)
        if rid is None:
            return reason
        self._tracked.note_fallback(rid, reason)
        record = record or self._tracked.get(rid)
        if req is not None and record is not None and self.steps is not None and record.progress is not None:
            self.steps.undo(req, record)
        self.logger.error(self.lines.fallback, rid, step, outcome, reason)
        return reason

    def abort(self, req, step: str, exc: BaseException) -> None:
        """End the request with an error: its answer can no longer be what the policy promises."""
        reason = self._failed(req.rid, step, "abort", exc)
        req.to_finish = abort_reason(f"cache policy {self.policy.name}: {reason}")

    def _track(self, req, tokens: tuple[int, ...], plan: Plan | None):
        self._tracked.track(req.rid, tokens, plan, match_cap(req, len(tokens)))
        return self._tracked[req.rid]

    # ------------------------------------------------------------------ plans made at enqueue (scr)

    def on_enqueue(self, scheduler, req, is_retracted: bool = False, *args, **kwargs) -> None:
        """BEFORE ``Scheduler._add_request_to_queue``: a policy that plans at enqueue plans now
        (SCR: session match, diff, relocation plan). A request the policy refuses (a per-request
        setting it cannot serve) ends with a 400 naming the field."""
        if self.plans_at != "enqueue" or is_retracted or req.finished() or req.to_finish is not None:
            return
        if req.rid in self._tracked:
            return
        tokens = tuple(req.origin_input_ids)
        arrival = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=0,
                          session_id=getattr(req, "session_id", None))
        try:
            plan = self.policy.plan(arrival)
        except RequestRefused as exc:
            req.set_finish_with_abort(f"{exc.field}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a failed plan serves the request plainly
            self.logger.exception(self.lines.admit_failed, req.rid)
            self._track(req, tokens, None).fallback = f"admit: {exc}"
            return
        record = self._track(req, tokens, None)
        record.plan = plan
        self.contain("plan", req, record, "plain_read", self._arm, req, record)

    def _arm(self, req, record) -> None:
        if self.steps is not None:
            self.steps.armed(req, record)
        record.plan.validate(len(record.tokens))

    def _record(self, req):
        """The request's record, while its policy carries out steps for it (None otherwise)."""
        return self._tracked.get(req.rid) if self.steps is not None else None

    def init_round(self, original, req, tree_cache=None, cow_mamba=None, *args, **kwargs):
        """AROUND ``Req.init_next_round_input``: SGLang's match (waiting queue) or its chunk stash
        (chunked path), with the step carrier before and after it."""
        record = self._record(req)
        if record is not None and record.progress is not None:
            self.contain("advance_prefix", req, record, "plain_read", self.steps.before_round, req, record,
                         tree_cache is None)
        result = original(req, tree_cache, cow_mamba, *args, **kwargs)
        if record is not None and record.progress is not None:
            chunked = self.scheduler.chunked_req if self.scheduler is not None else None
            self.contain("round", req, record, "plain_read", self.steps.after_round, req, record,
                         tree_cache is not None, chunked is not None and chunked is not req)
        return result

    def add_one_req(self, original, adder, req, *args, **kwargs):
        """AROUND ``PrefillAdder.add_one_req``: a request whose steps need SGLang's chunked-request
        slot (SCR's phase 1) becomes the round's chunked request, and owns the round."""
        from sglang.srt.managers.schedule_policy import AddReqResult

        record = self._record(req)
        if getattr(adder, FORCED, False):
            if record is not None and record.progress is not None:
                self.contain("undo_direct", req, record, "plain_read", self.steps.not_admitted, req, record)
            return AddReqResult.OTHER
        has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
        needs_chunk = False
        if record is not None:
            needs_chunk = bool(self.contain("admit_round", req, record, "plain_read", self.steps.before_admission, req,
                                            record, bool(has_chunked or adder.new_chunked_req is not None)))
        result = original(adder, req, *args, **kwargs)
        if record is None or record.progress is None:
            return result
        admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
        chunk_free = adder.new_chunked_req is None or adder.new_chunked_req is req
        if self.contain("admit_round", req, record, "plain_read", self.steps.after_admission, req, record, admitted,
                        needs_chunk, chunk_free):
            adder.new_chunked_req = req
            setattr(adder, FORCED, True)
        return result

    def add_chunked_req(self, original, adder, req):
        """AROUND ``PrefillAdder.add_chunked_req``: a request in the middle of its steps stays the
        chunked request up to its next step, even when its cut token array was read."""
        record = self._record(req)
        if record is None or not self.steps.keeps_chunk(record, len(req.prefix_indices)):
            return original(adder, req)
        original(adder, req)
        setattr(adder, FORCED, True)
        return req

    def after_prefill(self, result, processor, batch, *args, **kwargs):
        """AFTER ``process_batch_result_prefill``: the carrier may keep state after each forward."""
        for req in batch.reqs:
            record = self._record(req)
            if record is not None and record.progress is not None:
                self.contain("save_state", req, record, "plain_read", self.steps.after_prefill, req, record)
        return result

    # ------------------------------------------------------------------ plans made at the match (radix)

    def after_match(self, result, req, tree_cache=None, *args, **kwargs) -> None:
        """AFTER ``Req.init_next_round_input``: a match against the tree (not the chunked path's call)."""
        if tree_cache is not None:
            self.on_matched(req)

    def on_matched(self, req) -> None:
        """After SGLang matched ``req`` against the prefix tree (again at every scheduling attempt
        until it is admitted: the latest plan wins, the first sighting's time is kept)."""
        tree_hit = len(req.prefix_indices)
        if self.plans_at == "tree":
            planned = self._tracked.planned_resume(req.rid)
            if planned != tree_hit:
                # The exact tree checks this itself; reaching here means the answer cannot be exact.
                self.abort(req, "match", AssertionError(f"SGLang resumes at {tree_hit}, the plan at {planned}"))
            return
        tokens = self._tracked.prompt(req.rid, req.origin_input_ids)
        try:
            self._plan_at_match(req, tokens, tree_hit)
        except Exception as exc:  # noqa: BLE001 - SGLang's own match stands: a plain radix read
            self._track(req, tokens, None)
            self._failed(req.rid, "plan", "plain_read", exc)

    def _plan_at_match(self, req, tokens: tuple[int, ...], tree_hit: int) -> None:
        faults.check(f"{self.policy.name}.plan", req.rid)
        plan = self.policy.plan(Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=tree_hit))
        problem = tree_plan_problem(plan, tree_hit)
        if problem is not None:
            raise NotImplementedError(problem)
        self._track(req, tokens, plan)

    # ------------------------------------------------------------------ plans made inside the tree (exact)

    def plan_in_tree(self, req, tree_match: int, states: tuple[int, ...]) -> Plan:
        """Called by the exact tree during its match: plan from the tree match and the snapshot depths.

        If planning fails, the request is planned as a cold read (nothing matched): exact by
        definition, only slower. If that fails too, the exception reaches the tree, which aborts."""
        tokens = self._tracked.prompt(req.rid, req.origin_input_ids)
        arrival = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=max(states, default=0),
                          tree_match=tree_match, tree_states=states)
        try:
            faults.check(f"{self.policy.name}.plan", req.rid)
            plan = self.policy.plan(arrival)
            self._track(req, tokens, plan)
            return plan
        except Exception as exc:  # noqa: BLE001 - a cold read is still exact
            cold = Arrival(rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=0, tree_match=0)
            plan = self.policy.plan(cold)
            self._track(req, tokens, plan)
            self._failed(req.rid, "plan", "cold_read", exc)
            return plan

    def tree_keys(self, req, ids) -> list[int] | None:
        """The tree's keys for ``ids`` of ``req`` (None: the token ids; ``CachePolicy.tree_keys``)."""
        return self.policy.tree_keys(req.origin_input_ids, ids)  # no copies: called at every match

    def piece_done(self, req, end: int) -> str | None:
        """A prefill forward of ``req`` ended at ``end``: returns the snapshot kind to keep there, or
        None. A forward that is not the plan's next piece is logged (``OFF_PLAN_LOG``), counted in
        the request's event, and keeps nothing."""
        tracked = self._tracked.get(req.rid)
        if tracked is None or tracked.plan is None:
            return None  # nothing planned (a contained failure): keep nothing, read on
        try:
            faults.check(f"{self.policy.name}.piece", req.rid)
            forward = tracked.read_to(end)
        except Exception as exc:  # noqa: BLE001 - keeping no snapshot is always safe
            self._failed(req.rid, "piece", "no_snapshot", exc)
            return None
        if forward is not None and not forward.on_plan:
            self.logger.error(OFF_PLAN_LOG, req.rid, forward.start, forward.end, forward.expected)
        return forward.keep if forward is not None else None

    def next_piece_len(self, req) -> int | None:
        """Length of the planned forward that starts where ``req`` has read to, if any."""
        return self._tracked.next_piece_len(req.rid, len(req.prefix_indices))

    def snapshot_written(self, req, position: int, kind: str) -> None:
        self._tracked.snapshot_written(req.rid, position, kind)

    def inner_keeps(self, req, start: int, end: int) -> list[tuple[int, str]]:
        """The keep points of ``req``'s plan strictly inside its forward ``[start, end)`` (exact,
        ``keeps=inside``): ``(position, kind)``, ascending; none when the forward is off the plan."""
        tracked = self._tracked.get(req.rid)
        return tracked.inner_keeps(start, end) if tracked is not None else []

    def keep_dropped(self, req, position: int | None, reason: str) -> None:
        """A keep inside a forward (at ``position``; None: all of the forward's) was not made (a later
        prompt resumes earlier; no other bits): logged, and the request's event carries the reason."""
        where = f"keep at {position}" if position is not None else "keeps of the forward"
        self._failed(req.rid, "keep", "no_snapshot", RuntimeError(f"{where}: {reason}"))

    # ------------------------------------------------------------------ the request leaves

    def on_release(self, req, *args, **kwargs) -> None:
        """BEFORE ``release_kv_cache``. Unfinished: SGLang retracted or preempted the request (it
        freed its rows and queues it again). Finished: the carrier stores what it keeps, the policy
        hears the release, the event is written, the record is forgotten."""
        record = self._tracked.get(req.rid)
        if not req.finished():
            if record is not None:
                self._retracted(req, record)
            return
        if record is None and self.plans_at == "enqueue":
            return  # a request the policy never planned (refused or finished before the queue)
        if record is not None and self.steps is not None and record.progress is not None:
            self.contain("store", req, record, "plain_read", self.steps.store, req, record)
        try:
            faults.check(f"{self.policy.name}.release", req.rid)
            self.policy.release(Release(rid=req.rid, prompt_tokens=len(req.origin_input_ids),
                                        decode_tokens=len(req.output_ids)))
        except Exception as exc:  # noqa: BLE001 - the request is done; keep serving
            self._failed(req.rid, "release", "event_only", exc)
        self._tracked.pop(req.rid, None)
        if self.events is None:
            return
        try:
            self.events.write(self._event(req, record))
        except Exception:  # noqa: BLE001 - a lost event line must not stop the server
            self.logger.exception("cache-policy executor: event for rid=%s not written", req.rid)

    def _retracted(self, req, record) -> None:
        record.retractions += 1
        if self.steps is None:
            return
        reason = self.steps.retracted(req, record)
        record.fallback = record.fallback or reason
        self.logger.warning(self.lines.fallback, req.rid, "retract", "plain_read", "retracted or preempted")

    def _event(self, req, record) -> RequestEvent:
        prompt_tokens = len(req.origin_input_ids)
        return request_event(record, match_cap(req, prompt_tokens), rid=req.rid, policy=self.policy.name,
                             prompt_tokens=prompt_tokens, cached_tokens=req.cached_tokens,
                             decode_tokens=len(req.output_ids), cache_salt=req.extra_key,
                             finish_reason=finish_type(req.finished_reason))

    def on_abort(self, scheduler, recv_req, *args, **kwargs) -> None:
        """BEFORE ``Scheduler.abort_request``: requests it pops from the waiting queue never reach
        ``release_kv_cache``; forget them here (they read nothing, so they write no event), and let
        the carrier give back what it holds for them."""
        for req in aborted_waiting(scheduler, recv_req):
            record = self._tracked.pop(req.rid, None)
            if record is not None and self.steps is not None:
                self.contain("abort", None, None, "plain_read", self.steps.forget, record)

    def on_idle(self, scheduler, *args, **kwargs) -> None:
        if scheduler.is_fully_idle():
            for record in forget_stale(self._tracked, self.logger, self.lines.stale):
                if self.steps is not None:
                    self.contain("stale", None, None, "plain_read", self.steps.forget, record)
            check_invariants(self.policy, self.logger, self.lines.invariant)


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
    """``patches.request_book.prefix_match_cap`` of an SGLang ``Req``."""
    return prefix_match_cap(getattr(req, "return_logprob", False), getattr(req, "logprob_start_len", -1), prompt_tokens)
