"""The policy executor's own log lines, and the words a policy may give them.

``patches/executor.py`` logs each line below through ``ExecutorLines``. A line is a policy's
words followed by the part every wording shares, its placeholders (``TAILS``), so the arguments
the executor passes always fit: ``worded`` joins them. ``PLAIN`` is the executor's wording; a
policy whose operators already grep other words (SCR's authors' ``[kvreuse]`` lines, which
``eval.accounting`` and the authors' report read: ``scr/lines.py`` ``EXECUTOR_LINES``) hands its
own with its step carrier. In ``policy/`` (standard library only) so a policy package can word
them. Formats (``%`` placeholders, in order):

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


# What every wording of a line ends with: its placeholders, in the order the executor passes them.
TAILS = ExecutorLines(
    fallback="rid=%s step=%s outcome=%s reason=%s",
    step_failed="%s failed for rid=%s",
    stale="dropped state of %d request(s) the idle scheduler no longer has: %s",
    invariant="invariant check failed",
    admit_failed="failed for rid=%s",
)


def worded(words: ExecutorLines) -> ExecutorLines:
    """Each line as ``words`` (a policy's, in the order of ``ExecutorLines``) + its ``TAILS``."""
    return ExecutorLines(*(head + tail for head, tail in zip(words, TAILS)))


PLAIN = worded(ExecutorLines("cache-policy executor: fallback ", "cache-policy executor: policy step ",
                             "cache-policy executor: ", "cache-policy executor: policy ",
                             "cache-policy executor: planning at enqueue "))
