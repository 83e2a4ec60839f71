"""The context-editing pieces of the CLM-style agent (``docs/eval.md`` §2.1-§2.2), pure and testable.

* **Mirror.** The live context (the message list) is shown to the model as one text with a
  ``[[CTX_TURN i role=ROLE]]`` header per message; assistant tool calls appear as
  ``[[TOOL_CALL name]] {json arguments}`` lines in their turn. ``parse_back`` turns an edited
  mirror into messages again: turns may be deleted or have their text changed, never added,
  reordered or given another role, and the protected prefix (system prompt and task, plus the
  rollback ledger when there is one) must stay as it was. A turn whose text did not change keeps
  its original message whole (reasoning and call ids included); a changed assistant turn loses its
  hidden reasoning (the edit is what the model wants the turn to be).
* **Edit gate.** ``shrink`` accepts an edit only if the context gets smaller; ``fit`` accepts any
  edit that leaves the context within the enforced limit.
* **Budget.** Token counts are estimated as chars/4 times a ratio learned from the server's
  ``prompt_tokens`` (clamped to [0.5, 3]), as CLM does offline. One-shot nudges fire when the
  context first reaches each ratio of the budget and re-arm once it is back below; an urgent nudge
  fires every turn at or above ``persistent_nudge_ratio`` of the enforced limit.
* **Rollback.** When the next prompt would exceed the enforced limit, the most recent turns are
  dropped (an assistant turn together with its tool results) until the context is ``margin`` below
  the limit; a ledger message pinned after the task tells the model what was dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

PROTECT = 2  # system prompt and task are pinned
TURN_HEADER = re.compile(r"^\[\[CTX_TURN (\d+) role=([a-z]+)\]\]$", re.M)
TOOL_LINE = re.compile(r"^\[\[TOOL_CALL ([^\]\s]+)\]\] (.*)$", re.M)


class EditError(ValueError):
    """An edited mirror that cannot be turned back into messages."""


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)


def _arguments_text(call: dict) -> str:
    arguments = call.get("function", {}).get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True)


def turn_body(message: dict) -> str:
    body = _text(message.get("content"))
    for call in message.get("tool_calls") or []:
        line = f"[[TOOL_CALL {call.get('function', {}).get('name', '')}]] {_arguments_text(call)}"
        body = f"{body}\n{line}" if body else line
    return body


def render_mirror(messages: list[dict]) -> str:
    return "".join(f"[[CTX_TURN {i} role={m['role']}]]\n{turn_body(m)}\n" for i, m in enumerate(messages))


def parse_back(text: str, messages: list[dict], protect: int = PROTECT) -> list[dict]:
    """The messages an edited mirror stands for (see the module docstring); ``EditError`` if invalid."""
    headers = list(TURN_HEADER.finditer(text))
    if not headers:
        raise EditError("no [[CTX_TURN i role=...]] headers left")
    if text[:headers[0].start()].strip():
        raise EditError("text before the first [[CTX_TURN ...]] header")
    result, last = [], -1
    for n, header in enumerate(headers):
        index, role = int(header.group(1)), header.group(2)
        end = headers[n + 1].start() if n + 1 < len(headers) else len(text)
        body = text[header.end():end]
        body = body[1:] if body.startswith("\n") else body
        body = body[:-1] if body.endswith("\n") else body
        if index <= last:
            raise EditError(f"turn {index} is out of order or repeated")
        if index >= len(messages):
            raise EditError(f"turn {index} does not exist (turns cannot be added)")
        original = messages[index]
        if role != original["role"]:
            raise EditError(f"turn {index} changed role from {original['role']} to {role}")
        last = index
        if body == turn_body(original):
            result.append(original)
            continue
        if index < protect:
            raise EditError(f"turn {index} is protected and cannot be edited")
        result.append(_edited(original, body))
    kept = {int(h.group(1)) for h in headers}
    missing = [i for i in range(protect) if i not in kept]
    if missing:
        raise EditError(f"protected turns {missing} cannot be deleted")
    return result


def _edited(original: dict, body: str) -> dict:
    message = {"role": original["role"]}
    if original["role"] == "assistant":
        calls = [(m.group(1), m.group(2)) for m in TOOL_LINE.finditer(body)]
        content = TOOL_LINE.sub("", body).rstrip("\n")
        by_key = {(c.get("function", {}).get("name"), _arguments_text(c)): c for c in original.get("tool_calls") or []}
        tool_calls = []
        for name, arguments in calls:
            if (name, arguments) in by_key:
                tool_calls.append(by_key[(name, arguments)])
                continue
            try:
                parsed = json.loads(arguments)
            except ValueError:
                raise EditError(f"tool call {name} has arguments that are not JSON") from None
            if not isinstance(parsed, dict):
                raise EditError(f"tool call {name} needs a JSON object as arguments")
            tool_calls.append({"id": "", "type": "function",
                               "function": {"name": name, "arguments": json.dumps(parsed, ensure_ascii=False)}})
        message["content"] = content
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message
    message["content"] = body
    for key in ("tool_call_id", "name"):
        if key in original:
            message[key] = original[key]
    return message


def apply_edit(messages: list[dict], arguments: dict, protect: int = PROTECT) -> list[dict]:
    """The ``context`` tool's ``delete`` and ``replace`` actions, as an edited mirror parsed back."""
    action = arguments.get("action")
    mirror = render_mirror(messages)
    if action == "delete":
        turns = arguments.get("turns")
        if isinstance(turns, (int, str)):
            turns = [turns]
        try:
            drop = {int(t) for t in turns or []}
        except (TypeError, ValueError):
            raise EditError("turns must be a list of turn numbers") from None
        if not drop:
            raise EditError("delete needs a non-empty list of turns")
        unknown = sorted(t for t in drop if not 0 <= t < len(messages))
        if unknown:
            raise EditError(f"no such turns {unknown}")
        blocks = re.split(r"(?=^\[\[CTX_TURN \d+ role=[a-z]+\]\]$)", mirror, flags=re.M)
        kept = [b for b in blocks if b and int(TURN_HEADER.match(b).group(1)) not in drop]
        return parse_back("".join(kept), messages, protect)
    if action == "replace":
        old, new = arguments.get("old"), arguments.get("new", "")
        if not isinstance(old, str) or not old:
            raise EditError("replace needs a non-empty 'old' text")
        if not isinstance(new, str):
            raise EditError("'new' must be a text")
        count = mirror.count(old)
        if count != 1:
            raise EditError(f"'old' must occur exactly once in the context; it occurs {count} times")
        return parse_back(mirror.replace(old, new), messages, protect)
    raise EditError(f"unknown action {action!r}; use view, delete or replace")


def drop_orphan_tool_results(messages: list[dict]) -> list[dict]:
    """Tool results whose calling assistant turn was deleted are dropped with it."""
    result, open_calls = [], 0
    for message in messages:
        if message["role"] == "assistant":
            open_calls = len(message.get("tool_calls") or [])
        elif message["role"] == "tool":
            if open_calls <= 0:
                continue
            open_calls -= 1
        else:
            open_calls = 0
        result.append(message)
    return result


# ---- token estimates, the gate, nudges and rollback


def message_chars(messages: list[dict]) -> int:
    total = 0
    for message in messages:
        total += len(_text(message.get("content"))) + len(message.get("reasoning_content") or "") + 16
        for call in message.get("tool_calls") or []:
            total += len(json.dumps(call.get("function", {}), ensure_ascii=False)) + 16
    return total


@dataclass
class Budget:
    """Context budget bookkeeping for one question."""

    budget_tokens: int
    strict_target: int
    nudge_ratios: tuple[float, ...] = (0.25, 0.5, 0.75)
    persistent_ratio: float = 0.9
    tok_ratio: float = 1.0
    fixed_overhead_chars: int = 0  # tool schemas, which the server counts but the messages do not show
    fired: set = field(default_factory=set)

    def estimate(self, messages: list[dict]) -> int:
        return int((message_chars(messages) + self.fixed_overhead_chars) / 4 * self.tok_ratio)

    def calibrate(self, messages: list[dict], prompt_tokens: int) -> None:
        """Learn the chars/4 -> server tokens ratio from a prompt the server counted."""
        raw = (message_chars(messages) + self.fixed_overhead_chars) / 4
        if raw > 0 and prompt_tokens > 0:
            self.tok_ratio = min(3.0, max(0.5, prompt_tokens / raw))

    def nudges(self, tokens: int) -> list[tuple[str, float]]:
        """The nudges due at ``tokens``: (kind, ratio) with kind "ratio" or "persistent"."""
        due = []
        for ratio in self.nudge_ratios:
            if tokens >= ratio * self.budget_tokens:
                if ratio not in self.fired:
                    self.fired.add(ratio)
                    due.append(("ratio", ratio))
            else:
                self.fired.discard(ratio)  # re-armed after shrinking
        if tokens >= self.persistent_ratio * self.strict_target:
            due.append(("persistent", self.persistent_ratio))
        # Only the highest one-shot nudge is worth saying when several fire at once.
        ratio_nudges = [d for d in due if d[0] == "ratio"]
        return ([max(ratio_nudges, key=lambda d: d[1])] if ratio_nudges else []) + [d for d in due if d[0] != "ratio"]


def gate(kind: str, old_tokens: int, new_tokens: int, strict_target: int) -> str | None:
    """None when the edit is accepted, else why not."""
    if kind == "shrink" and new_tokens >= old_tokens:
        return f"rejected by the shrink gate: the context would go from {old_tokens} to {new_tokens} tokens (it must get smaller)"
    if new_tokens > strict_target:
        return f"rejected: the context would be {new_tokens} tokens, over the limit of {strict_target}"
    return None


def rollback(messages: list[dict], budget: Budget, target: int, protect: int) -> tuple[list[dict], int]:
    """Drop the most recent turns (an assistant turn with its tool results, or a lone user turn)
    until the estimate is at most ``target``; never the protected prefix. Returns (messages, turns dropped)."""
    messages = list(messages)
    dropped = 0
    while len(messages) > protect and budget.estimate(messages) > target:
        end = len(messages)
        start = end - 1
        while start > protect and messages[start]["role"] == "tool":
            start -= 1
        del messages[max(start, protect):end]
        dropped += 1
    return messages, dropped
