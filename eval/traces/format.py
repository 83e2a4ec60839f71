"""The trace format: what an agent run sent to the LM and what came back, one JSON line per call.

A trace fixes the token sequences of a run, and cache decisions depend only on them, so a trace
recorded once (on a GPU, with the real model) can be replayed under every policy with forced
decoding (``python -m eval.replay``) and the cost side of the comparison measured exactly.

Format (JSONL, UTF-8, one object per line, in call order; blank lines are not allowed)::

    {"conversation": str,            # one agent episode (a BrowseComp-Plus question, a workload conversation)
     "turn": int,                    # 0, 1, 2, ... within the conversation, increasing by one
     "prompt_ids": [int, ...],       # the token ids the server read (non-empty)
     "completion_ids": [int, ...],   # the token ids it produced (forced on replay; may be empty)
     "cache_salt": str | null,       # the request's cache namespace (extra_key / cache_salt)
     # optional:
     "messages": [...], "chat_template_kwargs": {...}, "kind": str, "meta": {...}}

Calls of one conversation appear in turn order; conversations may interleave (the order the
calls were made). Unknown keys are an error (a typo would otherwise be silently dropped).
A malformed line raises :class:`TraceError` naming the file and line.

``meta.render``, when present, names how earlier turns were rendered (``eval/render.py``:
``default`` or ``preserve``); it must be one of those names and the same on every line of a file
(one run, one rendering). ``trace_render`` reads it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

from eval import render as render_mod

REQUIRED = ("conversation", "turn", "prompt_ids", "completion_ids", "cache_salt")
OPTIONAL = ("messages", "chat_template_kwargs", "kind", "meta")


class TraceError(ValueError):
    """A trace line that cannot be read; the message starts with ``FILE:LINE:``."""


@dataclass
class TraceCall:
    conversation: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    cache_salt: str | None = None
    messages: list | None = None
    chat_template_kwargs: dict | None = None
    kind: str | None = None
    meta: dict = field(default_factory=dict)

    def rid(self, run: str) -> str:
        """The replay's request id: ``<run>.<conversation>.<turn>``."""
        return f"{run}.{self.conversation}.{self.turn}"

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if k in REQUIRED or v not in (None, {}, [])}
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _is_ids(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def object_line(text: str, where: str, what: str, error: type[ValueError] = TraceError) -> dict:
    """One line holding a JSON object (``what``: what the line is, for the message), or ``error``
    naming ``where``; the transcript readers use it with their own error."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise error(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise error(f"{where}: {what} is a JSON object, got {type(data).__name__}")
    return data


def parse_line(text: str, where: str = "<trace>") -> TraceCall:
    """One trace line; ``where`` (``FILE:LINE``) prefixes every error."""
    data = object_line(text, where, "a trace line")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(data) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)}")
    if not isinstance(data["conversation"], str) or not data["conversation"]:
        raise TraceError(f"{where}: conversation must be a non-empty string")
    if any(c.isspace() for c in data["conversation"]):
        raise TraceError(f"{where}: conversation {data['conversation']!r} contains white space (it is part of a rid)")
    turn = data["turn"]
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
        raise TraceError(f"{where}: turn must be an integer >= 0, got {turn!r}")
    for key in ("prompt_ids", "completion_ids"):
        if not _is_ids(data[key]):
            raise TraceError(f"{where}: {key} must be a list of integer token ids >= 0")
    if not data["prompt_ids"]:
        raise TraceError(f"{where}: prompt_ids is empty")
    if data["cache_salt"] is not None and not isinstance(data["cache_salt"], str):
        raise TraceError(f"{where}: cache_salt must be a string or null")
    for key, kind in (("messages", list), ("chat_template_kwargs", dict), ("kind", str), ("meta", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise TraceError(f"{where}: {key} must be a {kind.__name__}")
    render = (data.get("meta") or {}).get("render")
    if render is not None and render not in render_mod.RENDERINGS:
        raise TraceError(f"{where}: meta.render must be one of {', '.join(render_mod.RENDERINGS)}, got {render!r}")
    return TraceCall(**{**data, "meta": data.get("meta") or {}})


def iter_trace(path: str | Path) -> Iterator[TraceCall]:
    """The calls of a trace file, checked line by line and for turn order per conversation."""
    path = Path(path)
    next_turn: dict[str, int] = {}
    render = None
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            where = f"{path}:{number}"
            if not text.strip():
                raise TraceError(f"{where}: blank line")
            call = parse_line(text, where)
            expected = next_turn.get(call.conversation, 0)
            if call.turn != expected:
                raise TraceError(f"{where}: conversation {call.conversation!r} turn {call.turn}, expected {expected}")
            next_turn[call.conversation] = expected + 1
            line_render = call.meta.get("render")
            if line_render is not None:
                if render is not None and line_render != render:
                    raise TraceError(f"{where}: meta.render {line_render!r}, earlier lines say {render!r} "
                                     "(one trace, one rendering)")
                render = line_render
            yield call


def read_trace(path: str | Path) -> list[TraceCall]:
    return list(iter_trace(path))


def write_trace(calls: Iterable[TraceCall], out: str | Path | IO[str]) -> int:
    """Write ``calls`` as JSONL (to a path, replaced, or an open text file); returns how many."""
    if hasattr(out, "write"):
        return _write(calls, out)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        return _write(calls, f)


def _write(calls: Iterable[TraceCall], f: IO[str]) -> int:
    count = 0
    for call in calls:
        f.write(call.to_json() + "\n")
        count += 1
    return count


def trace_render(calls: Iterable[TraceCall]) -> str:
    """The rendering of a trace (``eval/render.py``): its lines' ``meta.render``, else what their
    ``chat_template_kwargs`` ask for; a trace that records neither (a synthetic set from before
    renderings were named) was rendered the template's default way, which is ``default``. Lines
    that disagree are a ``TraceError``."""
    def line_render(call: TraceCall) -> str | None:
        if call.meta.get("render"):
            return call.meta["render"]
        return render_mod.from_kwargs(call.chat_template_kwargs) if call.chat_template_kwargs is not None else None

    seen = {line_render(call) for call in calls} - {None}
    if len(seen) > 1:
        raise TraceError(f"the trace mixes renderings {sorted(seen)}")
    return seen.pop() if seen else render_mod.DEFAULT


def by_conversation(calls: Iterable[TraceCall]) -> dict[str, list[TraceCall]]:
    """Calls grouped per conversation, in turn order, conversations in order of first call."""
    groups: dict[str, list[TraceCall]] = {}
    for call in calls:
        groups.setdefault(call.conversation, []).append(call)
    return groups
