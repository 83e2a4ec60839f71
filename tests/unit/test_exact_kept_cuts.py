"""``cut=kept``: any 64-multiple is a resume point, forwards end only at multiples of B counted from
the read's start and (``keeps=ends``) at keep points (each floored to the 64-token grid), the
tree's keys are the tokens; with ``keeps=inside`` keep points end no forward and are kept inside
the forward that crosses them. ``replay`` against the brute-force oracle
(``tests/reference/exact_oracle.py``, ``kept=True``, its ``expected_forwards``) and the policy's
plan against the replay's forwards.

Prompts are long enough to cross the 64-grid a few times: B = 128 (two grid steps), R = 256,
the message-end token is 9, other tokens are 0-2.
"""

from __future__ import annotations

import random

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from exact_cache.replay import ReplayTree, replay
from exact_cache.rules import GRID, CutRule, KeepKind, keeps_within, kept_message_ends
from policy.api import Arrival, Read, Snapshot
from tests.reference.exact_oracle import ExactOracle, expected_forwards, expected_reuse, expected_snapshots

B, R, M = 128, 256, 9


def messages(*lengths: int) -> list[int]:
    out: list[int] = []
    for length in lengths:
        out += [1] * (length - 1) + [M]
    return out


def test_every_grid_multiple_is_a_cut_and_the_keys_are_the_tokens():
    rule = CutRule(B, M, kept=True)
    tokens = messages(100, 100, 100)
    assert rule.cuts(tokens) == [64, 128, 192, 256]  # never the prompt end (300)
    assert rule.cuts(tokens[:256]) == [64, 128, 192]
    assert rule.tree_keys(tokens, tokens) is None


@pytest.mark.parametrize("lengths, expected", [
    pytest.param((100, 100, 100), [64, 192], id="floored"),        # ends after 100, 200: floors 64, 192
    pytest.param((64, 64, 10), [64, 128], id="on-the-grid"),       # ends after 64, 128 stay
    pytest.param((30, 20, 100), [], id="before-the-first-step"),   # ends after 30, 50: floor 0 is no keep
    pytest.param((70, 10, 5), [64], id="two-ends-one-floor"),      # 70 and 80 both floor to 64
    pytest.param((128,), [], id="never-the-prompt-end"),
])
def test_message_keep_points_are_floored_to_the_grid(lengths, expected):
    tokens = messages(*lengths)
    assert kept_message_ends(tokens, M) == expected
    assert CutRule(B, M, kept=True).message_ends(tokens, []) == expected


def test_forwards_end_at_chunk_multiples_and_keep_points_only():
    rule = CutRule(B, M, kept=True)
    assert rule.forwards([], 0, 300, {64: "message", 192: "message", 256: "prompt_end"}) == [
        (0, 64), (64, 128), (128, 192), (192, 256), (256, 300)]
    assert rule.forwards([], 0, 300, {256: "prompt_end"}) == [(0, 128), (128, 256), (256, 300)]
    assert rule.forwards([], 192, 300, {256: "prompt_end"}) == [(192, 256), (256, 300)]
    assert rule.forwards([], 192, 200, {}) == [(192, 200)]
    with pytest.raises(ValueError, match="64-token grid"):
        rule.forwards([], 100, 300, {})
    with pytest.raises(ValueError, match="multiple of 64"):
        CutRule(100, kept=True)


@pytest.mark.parametrize("inside", [False, True], ids=["ends", "inside"])
def test_chunk_ends_count_from_the_read_start(inside):
    """SGLang's chunked prefill counts B from where the read starts; start and B are 64-multiples,
    so every chunk end is on the grid."""
    rule = CutRule(256, kept=True, inside=inside)
    assert rule.forwards([], 128, 700, {}) == [(128, 384), (384, 640), (640, 700)]
    assert rule.forwards([], 0, 700, {}) == [(0, 256), (256, 512), (512, 700)]
    assert rule.forwards([], 128, 384, {}) == [(128, 384)]  # a chunk end at the prompt end is the prompt end
    assert rule.forwards([], 640, 641, {}) == [(640, 641)]
    assert all(b % GRID == 0 for a, b in rule.forwards([], 192, 5000, {})[:-1])


def test_keep_points_end_forwards_unless_kept_inside():
    keep = {192: KeepKind.MESSAGE, 320: KeepKind.JUNCTION, 384: KeepKind.PERIODIC, 640: KeepKind.PROMPT_END}
    ends, inside = CutRule(256, kept=True), CutRule(256, kept=True, inside=True)
    # ends: the chunk ends from 128 (384, 640) and every keep point past the start
    assert ends.forwards([], 128, 700, keep) == [(128, 192), (192, 320), (320, 384), (384, 640), (640, 700)]
    # inside: the chunk ends only; the keep points fall inside or at the end of a forward
    assert inside.forwards([], 128, 700, keep) == [(128, 384), (384, 640), (640, 700)]
    assert [keeps_within(f, keep) for f in inside.forwards([], 128, 700, keep)] == [[192, 320, 384], [640], []]
    assert [keeps_within(f, keep) for f in ends.forwards([], 128, 700, keep)] == [[192], [320], [384], [640], []]
    assert keeps_within((192, 320), {192: "junction"}) == []  # at the start: the forward before kept it


def test_keeps_inside_places_every_keep_point_in_the_forward_that_reaches_it():
    """Exhaustive over small reads: the forwards tile the read, end only at start + jB and the
    prompt end, and each keep point (a 64-multiple in (start, |P|)) is kept by exactly one forward,
    the first whose end is at or past it; the ends rule's forwards are the inside rule's cut again
    at the keep points."""
    for piece in (64, 128, 192):
        for start in range(0, 448, 64):
            for length in range(start + 1, 460, 7):
                grid = [g for g in range(start + GRID, length, GRID)]
                for mask in range(1 << min(len(grid), 5)):
                    keep = {g: "message" for i, g in enumerate(grid[:5]) if mask >> i & 1}
                    got = CutRule(piece, kept=True, inside=True).forwards([], start, length, keep)
                    assert got == expected_forwards(piece, start, length, keep, inside=True)
                    assert {b for _, b in got} <= {start + j * piece for j in range(1, 10)} | {length}
                    placed = [k for f in got for k in keeps_within(f, keep)]
                    assert placed == sorted(keep)
                    assert [(i, keeps_within(f, keep)) for i, f in enumerate(got)] == expected_snapshots(got, keep)
                    ended = CutRule(piece, kept=True).forwards([], start, length, keep)
                    assert ended == expected_forwards(piece, start, length, keep)
                    assert {b for _, b in ended} == {b for _, b in got} | set(keep)


def test_config_kept_validates_and_builds_the_rule():
    config = ExactConfig(piece_tokens=832, retain_every=6400, cut="kept", message_end_id=M)
    assert config.cut_rule() == CutRule(832, M, kept=True)
    assert ExactConfig(cut="kept", message_end="").cut_rule() == CutRule(832, None, kept=True)
    assert ExactConfig(cut="kept").needs_token_lookup and not ExactConfig(cut="kept", message_end="").needs_token_lookup
    with pytest.raises(ValueError, match="multiple of 64 \\(cut=kept\\)"):
        ExactConfig(cut="kept", retain_every=6600, message_end_id=M)
    with pytest.raises(ValueError, match="grid, messages or kept"):
        ExactConfig(cut="pieces")


def test_config_keeps_inside_is_only_for_the_kept_rule():
    config = ExactConfig(cut="kept", keeps="inside", message_end_id=M)
    assert config.cut_rule() == CutRule(832, M, kept=True, inside=True)
    assert ExactConfig(cut="kept", message_end_id=M).cut_rule().inside is False  # keeps=ends by default
    for cut in ("grid", "messages"):
        with pytest.raises(ValueError, match=f"^keeps=inside: only with cut=kept .*not cut={cut}$"):
            ExactConfig(cut=cut, keeps="inside", message_end_id=M)
    with pytest.raises(ValueError, match="^keeps='middle': must be ends or inside$"):
        ExactConfig(cut="kept", keeps="middle")
    with pytest.raises(ValueError, match="only under the kept rule"):
        CutRule(832, inside=True)


def test_the_plan_resumes_on_the_grid_and_keeps_at_floored_points():
    policy = ExactPolicy(ExactConfig(piece_tokens=B, retain_every=R, cut="kept", message_end_id=M))
    tokens = tuple(messages(100, 100, 100))
    cold = policy.plan(Arrival(rid="a", tokens=tokens, cache_key=None, tree_hit=0, tree_match=0, tree_states=()))
    assert cold.resume == 0 and cold.steps == (
        Read(0, 64), Snapshot(64, KeepKind.MESSAGE.value), Read(64, 128), Read(128, 192),
        Snapshot(192, KeepKind.MESSAGE.value), Read(192, 256), Snapshot(256, KeepKind.PERIODIC.value), Read(256, 300))
    inside = ExactPolicy(ExactConfig(piece_tokens=B, retain_every=R, cut="kept", keeps="inside", message_end_id=M))
    cold_inside = inside.plan(Arrival(rid="a", tokens=tokens, cache_key=None, tree_hit=0, tree_match=0, tree_states=()))
    # the same states, in forwards that end at the chunk ends (128, 256) and the prompt end only
    assert cold_inside.resume == 0 and cold_inside.steps == (
        Read(0, 128), Snapshot(64, KeepKind.MESSAGE.value), Read(128, 256), Snapshot(192, KeepKind.MESSAGE.value),
        Snapshot(256, KeepKind.PERIODIC.value), Read(256, 300))
    cold_inside.validate(len(tokens))
    assert cold_inside.snapshots() == cold.snapshots()
    edited = tokens[:150] + (2,) * 5 + tokens[150:]
    warm = policy.plan(Arrival(rid="b", tokens=edited, cache_key=None, tree_hit=0, tree_match=150, tree_states=(64, 192, 256)))
    # matched 150: bound 128 (no state there), so resume at 64; junction 128 and the new keeps
    assert warm.resume == 64 and warm.steps[:3] == (Read(64, 128), Snapshot(128, KeepKind.JUNCTION.value),
                                                    Read(128, 192))


def random_prompts(rng: random.Random) -> list[list[int]]:
    """Prompts of messages built from earlier ones: deletions, edits, appends (lengths to 700)."""
    prompts: list[list[int]] = []
    for _ in range(rng.randint(1, 6)):
        if prompts and rng.random() < 0.8:
            base = list(rng.choice(prompts))
            how, cut = rng.random(), rng.randint(0, len(base))
            if how < 0.3:
                new = base[:cut] + base[min(len(base), cut + rng.randint(1, 150)):]
            elif how < 0.6:
                new = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 40))] + base[cut:]
            else:
                new = base + [rng.randrange(3) for _ in range(rng.randint(0, 200))] + [M]
        else:
            new = [rng.choice([0, 1, 2, 2, 2, 2, M]) for _ in range(rng.randint(1, 500))]
        prompts.append(new[:700] or [M])
    return prompts


@pytest.mark.parametrize("inside", [False, True], ids=["ends", "inside"])
@pytest.mark.parametrize("message_end", [M, None], ids=["messages", "no-messages"])
@pytest.mark.parametrize("spec_drop", [0, 1], ids=["S0", "S1"])
def test_replay_and_plan_match_the_oracle_under_the_kept_rule(spec_drop, message_end, inside):
    rng = random.Random(11 + spec_drop + (message_end or 0))
    policy = ExactPolicy(ExactConfig(piece_tokens=B, retain_every=R, spec_drop=spec_drop, cut="kept",
                                     message_end="" if message_end is None else "x",
                                     message_end_id=-1 if message_end is None else message_end,
                                     keeps="inside" if inside else "ends"))
    checked = hits = 0
    for _ in range(80):
        prompts = random_prompts(rng)
        tree = ReplayTree(B, R, spec_drop, message_end=message_end, kept=True, inside=inside)
        oracle = ExactOracle(B, R, spec_drop, message_end, kept=True)
        for p in prompts:
            resume, keep = tree.serve(p)
            assert (resume, sorted(keep)) == oracle.serve(p), prompts
            assert resume % GRID == 0
            forwards = tree.pieces[-1]
            assert forwards == expected_forwards(B, resume, len(p), keep, inside)
            assert all(a % GRID == 0 for a, _ in forwards)
            hits += resume > 0
        assert replay(prompts, piece=B, retain_every=R, spec_drop=spec_drop, message_end=message_end, kept=True) == \
            expected_reuse(prompts, piece=B, retain_every=R, spec_drop=spec_drop, message_end=message_end, kept=True)
        checked += len(prompts)
    assert checked > 200 and hits > 60
    # the policy's plan reads exactly the replay's forwards and keeps its keep points
    tree = ReplayTree(B, R, spec_drop, message_end=message_end, kept=True, inside=inside)
    states: list[int] = []
    for p in random_prompts(random.Random(3)):
        from policy.tokens import common_prefix_len
        held = max((common_prefix_len(p[:len(p) - 1], q) for q in tree.texts), default=0)
        plan = policy.plan(Arrival(rid="r", tokens=tuple(p), cache_key=None, tree_hit=0, tree_match=held,
                                   tree_states=tuple(d for d in states if d <= held)))
        resume, keep = tree.serve(p)
        assert plan.resume == resume
        assert [(s.start, s.end) for s in plan.steps if isinstance(s, Read)] == tree.pieces[-1]
        assert [s.at for s in plan.steps if isinstance(s, Snapshot)] == sorted(keep)
        plan.validate(len(p))
        by_read, index = {}, -1
        for step in plan.steps:  # each Snapshot after the Read the oracle places it in
            index += isinstance(step, Read)
            if isinstance(step, Snapshot):
                by_read.setdefault(index, []).append(step.at)
        assert by_read == {i: ks for i, ks in expected_snapshots(tree.pieces[-1], keep) if ks}
        states = sorted(set(states) | set(keep))
