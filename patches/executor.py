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
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from patches.events import EventWriter
from policy.api import Arrival, Extend, Plan, Release
from policy.events import RequestEvent

logger = logging.getLogger(__name__)

STALE_LOG = "cache-policy executor: dropped state of %d request(s) the idle scheduler no longer has: %s"
OFF_PLAN_LOG = "cache-policy executor: %s read [%d, %d) but its plan's next forward is %s"


@dataclass
class _Tracked:
    queued_ts: float
    tokens: tuple[int, ...]  # the prompt, copied once: a waiting request is re-matched every pass
    plan: Plan
    read_until: int = 0  # end of the last prefill forward seen
    forwards_off_plan: int = 0
    snapshots: list = field(default_factory=list)  # [position, kind] written into the tree


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

    def _track(self, req, tokens: tuple[int, ...], plan: Plan) -> Plan:
        plan.validate(len(tokens))
        previous = self._tracked.get(req.rid)
        queued_ts = previous.queued_ts if previous else time.time()
        self._tracked[req.rid] = _Tracked(queued_ts=queued_ts, tokens=tokens, plan=plan, read_until=plan.resume)
        return plan

    def on_matched(self, req) -> None:
        """After SGLang matched ``req`` against the prefix tree.

        SGLang matches a waiting request again at every scheduling attempt until it is admitted;
        the latest plan wins and the first sighting's time is kept.
        """
        tree_hit = len(req.prefix_indices)
        if self.plans_in_tree:
            tracked = self._tracked.get(req.rid)
            if tracked is None or tracked.plan.resume != tree_hit:
                raise AssertionError(
                    f"{req.rid}: SGLang resumes at {tree_hit}, the plan at "
                    f"{tracked.plan.resume if tracked else None}"
                )
            return
        tokens = self._prompt(req)
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
        """Called by the exact tree during its match: plan from the matched depth and snapshot depths."""
        tokens = self._prompt(req)
        arrival = Arrival(
            rid=req.rid, tokens=tokens, cache_key=req.extra_key, tree_hit=max(states, default=0),
            tree_match=matched, tree_states=states,
        )
        return self._track(req, tokens, self.policy.plan(arrival))

    def piece_done(self, req, end: int) -> str | None:
        """A prefill forward of ``req`` ended at ``end``: returns the snapshot kind to keep there, or None.

        Checks the forward against the plan; a forward that is not the plan's next piece is logged
        (``OFF_PLAN_LOG``) and counted in the request's event, and takes no snapshot.
        """
        tracked = self._tracked[req.rid]
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
        if tracked is None:
            return None
        start = len(req.prefix_indices)
        return next((end - begin for begin, end in tracked.plan.forwards() if begin == start), None)

    def snapshot_written(self, req, position: int, kind: str) -> None:
        self._tracked[req.rid].snapshots.append([position, kind])

    # ------------------------------------------------------------------ release

    def on_release(self, req) -> None:
        """Before SGLang frees the request's KV: report it to the policy and write its event."""
        if not req.finished():
            return
        tracked = self._tracked.pop(req.rid, None)
        prompt_tokens = len(req.origin_input_ids)
        decode_tokens = len(req.output_ids)
        self.policy.release(Release(rid=req.rid, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens))
        if self.events is None:
            return
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
                plan_resume=tracked.plan.resume if tracked else None,
                finish_reason=finish_type(req.finished_reason),
                queued_ts=tracked.queued_ts if tracked else time.time(),
                finished_ts=time.time(),
                snapshots=tracked.snapshots if tracked else [],
                forwards_off_plan=tracked.forwards_off_plan if tracked else 0,
            )
        )

    # ------------------------------------------------------------------ idle

    def on_idle(self, scheduler) -> None:
        if not scheduler.is_fully_idle():
            return
        if self._tracked:
            # Requests aborted before admission never reach release_kv_cache.
            logger.error(STALE_LOG, len(self._tracked), sorted(self._tracked)[:5])
            self._tracked.clear()
        self.policy.check()


def finish_type(reason) -> str | None:
    if reason is None:
        return None
    as_json = reason.to_json() if hasattr(reason, "to_json") else None
    if isinstance(as_json, dict) and "type" in as_json:
        return str(as_json["type"])
    return type(reason).__name__
