"""Runs the selected policy inside a scheduler process: SGLang requests in, plans out, events written.

Three hooks (installed by ``patches.plugin``) call into one ``PolicyExecutor``:

| SGLang call                                   | hook   | executor method   |
|-----------------------------------------------|--------|-------------------|
| ``Req.init_next_round_input`` (prefix match)   | AFTER  | ``on_matched``    |
| ``mem_cache.common.release_kv_cache``          | BEFORE | ``on_release``    |
| ``Scheduler.on_idle``                          | BEFORE | ``on_idle``       |

The executor is the only reader of ``Req`` fields. Per-request state lives in one dict keyed by
rid and is released in one place (``on_release``); ``on_idle`` checks it is empty when the
scheduler has no requests, so a leak shows up as an ERROR line (``STALE_LOG``), not as slow growth.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from patches.events import EventWriter
from policy.api import Arrival, Extend, Plan, Release
from policy.events import RequestEvent

logger = logging.getLogger(__name__)

STALE_LOG = "cache-policy executor: dropped state of %d request(s) the idle scheduler no longer has: %s"


@dataclass
class _Tracked:
    queued_ts: float
    tokens: tuple[int, ...]  # the prompt, copied once: a waiting request is re-matched every pass
    plan: Plan


class PolicyExecutor:
    def __init__(self, policy, events: EventWriter | None = None, write_events: bool = True):
        self.policy = policy
        self.events = events if write_events else None
        self._tracked: dict[str, _Tracked] = {}

    # ------------------------------------------------------------------ admission

    def on_matched(self, req) -> None:
        """After SGLang matched ``req`` against the prefix tree: ask the policy for a plan.

        SGLang matches a waiting request again at every scheduling attempt until it is admitted;
        the latest plan wins and the first sighting's time is kept.
        """
        previous = self._tracked.get(req.rid)
        if previous is not None and len(previous.tokens) == len(req.origin_input_ids):
            tokens = previous.tokens
        else:  # first sighting, or SGLang rewrote the prompt (an abort shortens it to one token)
            tokens = tuple(req.origin_input_ids)
        arrival = Arrival(
            rid=req.rid,
            tokens=tokens,
            cache_key=req.extra_key,
            tree_hit=len(req.prefix_indices),
        )
        plan = self.policy.plan(arrival)
        plan.validate(len(tokens))
        self._execute(arrival, plan)
        queued_ts = previous.queued_ts if previous else time.time()
        self._tracked[req.rid] = _Tracked(queued_ts=queued_ts, tokens=tokens, plan=plan)

    def _execute(self, arrival: Arrival, plan: Plan) -> None:
        """Apply the plan to the request. The prefix SGLang matched is what gets reused, so a plan
        may only resume there and extend; other step kinds arrive with the policies that need them."""
        if plan.resume != arrival.tree_hit:
            raise NotImplementedError(
                f"plan {plan.rid}: resume {plan.resume} differs from the tree hit {arrival.tree_hit}; "
                "this executor only runs prefix-tree plans"
            )
        for step in plan.steps:
            if not isinstance(step, Extend):
                raise NotImplementedError(f"plan {plan.rid}: step {step!r} has no executor")

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
        finish = req.finished_reason
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
                finish_reason=_finish_type(finish),
                queued_ts=tracked.queued_ts if tracked else time.time(),
                finished_ts=time.time(),
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


def _finish_type(reason) -> str | None:
    if reason is None:
        return None
    as_json = reason.to_json() if hasattr(reason, "to_json") else None
    if isinstance(as_json, dict) and "type" in as_json:
        return str(as_json["type"])
    return type(reason).__name__
