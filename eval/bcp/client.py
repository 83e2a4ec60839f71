"""OpenAI-compatible chat client for the agent: per-request ``rid``, optional ``cache_salt``,
``chat_template_kwargs``, sampling settings, retries, and one client row per request.

The transport is a callable ``post(path, payload) -> dict`` (tests pass a scripted fake; runs use
``http_post(base_url)``). A reply is split into reasoning, visible text and tool calls:

* reasoning: ``message.reasoning_content`` when the server runs a reasoning parser, else the text
  before ``</think>`` (the generation prompt opens ``<think>``, so without a parser the reasoning
  comes back inline and ends at ``</think>``);
* tool calls: ``message.tool_calls`` when the server runs a tool-call parser (``--tool-call-parser
  qwen3_coder``); otherwise, the **text protocol fallback**, the calls are read from the text in the
  chat template's own format,
  ``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
  (the JSON form ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` is accepted too).
  Text-protocol calls are removed from the visible text and sent back as ``tool_calls``, so the
  template renders the same tokens either way.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from eval import http

Post = Callable[[str, dict], dict]

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FUNCTION = re.compile(r"<function=([^>\s]+)>\s*(.*?)\s*(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.S)


class ClientError(RuntimeError):
    """A request that failed for good (after retries, or not retryable)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ContextOverflow(ClientError):
    """The server refused the prompt as longer than its context window (ends the question)."""


@dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = ""
    raw_arguments: str = ""
    error: str | None = None  # arguments that did not parse

    def to_message(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass
class ChatResult:
    content: str
    reasoning: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict
    protocol: str | None  # "native", "text" or None (no tool call)
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage.get("prompt_tokens") or 0)

    @property
    def completion_tokens(self) -> int:
        return int(self.usage.get("completion_tokens") or 0)

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details") or {}
        return details.get("cached_tokens")

    def assistant_message(self) -> dict:
        """The message to append to the conversation (reasoning kept apart for the template)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [call.to_message() for call in self.tool_calls]
        return message


def _coerce(value: str) -> Any:
    text = value.strip()
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return value


def parse_text_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Tool calls written in the text (the template's XML form, or JSON); returns (text without
    the calls, calls). A block that does not parse becomes a call with ``error`` set."""
    calls: list[ToolCall] = []
    for block in _TOOL_CALL.finditer(text):
        body = block.group(1)
        function = _FUNCTION.search(body)
        if function:
            arguments = {m.group(1): _coerce(m.group(2)) for m in _PARAMETER.finditer(function.group(2))}
            calls.append(ToolCall(name=function.group(1), arguments=arguments, raw_arguments=function.group(2)))
            continue
        try:
            data = json.loads(body)
            arguments = data.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            calls.append(ToolCall(name=str(data["name"]), arguments=dict(arguments), raw_arguments=body))
        except (ValueError, KeyError, TypeError, AttributeError):
            calls.append(ToolCall(name="", arguments={}, raw_arguments=body, error="unparsable <tool_call> block"))
    if not calls:
        return text, []
    start = text.find("<tool_call>")
    return text[:start].rstrip(), calls


def split_reasoning(message: dict) -> tuple[str, str]:
    """(reasoning, visible text) of a reply message."""
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        return reasoning.strip(), content.lstrip("\n")
    if "</think>" in content:
        head, _, tail = content.partition("</think>")
        return head.split("<think>")[-1].strip(), tail.lstrip("\n")
    return "", content


def parse_reply(response: dict, protocol: str = "auto") -> ChatResult:
    choice = response["choices"][0]
    message = choice.get("message") or {}
    reasoning, content = split_reasoning(message)
    calls: list[ToolCall] = []
    used = None
    if protocol in ("auto", "native") and message.get("tool_calls"):
        for raw in message["tool_calls"]:
            function = raw.get("function") or {}
            text = function.get("arguments") or "{}"
            try:
                arguments = json.loads(text) if isinstance(text, str) else dict(text)
                error = None if isinstance(arguments, dict) else "arguments are not an object"
            except ValueError:
                arguments, error = {}, "arguments are not JSON"
            calls.append(ToolCall(name=function.get("name") or "", arguments=arguments if isinstance(arguments, dict) else {},
                                  id=raw.get("id") or "", raw_arguments=str(text), error=error))
        used = "native"
    elif protocol in ("auto", "text"):
        content, calls = parse_text_tool_calls(content)
        used = "text" if calls else None
    return ChatResult(content=content, reasoning=reasoning, tool_calls=calls,
                      finish_reason=choice.get("finish_reason"), usage=response.get("usage") or {},
                      protocol=used, raw=response)


def messages_sha256(messages: list[dict], tools: list | None = None) -> str:
    blob = json.dumps({"messages": messages, "tools": tools}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def http_post(base_url: str, timeout: float = 600.0) -> Post:
    """A transport for a real server; HTTP errors raise ``ClientError`` with the status, no answer
    at all raises ``eval.http.NoResponse`` (an ``OSError``, retried by ``ChatClient``)."""
    base = base_url.rstrip("/")

    def post(path: str, payload: dict) -> dict:
        try:
            return http.post_json(base + path, payload, timeout)
        except http.HttpError as exc:
            raise ClientError(f"POST {path} -> {exc.status}: {exc.text[:2000]}", status=exc.status) from None

    return post


def http_get(base_url: str, path: str, timeout: float = 30.0) -> Any:
    return http.get_json(base_url.rstrip("/") + path, timeout)


def _is_overflow(message: str) -> bool:
    text = message.lower()
    return any(k in text for k in ("context length", "maximum context", "context window", "too long", "longer than"))


class ChatClient:
    """One agent's connection: fixed model, sampling, template kwargs and cache salt."""

    def __init__(self, post: Post, *, model: str = "default", sampling: dict | None = None,
                 chat_template_kwargs: dict | None = None, cache_salt: str | None = None,
                 max_retries: int = 5, protocol: str = "auto", log: Callable[[dict], None] | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.post = post
        self.model = model
        self.sampling = dict(sampling or {})
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.cache_salt = cache_salt
        self.max_retries = max_retries
        self.protocol = protocol
        self.log = log
        self.sleep = sleep

    def payload(self, messages: list[dict], tools: list | None, rid: str) -> dict:
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "rid": rid, **self.sampling}
        if tools and self.protocol != "text":
            payload["tools"] = tools
        if self.chat_template_kwargs:
            payload["chat_template_kwargs"] = self.chat_template_kwargs
        if self.cache_salt:
            payload["cache_salt"] = self.cache_salt
        return payload

    def chat(self, messages: list[dict], *, tools: list | None = None, rid: str, qid: str = "", turn: int = 0,
             kind: str = "agent") -> ChatResult:
        payload = self.payload(messages, tools, rid)
        row: dict[str, Any] = {"rid": rid, "qid": qid, "turn": turn, "kind": kind, "n_messages": len(messages),
                               "messages_sha256": messages_sha256(messages, payload.get("tools")),
                               "t_send": time.time()}
        attempt, error = 0, None
        try:
            while True:
                attempt += 1
                try:
                    response = self.post("/v1/chat/completions", payload)
                    break
                except ClientError as exc:
                    error = str(exc)
                    if exc.status is not None and exc.status < 500 and exc.status != 429:
                        if _is_overflow(error):
                            raise ContextOverflow(error, exc.status) from None
                        raise
                except (OSError, TimeoutError) as exc:  # connection refused/reset, timeouts
                    error = f"{type(exc).__name__}: {exc}"
                if attempt >= self.max_retries:
                    raise ClientError(f"{rid}: gave up after {attempt} attempts: {error}")
                self.sleep(min(60.0, 2.0 ** attempt) * (0.5 + random.random() / 2))
            result = parse_reply(response, self.protocol)
            row.update(usage=result.usage, finish_reason=result.finish_reason, tool_protocol=result.protocol,
                       n_tool_calls=len(result.tool_calls))
            return result
        except ClientError as exc:
            row["error"] = str(exc)[:2000]
            raise
        finally:
            row["t_done"] = time.time()
            row["seconds"] = round(row["t_done"] - row["t_send"], 4)
            row["attempts"] = attempt
            if self.log is not None:
                self.log(row)
