"""Agent-run traces: the format (``format.py``), recording, and BCP-shaped synthetic traces
(``python -m eval.traces``)."""

from eval.traces.format import TraceCall, TraceError, by_conversation, iter_trace, parse_line, read_trace, write_trace

__all__ = ["TraceCall", "TraceError", "by_conversation", "iter_trace", "parse_line", "read_trace", "write_trace"]
