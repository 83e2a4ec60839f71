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

What a pattern may cost (``serving/request_limits.py``): RE2 compiles it within
``--stop-regex-max-mem`` (its ``max_mem``; more is refused with a 400 naming the flag), and each
process keeps compiled patterns in a cache bounded in bytes (``--stop-regex-cache``, each entry
counted at the most it may hold: ``request_limits.stop_regex_entry_bytes``). The pattern is compiled
with ``re2._Regexp`` itself, not ``re2.compile``, whose own ``lru_cache`` (128 entries, 8 MiB each by
its documentation, and more in practice) would keep a second copy outside that bound.
"""

from __future__ import annotations

import inspect
import re

import re2

from serving import request_limits
from serving.byte_lru import ByteLRU

SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
# The functions whose ``re.search`` calls this replaces (checked at install: SGLang changed?).
MATCHERS = ("_check_str_based_finish", "_locate_str_stop_finished_len")
TOO_LARGE = "pattern too large"  # the start of RE2's error for a program over max_mem

_state: dict = {"limits": None, "cache": None}


def _options(max_mem: int):
    options = re2.Options()
    options.log_errors = False  # RE2 would write the client's pattern to stderr, outside logging
    options.max_mem = max_mem
    return options


def cache() -> ByteLRU:
    """This process's compiled patterns, sized by its request limits (built on first use, after
    the launcher's environment is in place; built again if the limits change)."""
    limits = request_limits.current()
    if _state["limits"] != limits:
        max_mem = limits.stop_regex_max_mem
        _state.update(limits=limits, cache=ByteLRU(
            limits.stop_regex_cache_bytes, cost=lambda pattern: request_limits.stop_regex_entry_bytes(pattern, max_mem)))
    return _state["cache"]


def compiled(pattern: str):
    """``pattern`` compiled by RE2 within this server's ``max_mem``; raises ``re2.error``."""
    patterns = cache()
    max_mem = _state["limits"].stop_regex_max_mem
    return patterns.get_or_make(pattern, lambda: re2._Regexp(pattern, _options(max_mem)))


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a stop regex on this server, or None."""
    try:
        compiled(pattern)
    except UnicodeEncodeError:
        return f"{pattern!r:.80} is not valid Unicode"
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if reason.startswith(TOO_LARGE):
            limits = request_limits.current()
            return (f"{pattern!r:.80} needs more memory to compile than the "
                    f"{request_limits.format_size(limits.stop_regex_max_mem)} one pattern may use "
                    f"({limits.shown('stop_regex_max_mem')}; RE2: {reason}); a long repetition of a large "
                    "class or group is the usual cause")
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

    _check_re2()
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


def _check_re2() -> None:
    """``re2._Regexp(pattern, options)`` is google-re2's uncached constructor (what ``re2.compile``
    calls through its ``lru_cache``); stop if that changed rather than cache outside the bound."""
    init = getattr(getattr(re2, "_Regexp", None), "__init__", None)
    if init is None or list(inspect.signature(init).parameters) != ["self", "pattern", "options"]:
        raise RuntimeError("google-re2 has no _Regexp(pattern, options) constructor (google-re2 internals changed?)")
