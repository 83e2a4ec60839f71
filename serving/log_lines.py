"""One log record, one line: the rule that keeps request fields from starting a log line.

The accounting reads the server log line by line (``Finish:``, the authors' ``[kvreuse]`` lines),
and any text before a marker is allowed (timestamps, process prefixes). A request field that
reaches a log message with a line break in it (a ``rid`` of ``"a\\nFinish: rid=evil ..."``, an
error message quoting client text) would then write a line of the client's choosing.
``one_line`` escapes every character ``str.splitlines`` breaks at, so a record stays one line;
``patches/log_guard.py`` applies it to every record's message and to the message part of every
logged exception, in every server process.
"""

from __future__ import annotations

# What str.splitlines() splits at (and so what a line-by-line reader could split at).
LINE_BREAKS = {
    "\n": "\\n", "\r": "\\r", "\x0b": "\\x0b", "\x0c": "\\x0c", "\x1c": "\\x1c", "\x1d": "\\x1d",
    "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029",
}
_TABLE = str.maketrans(LINE_BREAKS)


def one_line(text: str) -> str:
    """``text`` with its line breaks written as escapes (``\\n``): one line, still readable."""
    return text.translate(_TABLE) if any(c in text for c in LINE_BREAKS) else text
