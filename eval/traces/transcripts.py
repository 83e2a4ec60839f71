"""Agent transcripts in the OpenAI chat form, read and checked: the input of ``eval.traces import``.

A transcript is one conversation: a message list (``system``, ``user``, ``assistant``, ``tool``)
and the tool definitions sent with it. Every assistant message is one LM call
(``importer.py`` renders them). ``--format chat`` reads JSONL, one conversation per line::

    {"messages": [...], "tools": [...], "id": "..."}      # tools and id optional; other keys ignored

What a message may carry (the forms agent harnesses write):

* assistant reasoning as ``reasoning_content`` (``reasoning``, vLLM's newer name, is read the same)
  or as a leading ``<think>...</think>`` in ``content`` (the chat template reads it there);
* tool calls as ``tool_calls`` (``function.arguments`` a mapping or JSON object text, as SGLang
  requires) or as text ``<tool_call>`` blocks in ``content``;
* tool results as ``tool`` messages or as ``user`` messages wrapping ``<tool_response>...</tool_response>``
  (the template's own test: such a user turn is not a real query, so it strips no reasoning).

Checked, each failure a ``TranscriptError`` that starts with ``FILE:LINE`` and names the message:
JSON, the object's shape, roles (a ``system`` message only first), content types, tool-call
arguments, a tool result with no call before it (more results than the calls of the assistant
message they follow), and a transcript with no assistant message (nothing to import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from eval.traces.format import object_line
from eval.traces.rendering import as_mapping

ROLES = ("system", "user", "assistant", "tool")
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOL_CALL_OPEN = "<tool_call>"


class TranscriptError(ValueError):
    """An input the importer cannot read; the message starts with ``FILE:LINE:``."""


@dataclass
class Conversation:
    """One transcript, ready to render: its trace name, messages, tools and where it came from."""

    name: str
    messages: list[dict]
    tools: list | None
    where: str  # FILE:LINE, for errors and the trace lines' meta.source
    meta: dict = field(default_factory=dict)  # what the reader knows beyond the messages (recorded per line)


def text_of(content) -> str:
    """A message's text: a string, a list of text parts, or nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else part.get("text", "") for part in content)


def _check_content(content, where: str) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list) and all(isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text"
                                                                and isinstance(p.get("text"), str)) for p in content):
        return
    raise TranscriptError(f"{where}: content must be a string, a list of text parts or null")


def calls_made(message: dict) -> int:
    """Tool calls an assistant message makes: its ``tool_calls``, else its text ``<tool_call>`` blocks."""
    if message.get("tool_calls"):
        return len(message["tool_calls"])
    text = text_of(message.get("content"))
    return text.split("</think>")[-1].count(TOOL_CALL_OPEN)


def results_given(message: dict) -> int:
    """Tool results a message carries: one for a ``tool`` message, the ``<tool_response>`` blocks of
    a user turn that is nothing but them (the template's test), else none."""
    if message["role"] == "tool":
        return 1
    text = text_of(message.get("content")).strip()
    if message["role"] == "user" and text.startswith(TOOL_RESPONSE_OPEN) and text.endswith(TOOL_RESPONSE_CLOSE):
        return text.count(TOOL_RESPONSE_OPEN)
    return 0


def _check_tool_calls(message: dict, where: str) -> dict:
    calls = message.get("tool_calls")
    if calls is None:
        return message
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              and isinstance(c["function"].get("name"), str) for c in calls):
        raise TranscriptError(f"{where}: tool_calls must be a list of {{\"function\": {{\"name\", \"arguments\"}}}}")
    for number, call in enumerate(calls):
        try:
            as_mapping(call["function"].get("arguments"))
        except (ValueError, TypeError) as exc:
            raise TranscriptError(f"{where}: tool call {number} ({call['function']['name']}): {exc}") from None
    return message


def normalize(message, where: str) -> dict:
    """One checked message, with ``reasoning`` read as ``reasoning_content``."""
    if not isinstance(message, dict):
        raise TranscriptError(f"{where}: a message is a JSON object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise TranscriptError(f"{where}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    _check_content(message.get("content"), where)
    out = dict(message)
    if role == "assistant":
        reasoning = out.pop("reasoning", None)
        if out.get("reasoning_content") is None and reasoning is not None:
            out["reasoning_content"] = reasoning
        if out.get("reasoning_content") is not None and not isinstance(out["reasoning_content"], str):
            raise TranscriptError(f"{where}: reasoning_content must be a string")
        _check_tool_calls(out, where)
    elif message.get("tool_calls"):
        raise TranscriptError(f"{where}: only an assistant message may carry tool_calls")
    return out


def check_messages(messages, where: str) -> list[dict]:
    """The checked message list of one transcript (the module docstring's rules)."""
    if not isinstance(messages, list) or not messages:
        raise TranscriptError(f"{where}: messages must be a non-empty list")
    out, pending = [], 0
    for index, message in enumerate(messages):
        at = f"{where}: message {index}"
        message = normalize(message, at)
        if message["role"] == "system" and index:
            raise TranscriptError(f"{at}: a system message may only be the first message")
        given = results_given(message)
        if given:
            if given > pending:
                raise TranscriptError(f"{at}: a tool result with no call before it (the assistant message before "
                                      f"it made {pending} call(s) not yet answered)")
            pending -= given
        else:
            pending = calls_made(message) if message["role"] == "assistant" else 0
        out.append(message)
    if not any(m["role"] == "assistant" for m in out):
        raise TranscriptError(f"{where}: no assistant message, so no LM call to import")
    if out[0]["role"] == "assistant":
        raise TranscriptError(f"{where}: message 0: an assistant message needs a prompt before it")
    return out


def conversation_name(data: dict, path: Path, number: int, where: str) -> str:
    name = data.get("id")
    if name is None:
        return f"{path.stem}-{number}"
    if not isinstance(name, (str, int)) or isinstance(name, bool) or not str(name) or any(c.isspace() for c in str(name)):
        raise TranscriptError(f"{where}: id must be a non-empty string without white space (it is part of a rid)")
    return str(name)


def json_object(text: str, where: str, what: str) -> dict:
    """One JSON object (``what``: what the line is, for the error), or a ``TranscriptError``."""
    return object_line(text, where, what, TranscriptError)


def parse_chat_line(text: str, path: Path, number: int) -> Conversation:
    where = f"{path}:{number}"
    data = json_object(text, where, "a transcript line")
    if "messages" not in data:
        raise TranscriptError(f"{where}: missing field messages")
    tools = data.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise TranscriptError(f"{where}: tools must be a list of tool definitions (objects)")
    messages = check_messages(data["messages"], where)
    return Conversation(conversation_name(data, path, number, where), messages, tools or None, where)


def read_chat(path: str | Path) -> Iterator[Conversation]:
    """The transcripts of one chat JSONL file, checked (blank lines are skipped)."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, 1):
                if text.strip():
                    yield parse_chat_line(text, path, number)
    except UnicodeDecodeError as exc:
        raise TranscriptError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
