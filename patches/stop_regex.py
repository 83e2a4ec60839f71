"""``stop_regex`` matched with RE2, in time linear in the text, so no pattern can stall the scheduler.

SGLang 0.5.16 matches a request's stop regexes with Python's ``re`` in the scheduler, on the
request's decoded tail after every token (``Req._check_str_based_finish`` and
``Req._locate_str_stop_finished_len``); for a pattern with unbounded repetition the tail is the
whole output. A backtracking pattern (``([\\s\\S]+[\\s\\S]+[\\s\\S]+)+\\uffff``) then costs
exponential time per token, the scheduler loop stops turning and every other request waits
(seen: a trivial request beside it timed out after 75 s).

Here the scheduler's ``re`` is replaced, in ``sglang.srt.managers.schedule_batch`` alone, by
``LinearSearch``: ``search`` compiles the pattern with RE2 (cached) and every other attribute is the
standard module's. A pattern RE2 cannot compile (back-references, look-around, Python-only escapes
such as ``\\uFFFF``; RE2 writes ``\\x{FFFF}``) is refused at the door with a 400
(``pattern_problem``, used by ``patches/validation.py``), so it never reaches the scheduler.
Python's parser still has to accept it too: SGLang sizes the tail it decodes from it.
"""

from __future__ import annotations

import functools
import inspect
import re

import re2

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
# The functions whose ``re.search`` calls this replaces (checked at install: SGLang changed?).
MATCHERS = ("_check_str_based_finish", "_locate_str_stop_finished_len")
MAX_MEM = 8 << 20  # bytes RE2 may use to compile one pattern; more is refused, not swapped in


def _options():
    options = re2.Options()
    options.log_errors = False  # RE2 would write the client's pattern to stderr, outside logging
    options.max_mem = MAX_MEM
    return options


@functools.lru_cache(maxsize=4096)
def compiled(pattern: str):
    return re2.compile(pattern, _options())


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a stop regex on this server, or None."""
    try:
        compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        return (f"{pattern!r:.80} cannot be matched in linear time (RE2 refuses it: {reason}); "
                "stop_regex uses RE2 syntax: no back-references or look-around, \\x{FFFF} for a code point")
    return None


class LinearSearch:
    """Stands in for the ``re`` module inside ``schedule_batch``: ``search`` runs RE2."""

    @staticmethod
    def search(pattern, string, flags=0):
        if flags or not isinstance(pattern, str):
            return re.search(pattern, string, flags)
        return compiled(pattern).search(string)

    def __getattr__(self, name):
        return getattr(re, name)


def install() -> None:
    """Swap ``schedule_batch.re`` for ``LinearSearch``; stop the process if SGLang no longer
    matches stop regexes where this expects (the swap would then do nothing)."""
    import importlib

    module = importlib.import_module(SCHEDULE_BATCH)
    if isinstance(module.re, LinearSearch):
        return
    if module.re is not re:
        raise RuntimeError(f"{SCHEDULE_BATCH}.re is not the re module (SGLang internals changed?)")
    for name in MATCHERS:
        source = inspect.getsource(getattr(module.Req, name))
        if "re.search(" not in source:
            raise RuntimeError(f"{SCHEDULE_BATCH}.Req.{name} no longer calls re.search (SGLang internals changed?)")
    module.re = LinearSearch()
