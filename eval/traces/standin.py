"""A seeded, scripted stand-in for the model behind the CLM-style BCP agent (``eval/bcp/agent.py``).

Why: the cache policies only see token sequences, so traces of the project's own agent driven by a
stand-in that behaves like a context-editing search model (thinks, searches, reads documents,
compacts its context when nudged, ignores some warnings and gets rolled back, submits) let the
three policies be compared without a GPU. The agent, its budget, nudges, edit gate and rollback
are the real ones; only the model is scripted.

The stand-in is a ``ChatClient`` (``chat(messages, tools=..., rid=..., qid=..., turn=...)``). Per
call it:

1. renders the prompt with the tiny tokenizer's chat template exactly as the server would
   (``Renderer``: tool-call arguments as mappings, as SGLang passes them; ``enable_thinking`` on,
   ``preserve_thinking`` as the run's rendering says, ``eval/render.py``), so ``usage.prompt_tokens``
   is the real count and the agent's budget calibrates on it;
2. decides one action from what the context shows (``decide``; the harness notes are plain user
   turns whose text starts with the markers of ``agent.NUDGE`` / ``URGENT`` / ``FINALIZE`` /
   ``LEDGER``) and its own per-question memory (steps taken, documents already requested, the last
   ledger it saw);
3. writes a reasoning block (a drawn length) and the one tool call, and takes the completion ids
   from the template's own rendering of that assistant turn (``Renderer.completion``), so no
   special token is written by hand.

``StandinParams`` lists every behavioural number with its source.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field

from eval.bcp import agent as bcp_agent
from eval.bcp import clm
from eval.bcp.client import ChatResult, ToolCall
from eval.traces import corpus
from eval.traces.format import TraceCall
from eval.traces.rendering import Renderer, template_messages  # noqa: F401 - re-exported for callers

SEARCH, GET_DOCUMENT, CONTEXT, SUBMIT = "search", "get_document", "context", "submit"
TASK_TOOLS = (SEARCH, GET_DOCUMENT)


def _marker(template: str) -> str:
    """``"[CONTEXT NOTICE]"`` from ``agent.NUDGE``: the note kinds are read by their fixed openings."""
    return template.split("]", 1)[0] + "]"


NUDGE_MARK, URGENT_MARK = _marker(bcp_agent.NUDGE), _marker(bcp_agent.URGENT)
FINALIZE_MARK, LEDGER_MARK = _marker(bcp_agent.FINALIZE), _marker(bcp_agent.LEDGER)


@dataclass(frozen=True)
class StandinParams:
    """The stand-in's behaviour. Sources: [spec] a number from the specs, [scaled] a realistic value
    shrunk so the default set replays on the 2-core CPU box, [chosen] our assumption, [radix] chosen
    to calibrate radix's prefix share on the default set (12 questions, seed 0) to the paper's 72.9 %
    under ``synth.radix_prefix_estimate``. Nothing was fitted to exact or scr."""

    # [chosen] the language of the corpus, reasoning, answers and summaries (corpus.LANGUAGES):
    # English read with Qwen3.6's tokenizer; "salad" for the fast tests on the tiny tokenizer.
    language: str = "english"
    # [scaled] reasoning per agentic step, in the trace's tokens. No measured number for Qwen3.6 on
    # BrowseComp-Plus exists in the specs or public sources we found; Qwen3-class thinking models
    # write a few hundred tokens per step. A median of 48 Qwen tokens (lognormal spread [chosen],
    # capped at 1,024) keeps the default set's forced decode on the 2-core CPU box within the
    # benchmark's hour: with the real 248,320-row vocabulary and ~16K-token contexts a decode step
    # costs ~40 ms there. Only the reasoning since the last real user query stays in the prompt
    # (the template strips the rest), so it moves the shares little; under the ``preserve``
    # rendering (eval/render.py) all of it stays and its length matters more.
    reasoning_tokens_median: int = 48
    reasoning_sigma: float = 0.7
    reasoning_tokens_max: int = 1024
    # [scaled] task steps (search/get_document calls) before submitting, uniform. BCP anchors:
    # gpt-oss-20b makes 12.6 search calls per question (docs/eval.md §1.10); the paper's ~1.0M prompt
    # tokens per question at <= 26.6K context imply ~40-50 calls (docs/eval.md §2.6.4). With the edit
    # turns this gives ~28 calls per question.
    task_steps: tuple[int, int] = (14, 30)
    # [radix] share of task steps that read a whole document (BCP offers get_document; no published
    # ratio). A page of up to 60,000 characters is up to ~16K tokens, so reads are what overflow the
    # limit and cause most rollbacks; 0.1 keeps rollbacks at about one per question.
    p_get_document: float = 0.1
    # [chosen] query shape: topic terms from the question plus ordinary words.
    query_terms: tuple[int, int] = (1, 3)
    query_words: tuple[int, int] = (1, 3)
    # [radix] probability of compacting after the 25 / 50 / 75 % notices: the early ones are
    # ignored, the 75 % one is answered (the urgent warning comes only 2.6K tokens before the
    # limit, less than one search result, so a model that waits for it is usually rolled back).
    p_edit_on_nudge: tuple[float, ...] = (0.0, 0.0, 0.9)
    # [radix] a mild edit (after a notice) frees this fraction of the context; an urgent one (warning,
    # ledger) frees down to this fraction of the budget. The CLM prompt says "batch your edits, edit
    # rarely" (docs/eval.md §2.1), so edits are few and large.
    mild_free_fraction: float = 0.4
    urgent_target_ratio: float = 0.5
    # [chosen] probability that an urgent warning is ignored for one more task step.
    p_ignore_urgent: float = 0.05
    # [radix] an edit deletes the newest task results first with this probability (results that
    # proved useless; the CLM prompt asks to compact near the end, docs/eval.md §2.1), else the oldest.
    p_edit_recent_first: float = 0.85
    # [radix] the newest task-call groups an edit always keeps (0: the latest result may go too).
    keep_recent_groups: int = 0
    # [chosen] a mild edit is a replace (a quoted passage of an old tool output shortened to a
    # summary) with this probability; `replace` needs the old text quoted, so large cuts are deletes.
    p_replace: float = 0.25
    replace_quote_words: tuple[int, int] = (15, 40)
    # [chosen] the submitted answer (Explanation with citations, Exact Answer, Confidence).
    answer_words: tuple[int, int] = (25, 60)


# ---- reading the context (pure)


@dataclass(frozen=True)
class Group:
    """An assistant turn with one tool call and its results: messages ``[start, end)``."""

    start: int
    end: int
    name: str
    chars: int


@dataclass(frozen=True)
class ContextView:
    protect: int                      # turns an edit may not touch (system, task, ledger)
    groups: tuple[Group, ...]
    note: str                         # the last message when it is a harness note, else ""
    ledger: str                       # the rollback ledger's text, "" before any rollback
    chars: int                        # all message text (clm.message_chars)
    visible_docids: tuple[str, ...]   # docids in the search results still in the context, in order
    question: str


def _group_end(messages: list[dict], start: int) -> int:
    end = start + 1
    while end < len(messages) and messages[end]["role"] == "tool":
        end += 1
    return end


def _docids_in(text: str) -> list[str]:
    try:
        rows = json.loads(text)
    except ValueError:
        return []
    return [str(r["docid"]) for r in rows if isinstance(r, dict) and "docid" in r] if isinstance(rows, list) else []


def read_context(messages: list[dict]) -> ContextView:
    third = str(messages[2].get("content") or "") if len(messages) > 2 else ""
    ledger = third if third.startswith(LEDGER_MARK) else ""
    protect = 3 if ledger else 2
    groups, docids = [], []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or not m.get("tool_calls"):
            continue
        end = _group_end(messages, i)
        name = m["tool_calls"][0]["function"]["name"]
        groups.append(Group(i, end, name, clm.message_chars(messages[i:end])))
        if name == SEARCH:
            docids += [d for t in messages[i + 1:end] for d in _docids_in(t.get("content") or "")]
    last = messages[-1]
    note = last["content"] if last["role"] == "user" and len(messages) > protect else ""
    return ContextView(protect, tuple(groups), note, ledger, clm.message_chars(messages),
                       tuple(dict.fromkeys(docids)), messages[1]["content"])


def note_ratio(note: str) -> float | None:
    """The budget ratio a ``[CONTEXT NOTICE]`` names ("passed 50% of its budget" -> 0.5)."""
    found = re.search(r"(\d+)%", note.split(NUDGE_MARK, 1)[1]) if NUDGE_MARK in note else None
    return int(found.group(1)) / 100 if found else None


def question_terms(question: str, language: str = "english") -> list[str]:
    """The invented topic terms of a question: its words outside the corpus vocabulary."""
    common = corpus.known_words(language) | {"question", "explanation", "answer", "confidence"}
    words = re.findall(r"[a-z]+", question.split("Question:", 1)[-1].split("\n\n", 1)[0].lower())
    return list(dict.fromkeys(w for w in words if w not in common and len(w) > 4))


# ---- deciding (deterministic: the context, the question's memory and its seeded rng)


@dataclass
class Memory:
    """What the stand-in remembers about one question besides its context."""

    rng: random.Random
    planned_steps: int
    steps_done: int = 0
    requested: set = field(default_factory=set)
    ledger: str = ""


@dataclass(frozen=True)
class Action:
    kind: str         # "search", "get_document", "edit", "submit"
    name: str         # the tool called
    arguments: dict


def decide(messages: list[dict], view: ContextView, memory: Memory, params: StandinParams,
           budget_chars: float) -> Action:
    """The next action: answer a finalize notice, compact on warnings/rollbacks and (sometimes) on
    nudges, submit after the planned steps, else search or read."""
    rng = memory.rng
    if FINALIZE_MARK in view.note:
        return submit_action(view, rng, params)
    rolled_back = bool(view.ledger) and view.ledger != memory.ledger
    memory.ledger = view.ledger
    edit = None
    if rolled_back or URGENT_MARK in view.note:
        if rolled_back or rng.random() >= params.p_ignore_urgent:
            edit = plan_edit(messages, view, rng, params, view.chars - params.urgent_target_ratio * budget_chars, False)
    elif (ratio := note_ratio(view.note)) is not None:
        level = sum(1 for r in (0.25, 0.5, 0.75) if ratio >= r) - 1
        if rng.random() < params.p_edit_on_nudge[max(0, min(level, len(params.p_edit_on_nudge) - 1))]:
            edit = plan_edit(messages, view, rng, params, params.mild_free_fraction * view.chars, True)
    if edit is not None:
        return edit
    if memory.steps_done >= memory.planned_steps:
        return submit_action(view, rng, params)
    memory.steps_done += 1
    return task_action(view, memory, params)


def task_action(view: ContextView, memory: Memory, params: StandinParams) -> Action:
    rng = memory.rng
    unread = [d for d in view.visible_docids if d not in memory.requested]
    if unread and rng.random() < params.p_get_document:
        docid = rng.choice(unread)
        memory.requested.add(docid)
        return Action(GET_DOCUMENT, GET_DOCUMENT, {"docid": docid})
    terms = question_terms(view.question, params.language) or ["value"]
    words = corpus.common_words(params.language)
    query = rng.sample(terms, min(len(terms), rng.randint(*params.query_terms)))
    query += rng.sample(words, rng.randint(*params.query_words))
    return Action(SEARCH, SEARCH, {"query": " ".join(query)})


def submit_action(view: ContextView, rng: random.Random, params: StandinParams) -> Action:
    cited = ", ".join(view.visible_docids[:2]) or "0"
    terms = question_terms(view.question, params.language) or ["value"]
    explanation = corpus.prose(rng, rng.randint(*params.answer_words), language=params.language)
    answer = (f"Explanation: {explanation} [{cited}]\nExact Answer: {rng.choice(terms)}\n"
              f"Confidence: {rng.randint(40, 90)}%")
    return Action(SUBMIT, SUBMIT, {"answer": answer})


def deletable_groups(view: ContextView, params: StandinParams) -> list[Group]:
    """Task-call groups an edit may remove: outside the protected turns, not the newest ones."""
    task = [g for g in view.groups if g.name in TASK_TOOLS and g.start >= view.protect]
    return task[:len(task) - params.keep_recent_groups] if params.keep_recent_groups else task


def plan_edit(messages: list[dict], view: ContextView, rng: random.Random, params: StandinParams,
              free_chars: float, mild: bool) -> Action | None:
    """Delete whole task-call groups until ``free_chars`` are freed (a mild edit may instead shorten a
    passage of one old tool output); None when there is nothing the model would delete."""
    candidates = deletable_groups(view, params)
    if not candidates:
        return None
    if mild and rng.random() < params.p_replace:
        replace = replace_action(messages, candidates, rng, params)
        if replace is not None:
            return replace
    order = list(reversed(candidates)) if rng.random() < params.p_edit_recent_first else candidates
    turns, freed = [], 0
    for group in order:
        turns += range(group.start, group.end)
        freed += group.chars
        if freed >= free_chars:
            break
    return Action("edit", CONTEXT, {"action": "delete", "turns": sorted(turns)})


def replace_action(messages: list[dict], candidates: list[Group], rng: random.Random,
                   params: StandinParams) -> Action | None:
    """Shorten a quoted passage of the longest old tool output to a one-line summary (the quote
    must occur once in the mirror, as ``clm.apply_edit`` requires)."""
    index = max((i for g in candidates for i in range(g.start + 1, g.end)),
                key=lambda i: len(messages[i].get("content") or ""), default=None)
    if index is None:
        return None
    words = (messages[index].get("content") or "").split(" ")
    n = rng.randint(*params.replace_quote_words)
    mirror = clm.render_mirror(messages)
    for _ in range(4):
        if len(words) <= n + 2:
            return None
        start = rng.randint(1, len(words) - n - 1)
        old = " ".join(words[start:start + n])
        if "\n" not in old and mirror.count(old) == 1:
            new = f"[summary: {corpus.prose(rng, rng.randint(5, 12), language=params.language).rstrip('.')}]"
            return Action("edit", CONTEXT, {"action": "replace", "old": old, "new": new})
    return None


def reasoning_text(rng: random.Random, params: StandinParams, tokens_per_word: float) -> str:
    """A reasoning block of a lognormal number of tokens (median ``reasoning_tokens_median``)."""
    tokens = min(params.reasoning_tokens_max,
                 rng.lognormvariate(math.log(params.reasoning_tokens_median), params.reasoning_sigma))
    return corpus.prose(rng, max(3, round(tokens / tokens_per_word)), language=params.language)


# ---- the client


def first_difference(old: list[dict], new: list[dict]) -> int | None:
    """The first message index where ``new`` stops extending ``old`` (None: pure growth)."""
    for i, message in enumerate(old):
        if i >= len(new) or new[i] != message:
            return i
    return None


class StandIn:
    """The scripted model as a ``ChatClient``; it records one ``TraceCall`` per call in ``calls``:
    conversation = the question id, turn = the agent's call index, ``cache_salt`` None (CLM sends
    none: one namespace), ``kind`` = the action ("search", "get_document", "edit", "submit") and
    ``meta``: ``nudged`` (the prompt ends with a budget notice or warning), ``rolled_back`` (the
    agent rolled back since this question's previous call) and ``edited_from_turn`` (the first
    message that differs from the previous call's context, None when the context only grew;
    reasoning stripping is not a message change)."""

    def __init__(self, renderer: Renderer, params: StandinParams, seed: int, budget_tokens: int,
                 with_messages: bool = False):
        self.renderer, self.params, self.seed = renderer, params, seed
        self.budget_tokens = budget_tokens
        self.with_messages = with_messages
        self.calls: list = []
        self.memory: dict[str, Memory] = {}
        self.previous: dict[str, tuple[list[dict], str]] = {}  # qid -> (messages, ledger) of its last call
        self.tokens_per_word = _tokens_per_word(renderer, params.language)

    def _memory(self, qid: str) -> Memory:
        if qid not in self.memory:
            rng = corpus.rng_for(self.seed, f"standin:{qid}")
            self.memory[qid] = Memory(rng, rng.randint(*self.params.task_steps))
        return self.memory[qid]

    def chat(self, messages: list[dict], *, tools: list | None = None, rid: str = "", qid: str = "", turn: int = 0,
             kind: str = "agent") -> ChatResult:
        memory = self._memory(qid)
        prompt_text, prompt_ids = self.renderer.prompt(messages, tools)
        view = read_context(messages)
        budget_chars = self.budget_tokens * view.chars / max(1, len(prompt_ids))
        action = decide(messages, view, memory, self.params, budget_chars)
        reasoning = reasoning_text(memory.rng, self.params, self.tokens_per_word)
        call = ToolCall(name=action.name, arguments=action.arguments)
        reply = {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [call.to_message()]}
        completion_ids = self.renderer.completion(prompt_text, messages, tools, reply)
        self._record(qid, turn, messages, view, action, prompt_ids, completion_ids)
        return ChatResult(content="", reasoning=reasoning, tool_calls=[call], finish_reason="tool_calls",
                          usage={"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                                 "total_tokens": len(prompt_ids) + len(completion_ids)},
                          protocol="native")

    def _record(self, qid, turn, messages, view, action, prompt_ids, completion_ids) -> None:
        before, ledger = self.previous.get(qid, ([], ""))
        meta = {"nudged": NUDGE_MARK in view.note or URGENT_MARK in view.note,
                "rolled_back": view.ledger != ledger,
                "edited_from_turn": first_difference(before, messages)}
        snapshot = json.loads(json.dumps(messages))
        self.previous[qid] = (snapshot, view.ledger)
        self.calls.append(TraceCall(
            conversation=qid, turn=turn, prompt_ids=prompt_ids, completion_ids=completion_ids, cache_salt=None,
            messages=snapshot if self.with_messages else None,
            chat_template_kwargs=self.renderer.kwargs if self.with_messages else None,
            kind=action.kind, meta=meta))


def _tokens_per_word(renderer: Renderer, language: str = "english") -> float:
    """Tokens per word of the corpus language (to size reasoning blocks in tokens)."""
    sample = corpus.prose(random.Random(0), 2000, language=language)
    return len(renderer.encode(sample)) / 2000
