"""exact_cache/replay.py: the replay's LRU model of SGLang's state pool (``max_snapshots``) counts
a resume as a use of the state it resumed from (the model's own statement: "the resumed and the
new states are touched").

Why: ``eval/bench_cuts.py`` prices a state budget with this model; a model that only counts new
snapshots as uses evicts the state a conversation keeps resuming from first, and reports budgets
as costlier than they are (the existing budget test repeats the newest prompt, where a missing
touch changes nothing). Grid rule, B = 8, R large: a 20-token prompt keeps one state, at 16."""

from __future__ import annotations

from exact_cache.replay import ReplayTree

B = 8
A, C, D = ([k] * 20 for k in (0, 1, 2))


def test_a_resumed_state_is_the_most_recently_used():
    tree = ReplayTree(B, 1000, max_snapshots=2)
    assert [tree.serve(p)[0] for p in (A, C, A)] == [0, 0, 16]  # A's repeat resumes: A's state is now the newest
    assert tree.serve(D)[0] == 0  # a third state: the least recently used goes, C's (not A's)
    assert tree.evicted == 1
    assert tuple(A[:16]) in tree.snapshots and tuple(C[:16]) not in tree.snapshots
    assert [tree.serve(p)[0] for p in (A, C)] == [16, 0]


def test_without_a_budget_nothing_is_evicted():
    tree = ReplayTree(B, 1000)
    assert [tree.serve(p)[0] for p in (A, C, A, D, A, C)] == [0, 0, 16, 0, 16, 16]
    assert tree.evicted == 0 and len(tree.snapshots) == 3
