"""One question's state while the BCP agent (``eval/bcp/agent.py``) works on it, and what the
question leaves behind: the BCP run-file record (``docs/eval.md`` §1.7) and the final messages."""
# Spec: docs/eval.md

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from eval.bcp import clm
from eval.bcp.client import ChatResult


@dataclass
class QuestionRun:
    """What one question produced: the BCP run-file record and the final messages."""

    record: dict
    messages: list[dict] = field(default_factory=list)


@dataclass
class QuestionState:
    """The state of one question while the agent works on it (one object instead of the loop's
    twenty locals, so that each rule of the loop can be a method of its own)."""

    qid: str
    rid_prefix: str
    toolbox: Any  # agent.ToolBoxLike
    tools: list[dict]
    messages: list[dict]
    budget: clm.Budget
    started: float
    protect: int = 0  # messages at the head that edits and rollbacks never touch
    items: list[dict] = field(default_factory=list)  # the run file's ``result`` list
    counts: Counter = field(default_factory=Counter)  # tool calls by name
    stats: Counter = field(default_factory=Counter)  # the agent counters (CLM's usage.json)
    tokens: Counter = field(default_factory=Counter)
    rids: list[str] = field(default_factory=list)
    pending_notes: list[str] = field(default_factory=list)  # notices for the next user turn
    final_text: str | None = None
    status: str | None = None
    error: str | None = None
    steps: int = 0
    ledger_count: int = 0
    ledger_turns: int = 0
    ignored_rollbacks: int = 0  # rollbacks since the model last made an accepted edit
    last_reply: ChatResult | None = None

    def end(self, status: str, error: str | None = None) -> bool:
        """Ends the question with ``status``; returns False, the loop's "stop"."""
        self.status, self.error = status, error
        return False

    def record(self, model_name: str, mode: str, now: float) -> dict:
        """The BCP run-file record of the question (§1.7) with the agent's extras; the answer is the
        submitted text, else the last reply's."""
        final_text = self.final_text
        if final_text is None:
            final_text = self.last_reply.content if self.last_reply is not None else ""
        self.items.append({"type": "output_text", "tool_name": None, "arguments": None, "output": final_text})
        return {
            "query_id": self.qid,
            "tool_call_counts": dict(self.counts),
            "status": self.status or "incomplete",
            "retrieved_docids": [str(d) for d in getattr(self.toolbox, "retrieved_docids", []) or []],
            "result": self.items,
            "metadata": {"model": model_name, "mode": mode},
            "rids": self.rids,
            "steps": self.steps,
            "tokens": {"prompt": self.tokens["prompt"], "completion": self.tokens["completion"], "cached": self.tokens["cached"]},
            "agent_stats": {k: int(v) for k, v in sorted(self.stats.items())},
            "error": self.error,
            "wall_s": round(now - self.started, 3),
        }
