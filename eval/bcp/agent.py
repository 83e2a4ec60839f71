"""The BrowseComp-Plus agent: a plain search agent, or a context-editing agent in the CLM style.

``mode: plain`` is the BCP harness's loop (``docs/eval.md`` §1.5-§1.6): the question in the
answer-format prompt, the search tools, one LM call per step; a reply without a tool call is the
final answer.

``mode: clm`` follows the CLM harness's rules (§2.1-§2.2) with the search tools in place of a
sandboxed bash (no sandbox exists here): a system prompt that teaches the cost of edits, the
context mirrored as text the model edits through the ``context`` tool (``view`` / ``delete`` /
``replace``; ``eval/bcp/clm.py``), the edit gate, budget nudges at the configured ratios, an
urgent nudge near the limit, rollback with a pinned ledger when the next prompt would exceed the
limit, "turns remain" notices near the step cap, and the answer through ``submit``
(``finish_policy: submit``) or as a reply without a tool call (``finish_policy: text``). A turn
whose tool calls are all accepted edits is free (it does not count as a step). Every
harness-inserted message is a plain ``user`` turn, as in CLM (so it moves the template's "last
user query" and earlier reasoning is stripped). The texts are in ``eval/bcp/prompts.py``.

Each question gives a BCP run-file record (§1.7) with extra fields (the counters of CLM's
``usage.json``, tokens, rids).
"""
# Spec: docs/eval.md

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Callable, Protocol

from eval.bcp import clm
from eval.bcp.client import ChatClient, ChatResult, ClientError, ContextOverflow, ToolCall
from eval.bcp.config import AgentConfig
# The texts are re-exported: eval/traces/standin.py reads the notices through this module.
from eval.bcp.prompts import (CLM_SYSTEM, CONTEXT_TOOL, FINALIZE, FINISH_SUBMIT, FINISH_TEXT, LEDGER,  # noqa: F401
                              NO_TOOL_CALL, NUDGE, QUERY_PROMPT, SUBMIT_TOOL, URGENT)
from eval.bcp.question import QuestionRun, QuestionState


class ToolBoxLike(Protocol):
    retrieved_docids: Any

    def schemas(self) -> list[dict]: ...

    def call(self, name: str, arguments: dict) -> str: ...


def truncate_observation(text: str, max_chars: int, keep: int = 5000) -> str:
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return (f"{text[:keep]}\n... [output too long: {len(text)} characters; the middle "
            f"{len(text) - 2 * keep} are cut] ...\n{text[-keep:]}")


class Agent:
    def __init__(self, config: AgentConfig, client: ChatClient, make_toolbox: Callable[[], ToolBoxLike], *,
                 model_name: str = "", clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.client = client
        self.make_toolbox = make_toolbox
        self.model_name = model_name
        self.clock = clock

    # ---- prompts and tools

    def initial_messages(self, question: str) -> list[dict]:
        user = QUERY_PROMPT.format(question=question,
                                   get_document=" (get_document gives a whole document)" if self.config.search.get_document else "")
        if self.config.mode == "plain":
            return [{"role": "user", "content": user}]
        finish = FINISH_SUBMIT if self.config.finish_policy == "submit" else FINISH_TEXT
        system = CLM_SYSTEM.format(budget=self.config.context_budget_tokens, finish=finish)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def tool_schemas(self, toolbox: ToolBoxLike) -> list[dict]:
        tools = list(toolbox.schemas())
        if self.config.mode == "clm":
            tools.append(CONTEXT_TOOL)
            if self.config.finish_policy == "submit":
                tools.append(SUBMIT_TOOL)
        return tools

    # ---- one question

    def run(self, qid: str, question: str, rid_prefix: str) -> QuestionRun:
        q = self._start(qid, question, rid_prefix)
        for _ in range(self.config.max_total_iters):
            if not self._step(q):
                break
        else:
            q.status = q.status or "max_iterations"
        record = q.record(self.model_name, self.config.mode, self.clock())
        return QuestionRun(record=record, messages=q.messages)

    def _start(self, qid: str, question: str, rid_prefix: str) -> QuestionState:
        cfg = self.config
        toolbox = self.make_toolbox()
        tools = self.tool_schemas(toolbox)
        messages = self.initial_messages(question)
        budget = clm.Budget(cfg.context_budget_tokens, cfg.strict_target, tuple(cfg.nudge_ratios),
                            cfg.persistent_nudge_ratio, fixed_overhead_chars=len(json.dumps(tools)))
        return QuestionState(qid, rid_prefix, toolbox, tools, messages, budget, self.clock(), protect=len(messages))

    def _step(self, q: QuestionState) -> bool:
        """One pass of the loop: caps, (clm) notices and rollback, one LM call, its tool calls.
        Returns False when the question has ended."""
        if not self._within_caps(q):
            return False
        if self.config.mode == "clm":
            self._post_notices(q)
            fits = self._fit_budget(q)
            if fits is not None:
                return fits
        reply, go_on = self._ask(q)
        if reply is None:
            return go_on
        self._take_reply(q, reply)
        return self._act(q, reply)

    def _within_caps(self, q: QuestionState) -> bool:
        if q.steps >= self.config.max_steps:
            return q.end("max_steps")
        if q.stats["lm_calls"] >= self.config.call_cap:
            q.stats["hit_lm_call_cap"] = 1
            return q.end("lm_call_cap")
        return True

    def _post_notices(self, q: QuestionState) -> None:
        """Budget nudges about the context as it now stands, the "turns remain" notice, and what
        earlier turns left pending, as one user turn."""
        cfg = self.config
        if q.stats["lm_calls"]:
            estimate = q.budget.estimate(q.messages)
            for kind, ratio in q.budget.nudges(estimate):
                q.stats["nudges"] += 1
                q.pending_notes.append(NUDGE.format(ratio=ratio, tokens=estimate, budget=cfg.context_budget_tokens)
                                       if kind == "ratio" else URGENT.format(tokens=estimate, limit=cfg.strict_target))
        remaining = cfg.max_steps - q.steps
        if remaining <= cfg.finalize_nudge_turns:
            q.pending_notes.append(FINALIZE.format(n=remaining))
        if q.pending_notes:
            q.messages.append({"role": "user", "content": "\n\n".join(q.pending_notes)})
            q.pending_notes = []

    def _fit_budget(self, q: QuestionState) -> bool | None:
        """Rollback before a prompt that would not fit: None when it fits, True after a rollback
        (the loop goes round again), False when the rollbacks are used up."""
        cfg = self.config
        if q.budget.estimate(q.messages) <= cfg.strict_target:
            return None
        if q.stats["retries_on_limit"] >= cfg.max_num_retry_on_limit:
            q.stats["budget_finalized"] = 1
            return q.end("budget_exhausted")
        margin = cfg.retry_edit_margin_tokens * (2 if q.ignored_rollbacks >= 3 else 1)
        # Never aim below half the limit (a margin larger than the limit would drop everything).
        target = max(cfg.strict_target - margin, cfg.strict_target // 2)
        messages, dropped = clm.rollback(q.messages, q.budget, target, q.protect)
        q.messages = clm.drop_orphan_tool_results(messages)
        q.stats["retries_on_limit"] += 1
        q.stats["turns_rolled_back"] += dropped
        q.ignored_rollbacks += 1
        q.ledger_count += 1
        q.ledger_turns += dropped
        self._pin_ledger(q)
        return True

    def _pin_ledger(self, q: QuestionState) -> None:
        """The rollback ledger sits right after the task, pinned like it (one, updated in place)."""
        note = {"role": "user", "content": LEDGER.format(limit=self.config.strict_target, count=q.ledger_count,
                                                         turns=q.ledger_turns)}
        if q.protect == 2:
            q.messages.insert(2, note)
            q.protect = 3
        else:
            q.messages[2] = note

    def _ask(self, q: QuestionState) -> tuple[ChatResult | None, bool]:
        """One LM call: (reply, True), or (None, go on?) when the call failed."""
        cfg = self.config
        turn = q.stats["lm_calls"]
        rid = f"{q.rid_prefix}.{turn:04d}"
        q.rids.append(rid)
        q.stats["lm_calls"] += 1
        try:
            return self.client.chat(q.messages, tools=q.tools, rid=rid, qid=q.qid, turn=turn), True
        except ContextOverflow as exc:
            if cfg.mode == "clm" and q.stats["retries_on_limit"] < cfg.max_num_retry_on_limit:
                # The server counts more than the estimate: learn it and roll back on the next pass.
                q.budget.tok_ratio = min(3.0, q.budget.tok_ratio * 1.25)
                return None, True
            return None, q.end("context_overflow", str(exc)[:2000])
        except ClientError as exc:
            return None, q.end("error", str(exc)[:2000])

    def _take_reply(self, q: QuestionState, reply: ChatResult) -> None:
        q.last_reply = reply
        q.tokens["prompt"] += reply.prompt_tokens
        q.tokens["completion"] += reply.completion_tokens
        q.tokens["cached"] += reply.cached_tokens or 0
        if reply.protocol:
            q.stats[f"tool_protocol_{reply.protocol}"] += 1
        q.budget.calibrate(q.messages, reply.prompt_tokens)
        if reply.reasoning:
            q.items.append({"type": "reasoning", "tool_name": None, "arguments": None, "output": reply.reasoning})
        q.messages.append(reply.assistant_message())

    def _act(self, q: QuestionState, reply: ChatResult) -> bool:
        """Runs the reply's tool calls (CLM keeps the first only); False when the question ends."""
        calls = reply.tool_calls[:1] if self.config.mode == "clm" else reply.tool_calls
        if len(reply.tool_calls) > len(calls):
            q.messages[-1]["tool_calls"] = q.messages[-1]["tool_calls"][:1]
        if not calls:
            return self._no_tool_call(q, reply)
        free = True
        for call in calls:
            if call.name == "submit" and self.config.mode == "clm" and self.config.finish_policy == "submit":
                q.final_text = str(call.arguments.get("answer", "")) or reply.content
                return q.end("completed")
            free = self._run_call(q, call) and free
        if free:
            q.stats["free_ctx_turns"] += 1
        else:
            q.steps += 1
        return True

    def _no_tool_call(self, q: QuestionState, reply: ChatResult) -> bool:
        """A reply without a tool call is the answer (``finish_policy: text``), else a step with a reminder."""
        if self.config.finish_policy == "text":
            q.final_text = reply.content
            return q.end("completed")
        q.steps += 1
        q.pending_notes.append(NO_TOOL_CALL)
        return True

    def _run_call(self, q: QuestionState, call: ToolCall) -> bool:
        """Runs one tool call and appends its observation; returns whether it was a free (accepted) edit."""
        q.counts[call.name or "(unparsable)"] += 1
        if call.name == "context" and self.config.mode == "clm":
            output, free = self._context_call(q.messages, call.arguments, q.budget, q.protect, q.stats)
            if free:
                q.ignored_rollbacks = 0
                q.messages = clm.drop_orphan_tool_results(q.messages)
        else:
            output, free = self._tool_call(q.toolbox, call), False
        output = truncate_observation(output, self.config.observation_max_chars)
        q.items.append({"type": "tool_call", "tool_name": call.name,
                        "arguments": json.dumps(call.arguments, ensure_ascii=False), "output": output})
        q.messages.append({"role": "tool", "content": output, **({"tool_call_id": call.id} if call.id else {})})
        return free

    def _tool_call(self, toolbox: ToolBoxLike, call) -> str:
        if call.error:
            return f"Error: your tool call could not be read ({call.error}). Use the documented format."
        try:
            return str(toolbox.call(call.name, call.arguments))
        except Exception as exc:  # a tool error is an observation for the model, not a crash
            return f"Error: {type(exc).__name__}: {exc}"

    def _context_call(self, messages: list[dict], arguments: dict, budget: clm.Budget, protect: int,
                      stats: Counter) -> tuple[str, bool]:
        """Runs the ``context`` tool on ``messages`` in place; returns (observation, accepted edit)."""
        if arguments.get("action") == "view":
            stats["ctx_views"] += 1
            return clm.render_mirror(messages[:-1]), False
        try:
            edited = clm.apply_edit(messages[:-1], arguments, protect)
        except clm.EditError as exc:
            stats["ctx_rejected"] += 1
            return f"Edit not applied: {exc}", False
        old, new = budget.estimate(messages[:-1]), budget.estimate(edited)
        reason = clm.gate(self.config.edit_gate, old, new, self.config.strict_target)
        if reason:
            stats["ctx_rejected"] += 1
            return f"Edit not applied: {reason}", False
        stats["ctx_accepted"] += 1
        messages[:-1] = edited
        return "", True
