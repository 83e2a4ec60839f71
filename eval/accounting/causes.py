"""Where every moved and read token comes from: each call's divergence from its conversation's
previous call, by cause, and the tokens each cache policy moved and read for it.

Causes (``classify``), from the trace alone (its ``meta``, written by the stand-in and the BCP
harness; ``eval/traces/standin.py``), first match wins:

| cause      | the call's prompt ...                                                                   |
|------------|-----------------------------------------------------------------------------------------|
| ``first``  | opens its conversation                                                                  |
| ``append`` | extends the previous call's prompt + completion (the cache can resume at its end)       |
| ``rollback`` | follows a rollback: the harness cut the context back to an earlier point              |
| ``edit``   | follows a change to the message list (the agent's own context edit: a delete or replace) |
| ``template`` | the message list only grew, yet the tokens diverge: the chat template re-rendered an earlier turn (Qwen3.6 strips the reasoning of assistant turns before the last real user query, and every harness notice is a user turn) |
| ``other``  | diverges for no reason the trace records                                                |

The paper attributes SCR's 7.8 moved points to template stripping (5.3) and the agent's edits
(2.5) (``docs/eval.md``); ``attribute`` gives the same split for a run.

``relocation_read_bound`` is an offline bound, not a measurement: the tokens a relocating policy
still read only because the tree holds no recurrent state inside rows it relocated (the linear
layers never ran over them, so no state exists there to resume from). Per call: the stretch from
where the server resumed to the end of the deepest relocated region of the conversation's
earlier calls that the call's prompt still shares, less what it moved.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Sequence

from policy.tokens import common_prefix_len

CAUSES = ("first", "append", "rollback", "edit", "template", "other")


def classify(calls) -> dict[str, str]:
    """``conversation.turn`` -> cause, for every call of a trace (calls in call order)."""
    out: dict[str, str] = {}
    previous: dict[str, object] = {}
    for call in calls:
        key = f"{call.conversation}.{call.turn}"
        before = previous.get(call.conversation)
        previous[call.conversation] = call
        if before is None:
            out[key] = "first"
            continue
        sequence = list(before.prompt_ids) + list(before.completion_ids[:-1])
        meta = call.meta or {}
        if common_prefix_len(sequence, call.prompt_ids) == len(sequence):
            out[key] = "append"
        elif meta.get("rolled_back"):
            out[key] = "rollback"
        elif meta.get("edited_from_turn") is not None:
            out[key] = "edit"
        elif "edited_from_turn" in meta:
            out[key] = "template"
        else:
            out[key] = "other"
    return out


def attribute(rows: Iterable[Mapping], causes: Mapping[str, str], run: str) -> dict[str, dict[str, float]]:
    """Per cause: calls, prompt tokens and the prefix / moved / read tokens of ``rows`` (ingested
    rows of one arm), each also as a share of all prompt tokens of the run."""
    totals: dict[str, dict[str, float]] = {c: defaultdict(float) for c in CAUSES}
    prompt_all = 0
    for row in rows:
        cause = causes.get(row["rid"].removeprefix(f"{run}."), "other")
        bucket = totals[cause]
        bucket["calls"] += 1
        for key in ("prompt_tokens", "prefix_reused", "moved", "read"):
            bucket[key] += row[key]
        prompt_all += row["prompt_tokens"]
    out = {}
    for cause, bucket in totals.items():
        entry = {k: bucket.get(k, 0.0) for k in ("calls", "prompt_tokens", "prefix_reused", "moved", "read")}
        for key in ("prefix_reused", "moved", "read"):
            entry[f"{key}_points"] = 100.0 * entry[key] / prompt_all if prompt_all else 0.0
        out[cause] = entry
    return out


def relocation_read_bound(calls, rows: Mapping[str, Mapping], relocations: Mapping[str, Sequence[tuple[int, int]]],
                          run: str) -> dict[str, float]:
    """The offline bound of the module docstring. ``rows``: rid -> ingested row; ``relocations``:
    rid -> ``[(stop, rows)]`` of its relocated blocks (prompt positions, from the server log)."""
    history: dict[str, list[tuple[list[int], list[tuple[int, int]]]]] = defaultdict(list)
    bound, calls_counted = 0, 0
    for call in calls:
        rid = call.rid(run)
        row = rows.get(rid)
        earlier = history[call.conversation]
        if row is not None and earlier:
            gain = 0
            for sequence, regions in earlier:
                shared = min(common_prefix_len(sequence, call.prompt_ids), len(call.prompt_ids) - 1)
                ends = [stop + n for stop, n in regions if stop + n <= shared]
                if ends:
                    gain = max(gain, max(ends) - row["prefix_reused"] - row["moved"])
            if gain > 0:
                bound += gain
                calls_counted += 1
        sequence = list(call.prompt_ids) + list(call.completion_ids[:-1])
        earlier.append((sequence, list(relocations.get(rid, ()))))
    prompt = sum(len(c.prompt_ids) for c in calls)
    return {"tokens": bound, "calls": calls_counted, "points": 100.0 * bound / prompt if prompt else 0.0}


def session_use(calls, sessions: Mapping[str, str], rows: Mapping[str, Mapping], run: str) -> dict[str, float]:
    """How SCR's content matching grouped the calls into sessions, from ``sessions`` (rid -> sid,
    the server log's ``kv6trace ev=req`` lines; ``eval.accounting.server_log.parse_log``).

    ``merged``: sessions that served calls of more than one conversation (a session identity
    taken from the request, ``session_identity=rid|session_id``, can never merge). ``split``:
    calls (not a conversation's first) whose session differs from their conversation's previous
    call's, i.e. where content matching did not find the conversation's own session; only these
    calls can be served differently under a request-given identity. Their prompt tokens and the
    tokens the arm read for them (``rows``: rid -> ingested row) say how much is at stake.
    """
    conversations_of: dict[str, set[str]] = defaultdict(set)
    last: dict[str, str] = {}
    split = split_prompt = split_read = 0
    for call in calls:
        rid = call.rid(run)
        sid = sessions.get(rid)
        if sid is None:
            continue
        conversations_of[sid].add(call.conversation)
        previous = last.get(call.conversation)
        if previous is not None and previous != sid:
            split += 1
            split_prompt += len(call.prompt_ids)
            split_read += (rows.get(rid) or {}).get("read", 0)
        last[call.conversation] = sid
    prompt = sum(len(c.prompt_ids) for c in calls)
    return {"sessions": len(conversations_of), "conversations": len(last),
            "merged": sum(1 for convs in conversations_of.values() if len(convs) > 1),
            "split_calls": split, "split_prompt_tokens": split_prompt, "split_read_tokens": split_read,
            "split_read_points": 100.0 * split_read / prompt if prompt else 0.0}
