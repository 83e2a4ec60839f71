"""The BrowseComp-Plus agent: a plain search agent, or a context-editing agent in the CLM style.

``mode: plain`` is the BCP harness's loop (``eval_spec.md`` §1.5-§1.6): the question in the
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
user query" and earlier reasoning is stripped).

Each question gives a BCP run-file record (§1.7) with extra fields (the counters of CLM's
``usage.json``, tokens, rids).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from eval.bcp import clm
from eval.bcp.client import ChatClient, ChatResult, ClientError, ContextOverflow
from eval.bcp.config import AgentConfig

QUERY_PROMPT = """You are a deep-research agent. Answer the question below using the search tools step by step: \
search, read what you find{get_document}, and search again until you are sure.

Question: {question}

When you are done, reply in exactly this format:
Explanation: {{your reasoning, citing the supporting docids in square brackets, e.g. [20] or [3, 17]}}
Exact Answer: {{your short final answer}}
Confidence: {{your confidence in the answer, 0-100%}}"""

CLM_SYSTEM = """You are a research agent with an editable context. The conversation you see is your \
live context; the `context` tool shows it as text (one [[CTX_TURN i role=...]] block per turn) and \
edits it: delete turns you no longer need, or replace text in a turn with a shorter summary. \
Turns 0 and 1 (this prompt and the task) cannot change.

Editing has a cost: after an edit, everything from the first changed turn to the end is read again \
by the server. Batch your edits, edit rarely, and prefer to compact old material near the end of \
the context. Your context budget is {budget} tokens; you will be warned as it fills up, and turns \
are rolled back if you go over it. A turn that only edits the context is free.

{finish}"""

FINISH_SUBMIT = "When you have the answer, call `submit` with the whole answer text (Explanation, Exact Answer, Confidence)."
FINISH_TEXT = "When you have the answer, reply with it without calling a tool."

CONTEXT_TOOL = {
    "type": "function",
    "function": {
        "name": "context",
        "description": "View or edit your live context. action=view shows it; action=delete removes the "
                       "listed turns; action=replace replaces the text `old` (which must occur exactly once) "
                       "by `new`.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["view", "delete", "replace"]},
                "turns": {"type": "array", "items": {"type": "integer"}, "description": "turns to delete"},
                "old": {"type": "string"},
                "new": {"type": "string"},
            },
            "required": ["action"],
        },
    },
}

SUBMIT_TOOL = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit your final answer (Explanation, Exact Answer, Confidence) and end the task.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    },
}

NO_TOOL_CALL = "(No tool call in your last turn. Continue with a tool call, or call `submit` with your final answer.)"
NUDGE = ("[CONTEXT NOTICE] Your context has passed {ratio:.0%} of its budget: {tokens} of {budget} tokens. Consider "
         "compacting it with the `context` tool: delete or summarise what you no longer need.")
URGENT = ("[CONTEXT WARNING] Your context is at {tokens} tokens, close to the limit of {limit}. Compact it "
          "now with the `context` tool, or turns will be rolled back.")
FINALIZE = "[SYSTEM NOTICE] Only {n} turn(s) remain. Give your final answer now."
LEDGER = ("[ROLLBACK LEDGER] Your context went over its limit of {limit} tokens {count} time(s); {turns} recent "
          "turn(s) were removed in all. Compact your context with the `context` tool before continuing.")


class ToolBoxLike(Protocol):
    retrieved_docids: Any

    def schemas(self) -> list[dict]: ...

    def call(self, name: str, arguments: dict) -> str: ...


def truncate_observation(text: str, max_chars: int, keep: int = 5000) -> str:
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    return (f"{text[:keep]}\n... [output too long: {len(text)} characters; the middle "
            f"{len(text) - 2 * keep} are cut] ...\n{text[-keep:]}")


@dataclass
class QuestionRun:
    """What one question produced: the BCP run-file record and the final messages."""

    record: dict
    messages: list[dict] = field(default_factory=list)


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
        cfg = self.config
        toolbox = self.make_toolbox()
        tools = self.tool_schemas(toolbox)
        messages = self.initial_messages(question)
        protect = len(messages)
        budget = clm.Budget(cfg.context_budget_tokens, cfg.strict_target, tuple(cfg.nudge_ratios),
                            cfg.persistent_nudge_ratio, fixed_overhead_chars=len(json.dumps(tools)))
        started = self.clock()
        items: list[dict] = []
        counts: Counter = Counter()
        stats = Counter()
        tokens = Counter()
        rids: list[str] = []
        final_text, status, error = None, None, None
        ledger_count = ledger_turns = ignored_rollbacks = 0
        steps = 0
        pending_notes: list[str] = []
        last_reply: ChatResult | None = None

        for _ in range(cfg.max_total_iters):
            if steps >= cfg.max_steps:
                status = "max_steps"
                break
            if stats["lm_calls"] >= cfg.call_cap:
                status, stats["hit_lm_call_cap"] = "lm_call_cap", 1
                break
            if cfg.mode == "clm":
                if stats["lm_calls"]:  # budget notices about the context as it now stands
                    estimate = budget.estimate(messages)
                    for kind, ratio in budget.nudges(estimate):
                        stats["nudges"] += 1
                        pending_notes.append(NUDGE.format(ratio=ratio, tokens=estimate, budget=cfg.context_budget_tokens)
                                             if kind == "ratio" else URGENT.format(tokens=estimate, limit=cfg.strict_target))
                remaining = cfg.max_steps - steps
                if remaining <= cfg.finalize_nudge_turns:
                    pending_notes.append(FINALIZE.format(n=remaining))
                if pending_notes:
                    messages.append({"role": "user", "content": "\n\n".join(pending_notes)})
                    pending_notes = []
                # Rollback before a prompt that would not fit.
                estimate = budget.estimate(messages)
                if estimate > cfg.strict_target:
                    if stats["retries_on_limit"] >= cfg.max_num_retry_on_limit:
                        status, stats["budget_finalized"] = "budget_exhausted", 1
                        break
                    margin = cfg.retry_edit_margin_tokens * (2 if ignored_rollbacks >= 3 else 1)
                    # Never aim below half the limit (a margin larger than the limit would drop everything).
                    target = max(cfg.strict_target - margin, cfg.strict_target // 2)
                    messages, dropped = clm.rollback(messages, budget, target, protect)
                    messages = clm.drop_orphan_tool_results(messages)
                    stats["retries_on_limit"] += 1
                    stats["turns_rolled_back"] += dropped
                    ignored_rollbacks += 1
                    ledger_count += 1
                    ledger_turns += dropped
                    note = {"role": "user", "content": LEDGER.format(limit=cfg.strict_target, count=ledger_count,
                                                                     turns=ledger_turns)}
                    if protect == 2:
                        messages.insert(2, note)
                        protect = 3
                    else:
                        messages[2] = note
                    continue
            turn = stats["lm_calls"]
            rid = f"{rid_prefix}.{turn:04d}"
            rids.append(rid)
            stats["lm_calls"] += 1
            try:
                reply = self.client.chat(messages, tools=tools, rid=rid, qid=qid, turn=turn)
            except ContextOverflow as exc:
                if cfg.mode == "clm" and stats["retries_on_limit"] < cfg.max_num_retry_on_limit:
                    # The server counts more than the estimate: learn it and roll back on the next pass.
                    budget.tok_ratio = min(3.0, budget.tok_ratio * 1.25)
                    continue
                status, error = "context_overflow", str(exc)[:2000]
                break
            except ClientError as exc:
                status, error = "error", str(exc)[:2000]
                break
            last_reply = reply
            tokens["prompt"] += reply.prompt_tokens
            tokens["completion"] += reply.completion_tokens
            tokens["cached"] += reply.cached_tokens or 0
            if reply.protocol:
                stats[f"tool_protocol_{reply.protocol}"] += 1
            budget.calibrate(messages, reply.prompt_tokens)
            if reply.reasoning:
                items.append({"type": "reasoning", "tool_name": None, "arguments": None, "output": reply.reasoning})
            messages.append(reply.assistant_message())

            calls = reply.tool_calls[:1] if cfg.mode == "clm" else reply.tool_calls  # CLM keeps the first call only
            if len(reply.tool_calls) > len(calls):
                messages[-1]["tool_calls"] = messages[-1]["tool_calls"][:1]
            if not calls:
                if cfg.finish_policy == "text":
                    final_text, status = reply.content, "completed"
                    break
                steps += 1
                pending_notes.append(NO_TOOL_CALL)
                continue

            free = True
            for call in calls:
                if call.name == "submit" and cfg.mode == "clm" and cfg.finish_policy == "submit":
                    final_text = str(call.arguments.get("answer", "")) or reply.content
                    status = "completed"
                    break
                counts[call.name or "(unparsable)"] += 1
                if call.name == "context" and cfg.mode == "clm":
                    output, accepted = self._context_call(messages, call.arguments, budget, protect, stats)
                    if accepted:
                        ignored_rollbacks = 0
                        messages = clm.drop_orphan_tool_results(messages)
                    else:
                        free = False
                else:
                    free = False
                    output = self._tool_call(toolbox, call)
                output = truncate_observation(output, cfg.observation_max_chars)
                items.append({"type": "tool_call", "tool_name": call.name,
                              "arguments": json.dumps(call.arguments, ensure_ascii=False), "output": output})
                messages.append({"role": "tool", "content": output, **({"tool_call_id": call.id} if call.id else {})})
            if status == "completed":
                break
            if free:
                stats["free_ctx_turns"] += 1
            else:
                steps += 1
        else:
            status = status or "max_iterations"

        if final_text is None:
            final_text = last_reply.content if last_reply is not None else ""
        items.append({"type": "output_text", "tool_name": None, "arguments": None, "output": final_text})
        record = {
            "query_id": qid,
            "tool_call_counts": dict(counts),
            "status": status or "incomplete",
            "retrieved_docids": [str(d) for d in getattr(toolbox, "retrieved_docids", []) or []],
            "result": items,
            "metadata": {"model": self.model_name, "mode": cfg.mode},
            "rids": rids,
            "steps": steps,
            "tokens": {"prompt": tokens["prompt"], "completion": tokens["completion"], "cached": tokens["cached"]},
            "agent_stats": {k: int(v) for k, v in sorted(stats.items())},
            "error": error,
            "wall_s": round(self.clock() - started, 3),
        }
        return QuestionRun(record=record, messages=messages)

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
