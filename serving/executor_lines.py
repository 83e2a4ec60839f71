"""The policy executor's own log lines, and the set a policy may give it in its own words.

``patches/executor.py`` logs each line below through ``ExecutorLines``; ``PLAIN`` is the
executor's wording. A policy whose operators already grep other words (SCR's authors' ``[kvreuse]``
lines, which ``eval.accounting`` and the authors' report read) hands its own ``ExecutorLines``
with its step carrier. Formats (``%`` placeholders, in order):

| line            | placeholders                     | level   | when                                        |
|-----------------|----------------------------------|---------|---------------------------------------------|
| ``fallback``    | rid, step, outcome, reason       | ERROR   | a policy step failed; ``outcome`` is what the request got (``plain_read``, ``cold_read``, ``abort``, ``event_only``) |
| ``step_failed`` | step, rid                        | ERROR   | the same failure, with its traceback (logged first) |
| ``stale``       | count, first rids                | ERROR   | the idle scheduler no longer has requests the executor tracks |
| ``invariant``   | (none)                           | ERROR   | ``policy.check()`` failed at idle (traceback follows) |
| ``admit_failed``| rid                              | ERROR   | a plan made at enqueue raised (the request is read plainly) |

A retraction of a request whose plan has engine-time steps logs ``fallback`` at WARNING (step
``retract``, outcome ``plain_read``).
"""

from __future__ import annotations

from typing import NamedTuple


class ExecutorLines(NamedTuple):
    fallback: str
    step_failed: str
    stale: str
    invariant: str
    admit_failed: str


PLAIN = ExecutorLines(
    fallback="cache-policy executor: fallback rid=%s step=%s outcome=%s reason=%s",
    step_failed="cache-policy executor: policy step %s failed for rid=%s",
    stale="cache-policy executor: dropped state of %d request(s) the idle scheduler no longer has: %s",
    invariant="cache-policy executor: policy invariant check failed",
    admit_failed="cache-policy executor: planning at enqueue failed for rid=%s",
)
