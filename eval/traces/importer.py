"""``python -m eval.traces import``: real agent transcripts in, a trace (``format.py``) out.

Every assistant message of a transcript (``transcripts.py``: chat JSONL; ``bcp_runs.py``:
BrowseComp-Plus run files) is one LM call: its prompt is the chat template's rendering of the
messages before it with the generation prompt (reasoning stripped before the last real user query
under ``--render default``, kept under ``preserve``, ``eval/render.py``), its completion that
message as the model wrote it, after the generation prompt's ``<think>\\n``, ended by
``<|im_end|>`` (``rendering.Renderer``). Calls are numbered per conversation in message order;
each line's ``meta`` records the rendering, where the transcript came from (``source``,
``message``) and that the message list only grew (``edited_from_turn`` null), so
``eval/accounting/causes.py`` classes a diverging prompt as the template's doing.

A call whose prompt + completion does not fit the served context (``--max-context``, the long-
context tiny model's 131,072 positions by default) is an error naming the file, line and message,
as is every malformed input. The trace and its statistics (``FILE.stats.json``, as ``synth``
writes them, plus what the import had to guess) are written to temporary files and renamed into
place only when the whole input imported, so nothing partial is left under ``--out``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable

from eval import render as render_mod
from eval.traces.format import TraceCall, write_trace
from eval.traces.rendering import Renderer
from eval.traces.transcripts import Conversation, TranscriptError

DEFAULT_MAX_CONTEXT = 131_072  # positions of the long-context tiny model the replay serves (eval.bench_policies)


class SegmentEncoder:
    """The tokenizer's ``encode`` with a memory of the text between special tokens.

    A tokenizer whose added tokens are all matched on the raw text (not normalised, no stripping)
    splits the input at them first and encodes each piece on its own, so a prompt's ids are the
    concatenation of its pieces' ids; successive prompts of a conversation share almost all pieces,
    so each is encoded once. Any other tokenizer is called as is."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        added = list(tokenizer.added_tokens_decoder.values())
        plain = all(not (a.normalized or a.lstrip or a.rstrip or a.single_word) for a in added)
        contents = sorted((a.content for a in added), key=len, reverse=True)
        self.split = re.compile("(" + "|".join(map(re.escape, contents)) + ")") if plain and contents else None
        self.memo: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        if self.split is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        out: list[int] = []
        for piece in self.split.split(text):
            if piece:
                ids = self.memo.get(piece)
                if ids is None:
                    ids = self.memo[piece] = list(self.tokenizer.encode(piece, add_special_tokens=False))
                out += ids
        return out

    def forget(self) -> None:
        self.memo.clear()


class FastRenderer(Renderer):
    """``Renderer`` over a ``SegmentEncoder``."""

    def __init__(self, tokenizer, chat_template_kwargs: dict):
        super().__init__(tokenizer, chat_template_kwargs)
        self.encoder = SegmentEncoder(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.encoder.encode(text)


def conversation_calls(conversation: Conversation, renderer: Renderer, render: str, max_context: int) -> list[TraceCall]:
    """One trace call per assistant message of ``conversation`` (the module docstring's rules)."""
    from jinja2 import TemplateError  # the chat template's engine (a transformers requirement)

    messages, tools, calls = conversation.messages, conversation.tools, []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        at = f"{conversation.where}: message {index}"
        try:
            prompt_text, prompt_ids = renderer.prompt(messages[:index], tools)
            completion_ids = renderer.completion(prompt_text, messages[:index], tools, message)
        except (ValueError, TypeError, TemplateError) as exc:  # the template's own refusals (raise_exception)
            raise TranscriptError(f"{at}: the chat template cannot render it: {exc}") from None
        if len(prompt_ids) + len(completion_ids) > max_context:
            raise TranscriptError(f"{at}: prompt {len(prompt_ids):,} + completion {len(completion_ids):,} tokens do "
                                  f"not fit the served context of {max_context:,} (--max-context)")
        kind = "tool_call" if message.get("tool_calls") or "<tool_call>" in str(message.get("content")) else "answer"
        meta = {"render": render, "source": conversation.where, "message": index, "edited_from_turn": None,
                "rolled_back": False, **conversation.meta}
        calls.append(TraceCall(conversation=conversation.name, turn=len(calls), prompt_ids=prompt_ids,
                               completion_ids=completion_ids, cache_salt=None, kind=kind, meta=meta))
    return calls


def import_calls(conversations: Iterable[Conversation], renderer: Renderer, render: str,
                 max_context: int = DEFAULT_MAX_CONTEXT, progress=None) -> list[TraceCall]:
    """Every call of every conversation, conversations in input order (each one's calls in turn
    order); a conversation name seen twice is an error naming both places."""
    seen: dict[str, str] = {}
    calls: list[TraceCall] = []
    for conversation in conversations:
        if conversation.name in seen:
            raise TranscriptError(f"{conversation.where}: conversation {conversation.name!r} also comes from "
                                  f"{seen[conversation.name]} (one transcript per conversation)")
        seen[conversation.name] = conversation.where
        new = conversation_calls(conversation, renderer, render, max_context)
        calls += new
        if isinstance(renderer, FastRenderer):
            renderer.encoder.forget()
        if progress:
            progress(f"{conversation.name}: {len(new)} calls")
    return calls


def write_atomically(calls: list[TraceCall], stats: dict, out: Path) -> None:
    """The trace and ``out.stats.json``, each written beside its place and renamed into it; a
    failure removes the temporary files, so nothing partial is left under ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    stats_path = Path(str(out) + ".stats.json")
    scratch = [out.with_name(f".{out.name}.partial-{os.getpid()}"),
               stats_path.with_name(f".{stats_path.name}.partial-{os.getpid()}")]
    try:
        write_trace(calls, scratch[0])
        scratch[1].write_text(json.dumps(stats, indent=2) + "\n")
        os.replace(scratch[1], stats_path)
        os.replace(scratch[0], out)
    finally:
        for path in scratch:
            path.unlink(missing_ok=True)


def summary(calls: list[TraceCall], args, conversations: int, guesses: Iterable[str]) -> dict:
    from eval.traces.tree_model import radix_prefix_estimate

    prompt = sum(len(c.prompt_ids) for c in calls)
    reused = sum(radix_prefix_estimate(calls))
    clients = sorted({c.meta.get("client") for c in calls if c.meta.get("client")})
    questions = sorted({c.meta.get("question") for c in calls if c.meta.get("question")})
    return {"format": args.format, "inputs": [str(p) for p in args.inputs], "render": args.render,
            "tokenizer": str(args.tokenizer), "conversations": conversations, "calls": len(calls),
            "prompt_tokens": prompt, "completion_tokens": sum(len(c.completion_ids) for c in calls),
            "max_prompt_tokens": max((len(c.prompt_ids) for c in calls), default=0),
            **({"bcp_clients": clients} if clients else {}),
            **({"question_text": questions} if questions else {}),
            "radix_prefix_share": round(reused / prompt, 4) if prompt else 0.0, "guesses": list(guesses)}


def conversations_of(args) -> tuple[Iterable[Conversation], tuple[str, ...]]:
    """The transcripts the arguments name, and what reading them has to guess."""
    if args.format == "chat":
        from eval.traces.transcripts import read_chat

        return (c for path in args.inputs for c in read_chat(path)), ()
    from eval.traces import bcp_runs

    queries = bcp_runs.read_queries(args.queries) if args.queries else None
    guesses = bcp_runs.GUESSES + (() if queries is not None else (
        f"question texts: placeholders of {bcp_runs.PLACEHOLDER_WORDS} English words per query id (no --queries)",))
    return bcp_runs.read_runs(args.inputs, args.bcp_client, queries), guesses


@functools.lru_cache(maxsize=2)
def tokenizer_for(which):
    """The tokenizer with its chat template, loaded once per process (a few seconds each)."""
    from eval.traces.synth import load_tokenizer

    return load_tokenizer(which)


def run(args) -> int:
    from eval.traces.stats import format_statistics, set_statistics

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    conversations, guesses = conversations_of(args)
    conversations = list(conversations)  # every input checked before the tokenizer is loaded
    tokenizer = tokenizer_for(args.tokenizer)
    renderer = FastRenderer(tokenizer, render_mod.chat_template_kwargs(args.render))
    calls = import_calls(conversations, renderer, args.render, args.max_context, progress)
    count = len({c.conversation for c in calls})
    head = summary(calls, args, count, guesses)
    statistics = set_statistics(calls, tokenizer)
    write_atomically(calls, {**head, "statistics": statistics}, args.out)
    print("\n".join(f"{k}: {v}" for k, v in head.items() if k not in ("guesses", "radix_prefix_share")))
    print(f"estimated radix prefix share of prompt tokens: {head['radix_prefix_share']:.1%}")
    print(format_statistics(statistics))
    print(f"-> {args.out} and {args.out}.stats.json")
    return 0


def main(args) -> int:
    """The ``import`` subcommand (arguments from ``eval/traces/__main__.py``): a bad input is one
    line naming the file and line, exit status 2."""
    from eval.cli_types import run_main, usage

    return run_main("python -m eval.traces import", lambda: run(args), usage(TranscriptError, OSError))
