"""Conversation affinity behind the router, as plain functions over rids and events.

The rule the clients follow (``eval.replay --router``, ``eval.cluster bench``): every call of a
conversation carries the HTTP header ``x-smg-routing-key`` = its rid without the last
``.<turn>`` part (``<run>.<conversation>``), and the router runs its ``manual`` policy, which
pins each key to one worker for as long as the key is in use (``--max-idle-secs``, 4 h by
default). The key is a pure function of the rid, so a client that resumes a run, or a second
client process, sends the same key for the same conversation.

What the functions measure: which worker served each rid (from the per-worker events files),
and the conversations whose calls were served by more than one worker ("split"), which is what
breaks SCR's sessions (a session lives on the worker that saw the previous turn) and makes the
exact cache's reuse unpredictable from the trace alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

ROUTING_HEADER = "x-smg-routing-key"  # read by sglang-router's manual policy
HEALTH_CHECK_PREFIX = "HEALTH_CHECK"  # SGLang's /health generations (rid prefix); never a client call


def routing_key(rid: str) -> str:
    """``<run>.<conversation>`` of a ``<run>.<conversation>.<turn>`` rid (a rid without a '.' is its own key)."""
    head, sep, _ = rid.rpartition(".")
    return head if sep else rid


def affinity_headers(payload: dict) -> dict[str, str]:
    """The routing header of one ``/generate`` body (none when it has no rid)."""
    rid = payload.get("rid") if isinstance(payload, dict) else None
    return {ROUTING_HEADER: routing_key(rid)} if isinstance(rid, str) and rid else {}


def served_by(events_by_worker: Mapping[str, Iterable[dict]]) -> dict[str, str]:
    """rid -> worker name, over the client calls in each worker's events (health checks and
    start-up records left out). A rid served by two workers raises: a call is served once."""
    where: dict[str, str] = {}
    for worker, events in events_by_worker.items():
        for event in events:
            rid = event.get("rid")
            if not isinstance(rid, str) or rid.startswith(HEALTH_CHECK_PREFIX):
                continue
            if rid in where and where[rid] != worker:
                raise ValueError(f"rid {rid} was served by {where[rid]} and by {worker}")
            where[rid] = worker
    return where


def workers_per_conversation(where: Mapping[str, str]) -> dict[str, list[str]]:
    """Conversation key -> the workers that served its calls (sorted, each once)."""
    seen: dict[str, set[str]] = defaultdict(set)
    for rid, worker in where.items():
        seen[routing_key(rid)].add(worker)
    return {key: sorted(workers) for key, workers in seen.items()}


def split_conversations(where: Mapping[str, str]) -> list[str]:
    """The conversations served by more than one worker (sorted)."""
    return sorted(key for key, workers in workers_per_conversation(where).items() if len(workers) > 1)


def load(where: Mapping[str, str], workers: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per worker: calls and conversations it served (zero for a worker that served none)."""
    result = {worker: {"calls": 0, "conversations": 0} for worker in workers}
    for worker in where.values():
        result.setdefault(worker, {"calls": 0, "conversations": 0})["calls"] += 1
    for key, served in workers_per_conversation(where).items():
        for worker in served:
            result[worker]["conversations"] += 1
    return result
