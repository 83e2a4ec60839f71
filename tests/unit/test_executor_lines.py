"""``policy.executor_lines``: the executor's lines in its own words and in SCR's, byte for byte (an
interface: operators, ``eval/server.py`` and the engine tests grep them), each with the
placeholders the executor passes."""

from __future__ import annotations

import pytest

from policy.executor_lines import PLAIN, TAILS, ExecutorLines, worded
from scr.lines import EXECUTOR_LINES

# line -> (the executor's arguments, as logged in PLAIN, as logged in SCR's EXECUTOR_LINES)
LOGGED = {
    "fallback": (("r.1", "round", "plain_read", "boom"),
                 "cache-policy executor: fallback rid=r.1 step=round outcome=plain_read reason=boom",
                 "[kvreuse] scr fallback: rid=r.1 step=round outcome=plain_read reason=boom"),
    "step_failed": (("round", "r.1"), "cache-policy executor: policy step round failed for rid=r.1",
                    "[kvreuse] scr step round failed for rid=r.1"),
    "stale": ((2, "r.1, r.2"),
              "cache-policy executor: dropped state of 2 request(s) the idle scheduler no longer has: r.1, r.2",
              "scr: dropped state of 2 request(s) the idle scheduler no longer has: r.1, r.2"),
    "invariant": ((), "cache-policy executor: policy invariant check failed", "[kvreuse] scr invariant check failed"),
    "admit_failed": (("r.1",), "cache-policy executor: planning at enqueue failed for rid=r.1",
                     "[kvreuse] scr admission failed for rid=r.1"),
}


def test_every_line_is_listed():
    assert tuple(LOGGED) == ExecutorLines._fields


@pytest.mark.parametrize("line", LOGGED)
def test_each_line_as_logged(line):
    arguments, plain, scr = LOGGED[line]
    assert (getattr(PLAIN, line) % arguments, getattr(EXECUTOR_LINES, line) % arguments) == (plain, scr)


def test_a_wording_keeps_the_placeholders():
    words = ExecutorLines("a ", "b ", "c ", "d ", "e ")
    assert worded(words) == ExecutorLines(*(w + t for w, t in zip(words, TAILS)))
    assert all(line.endswith(tail) for line, tail in zip(EXECUTOR_LINES, TAILS))
