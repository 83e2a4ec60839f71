"""Every log record on one line (``serving/log_lines.py`` says why), in every server process.

Two places, both in the standard library's ``logging``, so they hold for SGLang's loggers, ours and
uvicorn's, whatever handlers SGLang configures later:

* a log-record factory that rewrites a record whose message has a line break into one line
  (``record.msg`` escaped, ``record.args`` consumed);
* ``logging.Formatter.formatException`` wrapped so the traceback keeps its lines but each
  exception's own message (``str(exc)``, which may quote request fields) is one line.
"""

from __future__ import annotations

import logging
import traceback

from serving.log_lines import one_line

_state = {"installed": False}


def _one_line_record_factory(base):
    def factory(*args, **kwargs):
        record = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed call: logging reports it when it formats
            return record
        flat = one_line(message)
        if flat != message:
            record.msg, record.args = flat, None
        return record

    return factory


def _flatten_messages(exc: traceback.TracebackException, seen: set[int]) -> None:
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(getattr(exc, "_str", None), str):
            exc._str = one_line(exc._str)
        for group in getattr(exc, "exceptions", None) or ():
            _flatten_messages(group, seen)
        _flatten_messages(exc.__context__, seen)
        exc = exc.__cause__


def format_exception(ei) -> str:
    """The traceback of ``ei`` as ``logging`` writes it, with every exception message on one line."""
    found = traceback.TracebackException(*ei, compact=True)
    if not hasattr(found, "_str"):  # another Python's internals: one line for the whole traceback
        return one_line("".join(found.format()).rstrip("\n"))
    _flatten_messages(found, set())
    return "".join(found.format()).rstrip("\n")


def install() -> None:
    """Idempotent; safe in every process."""
    if _state["installed"]:
        return
    logging.setLogRecordFactory(_one_line_record_factory(logging.getLogRecordFactory()))
    logging.Formatter.formatException = lambda self, ei: format_exception(ei)
    _state["installed"] = True
