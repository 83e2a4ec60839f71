"""``cut=messages``: pieces that also end right after message ends (``exact_cache.rules.message_cuts``),
resume points limited to the prompt's own cuts, message keep points, and ``replay`` against the
brute-force oracle with the message rule (``tests/reference/exact_oracle.py``).

Prompts here are small: B = 8, the message-end token is 9, other tokens are 0-2.
"""

from __future__ import annotations

import random

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from exact_cache.replay import ReplayTree, replay
from exact_cache.rules import CutRule, KeepKind, keep_points_in, message_cuts, pieces_in, resume_point
from policy.api import Arrival
from policy.tokens import common_prefix_len
from tests.reference.exact_oracle import ExactOracle, expected_reuse

B, M = 8, 9  # piece, message-end token


def prompt(*lengths: int) -> list[int]:
    """Messages of the given lengths, each closed by M (so the next one starts after it)."""
    out: list[int] = []
    for length in lengths:
        out += [1] * (length - 1) + [M]
    return out


@pytest.mark.parametrize(
    "lengths, min_piece, expected",
    [
        pytest.param((5, 5, 5), 1, [5, 10], id="after-every-message-end"),
        pytest.param((5, 5, 5), 6, [8], id="short-messages-merge-then-grid"),  # 5 < 6: no cut at 5; 8 = B; 10 - 8 < 6
        pytest.param((3, 20), 4, [8, 16], id="short-first-message-merges-into-the-next"),  # 3 < 4
        pytest.param((20,), 1, [8, 16], id="one-long-message-grid-only"),
        pytest.param((10, 4, 4), 4, [8, 14], id="an-end-too-soon-after-a-grid-cut-merges"),  # 10 - 8 < 4
        pytest.param((8, 8), 1, [8], id="end-on-the-grid-one-cut"),
        pytest.param((1,), 1, [], id="one-token"),
        pytest.param((4, 1), 1, [4], id="a-one-token-last-message"),
        pytest.param((4,), 1, [], id="never-at-the-prompt-end"),
    ],
)
def test_message_cuts(lengths, min_piece, expected):
    tokens = prompt(*lengths)
    found = message_cuts(tokens, B, M, min_piece)
    assert found == expected
    gaps = [b - a for a, b in zip([0] + found, found + [len(tokens)])]
    assert all(0 < gap <= B for gap in gaps)  # no piece longer than B, none empty


def test_message_cuts_grid_restarts_at_each_message_cut():
    """The B grid is anchored at the last cut, not at 0: 10 (after a message end), then 18, 26."""
    tokens = prompt(10, 20)
    assert message_cuts(tokens, B, M, 1) == [8, 10, 18, 26]


def test_message_cuts_depend_only_on_the_tokens_before_each_cut():
    """Two prompts that share [0, d) cut alike at every position up to d, d included (when both
    are longer than d): what follows d never moves a cut at or before it."""
    rng = random.Random(3)
    checked = 0
    for _ in range(2000):
        tokens = [rng.choice([0, 1, M]) for _ in range(rng.randint(1, 40))]
        min_piece = rng.randint(1, B)
        full = message_cuts(tokens, B, M, min_piece)
        for stop in range(1, len(tokens)):
            other = tokens[:stop] + [rng.choice([0, M]) for _ in range(rng.randint(1, 5))]
            assert [c for c in message_cuts(other, B, M, min_piece) if c <= stop] == [c for c in full if c <= stop]
            checked += stop in full
    assert checked > 1000  # often with a cut exactly at the divergence point


def test_cut_rule_grid_and_validation():
    assert CutRule(B).cuts([0] * 20) == [8, 16]
    assert CutRule(B).message_ends([M] * 20, [8, 16]) == []
    assert CutRule(B, M, 1).message_ends(prompt(5, 5), [5]) == [5]
    with pytest.raises(ValueError, match="min_piece=9"):
        CutRule(B, M, 9)
    with pytest.raises(ValueError, match="piece=0"):
        CutRule(0)


def test_pieces_follow_message_cuts():
    cuts = [5, 10, 18]
    assert pieces_in(cuts, 0, 20) == [(0, 5), (5, 10), (10, 18), (18, 20)]
    assert pieces_in(cuts, 10, 20) == [(10, 18), (18, 20)]
    with pytest.raises(ValueError, match="not at 7"):
        pieces_in(cuts, 7, 20)


def test_resume_point_only_at_this_prompts_cuts():
    """A depth that is not one of the prompt's cuts is no resume point (a cold read would run
    [0, 8), so resuming at 5 would not be exact). The rules never offer one, as cuts depend only on
    the tokens before them; the function states the requirement anyway."""
    assert resume_point(8, [5], cut_list=[5, 10]) == 5
    assert resume_point(8, [5], cut_list=[8, 16]) == 0
    assert resume_point(8, [5]) == 5  # no cut list: the grid rule's callers


@pytest.mark.parametrize(
    "message_keeps, resume, expected",
    [
        pytest.param(0, 0, {5: "message", 10: "message", 16: "prompt_end"}, id="all"),
        pytest.param(1, 0, {10: "message", 16: "prompt_end"}, id="deepest-one"),
        pytest.param(0, 5, {10: "message", 16: "prompt_end"}, id="only-above-resume"),
    ],
)
def test_message_keep_points(message_keeps, resume, expected):
    # cuts 5, 10 (after message ends), 16; a 20-token prompt, R large.
    found = keep_points_in([5, 10, 16], 20, resume, resume, 1000, 0, [5, 10, 16][:2], message_keeps)
    assert {p: k.value for p, k in found.items()} == expected


def test_periodic_keep_is_the_first_cut_at_or_above_each_multiple_of_R():
    found = keep_points_in([5, 10, 13, 21, 26], 30, 0, 0, 12, 0)
    assert found == {13: KeepKind.PERIODIC, 26: KeepKind.PERIODIC}  # 12 -> 13, 24 -> 26 (also the end)


def test_spec_drop_steps_back_one_variable_piece():
    """S = 1: the back points are the cut before e (13 -> 10) and before J (10 -> 5); at 10 the
    junction ranks before prompt_end_back."""
    found = keep_points_in([5, 10, 13], 20, 0, 10, 1000, 1)
    assert found == {5: KeepKind.JUNCTION_BACK, 10: KeepKind.JUNCTION, 13: KeepKind.PROMPT_END}


# ---------------------------------------------------------------------- config and plan


def test_config_message_settings():
    cfg = ExactConfig(cut="messages")
    assert cfg.needs_token_lookup
    with pytest.raises(ValueError, match="never looked up"):
        cfg.cut_rule()
    resolved = ExactConfig(cut="messages", message_end_id=M, min_piece=64)
    assert resolved.cut_rule() == CutRule(832, M, 64)
    assert ExactConfig().cut_rule() == CutRule(832)
    for bad, match in [(dict(min_piece=0), "min_piece=0"), (dict(min_piece=833), "min_piece=833"),
                       (dict(message_keeps=-1), "message_keeps=-1"), (dict(message_end_id=-2), "message_end_id=-2")]:
        with pytest.raises(ValueError, match=match):
            ExactConfig(**bad)


def test_plan_with_message_cuts_resumes_at_a_deleted_message():
    """An agent deletes message 3 of 4: the next prompt resumes exactly where the deleted message
    started (the cut after message 2's end, kept as a state by the first read)."""
    cfg = ExactConfig(cut="messages", message_end_id=M, min_piece=64, retain_every=6656)
    policy = ExactPolicy(cfg)
    first = messages((700, 0), (300, 1), (200, 2), (400, 0))
    tree = ReplayTree.for_config(cfg)
    resume, keep = tree.serve(first)
    assert resume == 0 and {p: k.value for p, k in keep.items()} == {700: "message", 1000: "message",
                                                                    1200: "prompt_end"}
    edited = messages((700, 0), (300, 1), (400, 0))
    assert tree.serve(edited)[0] == 1000
    plan = policy.plan(Arrival(rid="r", tokens=tuple(edited), cache_key=None, tree_hit=0, tree_match=1000,
                               tree_states=(700, 1000)))
    assert plan.resume == 1000 and plan.forwards() == [(1000, 1400)]
    # The same edit under the grid rule resumes at 832 at best, and only where a state was kept there.
    grid = ExactPolicy(ExactConfig())
    assert grid.plan(Arrival(rid="g", tokens=tuple(edited), cache_key=None, tree_hit=0, tree_match=1000,
                             tree_states=(832,))).resume == 832


def messages(*spec: tuple[int, int]) -> list[int]:
    """Messages given as (length, filler token), each closed by M."""
    out: list[int] = []
    for length, filler in spec:
        out += [filler] * (length - 1) + [M]
    return out


# ---------------------------------------------------------------------- replay vs oracle


def random_messages(rng: random.Random) -> list[list[int]]:
    """Prompts of messages over 3 symbols, built from earlier ones: deletions, edits, appends."""
    prompts: list[list[int]] = []
    for _ in range(rng.randint(1, 8)):
        if prompts and rng.random() < 0.8:
            base = list(rng.choice(prompts))
            bounds = [0] + [i + 1 for i, t in enumerate(base) if t == M]
            how = rng.random()
            if how < 0.3 and len(bounds) > 2:  # delete a whole message
                k = rng.randrange(len(bounds) - 1)
                new = base[:bounds[k]] + base[bounds[k + 1]:]
            elif how < 0.6:  # edit inside
                cut = rng.randint(0, len(base))
                new = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 6))] + base[cut:]
            else:  # append a message
                new = base + [rng.randrange(3) for _ in range(rng.randint(0, 12))] + [M]
        else:
            new = [rng.choice([0, 1, 2, 2, M]) for _ in range(rng.randint(1, 40))]
        prompts.append(new[:60] or [M])
    return prompts


@pytest.mark.parametrize("min_piece", [1, 3])
@pytest.mark.parametrize("message_keeps", [0, 1])
@pytest.mark.parametrize("spec_drop", [0, 1], ids=["S0", "S1"])
def test_replay_matches_the_oracle_with_message_cuts(spec_drop, message_keeps, min_piece):
    rng = random.Random(7 + spec_drop + 10 * message_keeps + 100 * min_piece)
    checked = hits = at_message = 0
    for _ in range(120):
        prompts = random_messages(rng)
        caps = [rng.choice([None, None, None, rng.randint(0, len(p) + 2)]) for p in prompts]
        kw = dict(message_end=M, min_piece=min_piece, message_keeps=message_keeps)
        tree = ReplayTree(B, 16, spec_drop, **kw)
        oracle = ExactOracle(B, 16, spec_drop, M, min_piece, message_keeps)
        for p, cap in zip(prompts, caps):
            resume, keep = tree.serve(p, cap)
            assert (resume, sorted(keep)) == oracle.serve(p, cap), (prompts, caps)
            hits += resume > 0
            at_message += resume > 0 and p[resume - 1] == M and resume % B != 0
        assert replay(prompts, piece=B, retain_every=16, spec_drop=spec_drop, caps=caps, **kw) == \
            expected_reuse(prompts, piece=B, retain_every=16, spec_drop=spec_drop, caps=caps, **kw)
        checked += len(prompts)
    assert checked > 400 and hits > 100 and at_message > 20  # resumes off the B grid happen


def test_replay_records_the_pieces_of_each_read():
    tree = ReplayTree(B, 16, message_end=M, min_piece=1)
    tree.serve(prompt(5, 5, 5))
    assert tree.pieces == [[(0, 5), (5, 10), (10, 15)]]


def piece_of(cuts: list[int], length: int, row: int) -> tuple[int, int]:
    bounds = [0] + cuts + [length]
    return next((a, b) for a, b in zip(bounds, bounds[1:]) if a <= row < b)


def test_tree_keys_share_a_row_only_when_both_prompts_read_it_in_the_same_piece():
    """What the tree needs (one KV row per key path): two prompts share a row's key only when the
    row was read by the same piece (start and end) in both, and they still share every row before
    the last cut at or below their common token prefix. Cut starts alone are not enough: the piece
    around the divergence ends elsewhere in each prompt (the review's counterexample: P0 cuts 6 and
    13, P1 = P0[:8] + ... cuts 6 and 10; rows 6-7 were read in [6, 13) by one and [6, 10) by the
    other, and would differ in the last bit)."""
    rule = CutRule(B, M, 1)
    p0 = [0, 1, 2, 0, 1, M, 2, 2, 0, 1, 0, 1, M, 0, 0]
    p1 = p0[:8] + [2, M, 1, 1]
    assert (rule.cuts(p0), rule.cuts(p1)) == ([6, 13], [6, 10])
    k0, k1 = rule.tree_keys(p0, p0), rule.tree_keys(p1, p1)
    assert common_prefix_len(k0, k1) == 6  # not 8: rows 6 and 7 are not shared
    rng = random.Random(11)
    for _ in range(3000):
        p = [rng.choice([0, 1, M]) for _ in range(rng.randint(2, 40))]
        d = rng.randint(1, len(p) - 1)
        q = p[:d] + [rng.choice([0, 1, M]) for _ in range(rng.randint(1, 10))]
        if q[d] == p[d]:
            continue
        min_piece = rng.randint(1, B)
        rule = CutRule(B, M, min_piece)
        shared = common_prefix_len(rule.tree_keys(p, p), rule.tree_keys(q, q))
        p_cuts, q_cuts = rule.cuts(p), rule.cuts(q)
        for row in range(shared):
            assert piece_of(p_cuts, len(p), row) == piece_of(q_cuts, len(q), row)
        assert shared >= max([c for c in q_cuts if c <= d], default=0)
        assert rule.tree_keys(p, p[:d]) == rule.tree_keys(p, p)[:d]  # a prefix's keys are the prompt's


def test_grid_tree_keys_are_the_tokens():
    assert CutRule(B).tree_keys([1, 2, 3], [1, 2]) is None


def test_replay_with_a_snapshot_budget_evicts_the_least_recently_used():
    """Budget 2: three conversations' prompt-end states; the first one's goes (least recently
    used), so its repeat reads again; the third's repeat still resumes."""
    a, b, c = ([k] * 20 for k in (0, 1, 2))
    tree = ReplayTree(B, 1000, max_snapshots=2)
    assert [tree.serve(p)[0] for p in (a, b, c, c, a)] == [0, 0, 0, 16, 0]
    assert tree.evicted >= 1 and len(tree.snapshots) == 2
    unlimited = ReplayTree(B, 1000)
    assert [unlimited.serve(p)[0] for p in (a, b, c, c, a)] == [0, 0, 0, 16, 16]
