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

import re
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


# ---------------------------------------------------------------- the router's own count of its choices
#
# sglang-router's Prometheus endpoint (``--prometheus-port``) counts every choice of its manual
# policy in one counter, a line per branch, as
#
#     smg_manual_policy_branch_total{branch="<branch>"[,<other labels>]} <count>
#
# with <branch> one of ``vacant`` (a key seen for the first time, given a new worker),
# ``occupied_hit`` (a known key sent to the worker it is pinned to), ``occupied_miss`` (a known
# key whose worker is unhealthy, moved), ``no_routing_id`` (no header: a random worker) and
# ``no_healthy_workers``. A healthy run of C conversations and N calls reads C vacant and N - C
# occupied hits and nothing else: that is affinity seen from the router, whatever the split
# between workers (which the ``min_group`` mode decides from the keys *in flight* at that moment,
# so it is not promised).

MANUAL_BRANCH_METRIC = "smg_manual_policy_branch_total"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def manual_branches(metrics_text: str) -> dict[str, int]:
    """Branch -> count from the router's Prometheus text (lines of other metrics, comments and a
    missing counter give an empty map; the same branch on several label sets is summed; a branch
    counted 0 is left out)."""
    counts: dict[str, int] = defaultdict(int)
    for line in metrics_text.splitlines():
        if not line.startswith(MANUAL_BRANCH_METRIC + "{"):
            continue
        labels, _, value = line[len(MANUAL_BRANCH_METRIC) + 1:].rpartition("}")
        branch = dict(_LABEL.findall(labels)).get("branch")
        if branch is not None:
            counts[branch] += int(float(value.split()[0]))
    return {branch: n for branch, n in counts.items() if n}


def affinity_branches(conversations: int, calls: int) -> dict[str, int]:
    """What ``manual_branches`` reads after ``calls`` calls of ``conversations`` conversations, each
    with its key, all workers healthy: one new key per conversation, every other call a hit
    (a branch of 0 left out, as there)."""
    expected = {"vacant": conversations, "occupied_hit": calls - conversations}
    return {branch: n for branch, n in expected.items() if n}
