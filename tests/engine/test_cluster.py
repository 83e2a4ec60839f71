"""``eval.cluster``: the router (sglang-router, manual policy) in front of two patched workers, with
a short multi-conversation trace replayed through it, for ``exact`` and for ``scr``.

Four conversations of three turns share a system prompt; the third turn of each deletes a part of
its first user message (an edit in the middle) and appends. Forced ids go through the router in
the field it keeps (``eval/cluster/router_client.py``), and the clients send the affinity header
(``x-smg-routing-key`` = the rid without its turn), so every conversation must stay on one worker.
The router's own counter of its manual policy's choices must read one new key per conversation
and a hit on the pinned worker for every other call (``eval.cluster.affinity.manual_branches``):
that is affinity seen from the router, whichever worker each key got. How the keys split between
the workers is not asserted: ``min_group`` gives a new key to the worker with the fewest keys *in
flight*, so the split depends on timing (one CI run put all four conversations on one worker).
Every call is served once (the per-worker events are merged, a rid in two files fails), the
accounting identities and the client join hold on the merged events, and:

* exact: every call's reuse equals ``exact_cache.replay`` over the calls *its* worker admitted,
  in that worker's queue order (the exact cache stays predictable per worker);
* scr: every edited turn relocates rows (its session is on the worker that saw the previous
  turn; on the wrong worker it would find none and read everything).

One cluster per policy (two workers started side by side, then the router): under two minutes each.
"""

from __future__ import annotations

import csv
import random

import pytest

from eval.cluster.affinity import affinity_branches
from eval.cluster.bench import run_cluster
from eval.traces.format import TraceCall

pytestmark = pytest.mark.engine

CONVERSATIONS, SYSTEM, USER, TOOL, COMPLETION = 4, 1000, 600, 500, 12


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 400) for _ in range(n)]


def conversation(index: int, system: list[int]) -> list[TraceCall]:
    rng = random.Random(1000 + index)
    user, tool1, tool2 = _ids(rng, USER), _ids(rng, TOOL), _ids(rng, TOOL)
    out = [_ids(rng, COMPLETION) for _ in range(3)]
    turn0 = system + user
    turn1 = turn0 + out[0] + tool1
    edited = system + user[:100] + user[400:] + out[0] + tool1 + out[1] + tool2  # user[100:400] deleted
    return [TraceCall(f"q{index}", turn, prompt, out[turn]) for turn, prompt in enumerate((turn0, turn1, edited))]


@pytest.fixture(scope="module")
def calls() -> list[TraceCall]:
    system = _ids(random.Random(7), SYSTEM)
    per = [conversation(i, system) for i in range(CONVERSATIONS)]
    return [call for turn in range(3) for calls_of_one in per for call in calls_of_one if call.turn == turn]


def _rows(out) -> list[dict]:
    with open(out / "report" / "requests.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("policy", ["exact", "scr"])
def test_router_keeps_each_conversation_on_one_worker(policy, calls, tiny_model_dir, tmp_path):
    result = run_cluster(policy, tiny_model_dir, calls, tmp_path, workers=2, concurrency=2, run="cl",
                         router_policy="manual")
    assert result["fatal_lines"] == {}, result["fatal_lines"]
    assert result["checks_failed"] == [], result["checks_failed"][:5]
    assert result["split_conversations"] == []
    assert result["router_branches"] == affinity_branches(CONVERSATIONS, len(calls)), result["load"]
    assert sum(v["calls"] for v in result["load"].values()) == len(calls)
    rows = {row["rid"]: row for row in _rows(tmp_path)}
    assert len(rows) == len(calls)
    edited = [rows[call.rid("cl")] for call in calls if call.turn == 2]
    if policy == "exact":
        prediction = result["exact_prediction"]
        assert prediction["calls"] == len(calls)
        assert prediction["equal"] == len(calls), prediction["per_worker"]
        assert all(int(row["moved"]) == 0 for row in rows.values())
        assert sum(int(row["prefix_reused"]) for row in edited) > 0  # the shared prefix before the edit
    else:
        assert all(int(row["moved"]) > 0 for row in edited), [(r["rid"], r["moved"]) for r in edited]
