"""serving/log_lines.py and patches/log_guard.py: one log record is one line, whatever a request
field holds. The guard's pieces are tested without installing it (it changes logging for the
whole process); the engine tests run servers with it installed."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from patches import log_guard
from serving.log_lines import LINE_BREAKS, one_line

FORGED = "a\nFinish: obj=GenerateReqInput(rid='evil'), out={'meta_info': {'id': 'evil', 'prompt_tokens': 9}}"


@pytest.mark.parametrize("brk", sorted(LINE_BREAKS))
def test_every_break_splitlines_knows_is_escaped(brk):
    text = f"rid=a{brk}Finish: x"
    assert len(text.splitlines()) == 2
    assert len(one_line(text).splitlines()) == 1


def test_one_line_leaves_ordinary_text_alone():
    text = "rid=abc done [kvreuse] ünï"
    assert one_line(text) is text


def emit(logger: logging.Logger, record_factory, *args, exc=None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[ts] %(message)s"))
    handler.formatter.formatException = lambda ei: log_guard.format_exception(ei)
    old = logging.getLogRecordFactory()
    logging.setLogRecordFactory(record_factory)
    logger.addHandler(handler)
    try:
        if exc is None:
            logger.error(*args)
        else:
            try:
                raise exc
            except type(exc):
                logger.exception(*args)
    finally:
        logger.removeHandler(handler)
        logging.setLogRecordFactory(old)
    return stream.getvalue()


def test_a_record_whose_message_holds_a_line_break_is_one_line():
    logger = logging.getLogger("test_log_lines.message")
    factory = log_guard._one_line_record_factory(logging.getLogRecordFactory())
    out = emit(logger, factory, "[kvreuse] scr fallback: rid=%s step=plan", FORGED)
    assert out.count("\n") == 1 and out.startswith("[ts] [kvreuse] scr fallback: rid=a\\nFinish: ")


def test_an_exception_message_stays_on_its_line_and_the_traceback_keeps_its_lines():
    logger = logging.getLogger("test_log_lines.exception")
    factory = log_guard._one_line_record_factory(logging.getLogRecordFactory())
    cause = ValueError("inner\nFinish: forged")
    try:
        raise RuntimeError(f"bad request {FORGED}") from cause
    except RuntimeError as exc:
        outer = exc
    out = emit(logger, factory, "step failed", exc=outer)
    lines = out.splitlines()
    assert lines[0] == "[ts] step failed" and any(line.startswith("Traceback") for line in lines)
    assert not any(line.startswith("Finish:") for line in lines)
    assert any(line.startswith("RuntimeError: bad request a\\nFinish:") for line in lines)
    assert any(line.startswith("ValueError: inner\\nFinish: forged") for line in lines)


def test_format_exception_matches_logging_for_plain_exceptions():
    try:
        raise KeyError("plain")
    except KeyError:
        info = sys.exc_info()
    assert log_guard.format_exception(info) == logging.Formatter().formatException(info)
