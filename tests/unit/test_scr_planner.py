"""``scr.planner``: the default-path K-block relocation plan (spec §6.5, §4.2 step 10)."""
# Spec: docs/scr.md

from __future__ import annotations

import itertools
import random

import pytest

from scr.diff import difflib_opcodes
from scr.planner import Block, candidate_ops, leading_equal_end, plan_blocks, schedule_blocks


def relocations(old, new, **kwargs) -> list[tuple[int, int, int]]:
    """``plan_blocks``'s blocks as ``(old_start, new_start, num_rows)``, in new-start order."""
    return [(b.old_start, b.new_start, b.num_rows) for b in plan_blocks(old, new, **kwargs)[1]]


def build(*parts):
    """Old and new token lists from a layout.

    An int ``n`` is a run of ``n`` tokens present in both; a pair ``(n_old, n_new)`` is an
    edit: ``n_old`` tokens only in old, ``n_new`` only in new.  All tokens are distinct,
    so the diff is exactly the layout (equal / replace / delete / insert ops).
    """
    counter = itertools.count(1)
    old, new = [], []
    for p in parts:
        if isinstance(p, int):
            seg = [next(counter) for _ in range(p)]
            old += seg
            new += seg
        else:
            n_old, n_new = p
            old += [100000 + next(counter) for _ in range(n_old)]
            new += [200000 + next(counter) for _ in range(n_new)]
    return old, new


E = (10, 10)  # a 10-token replacement: old and new coordinates stay equal

# --------------------------------------------------------------------------- basic rules


@pytest.mark.parametrize(
    "parts, kwargs, expected",
    [
        # threshold: a block must be >= min_tail + min_extend = 80 tokens; rows = n_c - 16
        pytest.param((100, (10, 20), 79), {}, [], id="run-79-too-short"),
        pytest.param((100, (10, 20), 80), {}, [(110, 120, 64)], id="run-80-threshold-64-rows"),
        pytest.param((100, (10, 20), 81), {}, [(110, 120, 65)], id="run-81-65-rows"),
        pytest.param((100, (10, 20), 64), {}, [], id="run-64-candidate-never-qualifies"),
        # the leading run is required but has no minimum length, and is never relocated
        pytest.param(((10, 20), 200), {}, [], id="no-leading-equal-run"),
        pytest.param((1, (10, 20), 100), {}, [(11, 21, 84)], id="one-token-lead-suffices"),
        pytest.param((500, (10, 20), 79), {}, [], id="long-lead-not-a-candidate"),
        # passthrough (§4.2 step 10): something must be deleted AND inserted
        pytest.param((100, (0, 20), 200), {}, [], id="pure-insert-passthrough"),
        pytest.param((100, (20, 0), 200), {}, [], id="pure-delete-passthrough"),
        pytest.param((100, (20, 0), 200, (0, 5), 100), {},
                     [(120, 100, 184), (320, 305, 84)], id="delete-then-insert-plans"),
        pytest.param((100, (10, 20), 300, (5, 0)), {}, [(110, 120, 284)],
                     id="trailing-delete"),
        # knobs kext = max(1, min_extend), threshold n_c - kext >= min_tail
        pytest.param((100, (10, 20), 65), {"min_extend": 0}, [(110, 120, 64)],
                     id="min-extend-0-clamped-to-1-run-65"),
        pytest.param((100, (10, 20), 64), {"min_extend": 0}, [], id="min-extend-0-run-64"),
        pytest.param((100, (10, 20), 96), {"min_extend": 32}, [(110, 120, 64)],
                     id="min-extend-32-run-96"),
        pytest.param((100, (10, 20), 95), {"min_extend": 32}, [], id="min-extend-32-run-95"),
        pytest.param((100, (10, 20), 116), {"min_tail": 100}, [(110, 120, 100)],
                     id="min-tail-100-run-116"),
        pytest.param((100, (10, 20), 115), {"min_tail": 100}, [], id="min-tail-100-run-115"),
    ],
)
def test_basic_rules(parts, kwargs, expected):
    old, new = build(*parts)
    assert relocations(old, new, **kwargs) == expected


# -------------------------------------------------------------------- K largest and ties

SIZES = (100, 300, 90, 250, 120, 80, 200, 150)
# blocks (old == new coordinates): 110+100, 220+300, 530+90, 630+250, 890+120, 1020+80,
# 1110+200, 1320+150


def layout(sizes):
    parts = [100]
    for n in sizes:
        parts += [E, n]
    return build(*parts)


@pytest.mark.parametrize(
    "sizes, kwargs, expected",
    [
        pytest.param(SIZES, {}, [(110, 110, 84), (220, 220, 284), (630, 630, 234),
                                 (890, 890, 104), (1110, 1110, 184), (1320, 1320, 134)],
                     id="8-candidates-6-largest-sorted-by-new-start"),
        pytest.param(SIZES, {"max_blocks": 1}, [(220, 220, 284)], id="max-blocks-1-largest"),
        pytest.param(SIZES, {"max_blocks": 0}, [(220, 220, 284)], id="max-blocks-0-clamped-to-1"),
        pytest.param(SIZES, {"max_blocks": 2}, [(220, 220, 284), (630, 630, 234)],
                     id="max-blocks-2"),
        pytest.param(SIZES, {"max_blocks": 20},
                     [(110, 110, 84), (220, 220, 284), (530, 530, 74), (630, 630, 234),
                      (890, 890, 104), (1020, 1020, 64), (1110, 1110, 184), (1320, 1320, 134)],
                     id="max-blocks-20-all-8-qualify"),
        # seven equal blocks: ties go to the later op, so the earliest block is dropped
        pytest.param((100,) * 7, {}, [(220, 220, 84), (330, 330, 84), (440, 440, 84),
                                      (550, 550, 84), (660, 660, 84), (770, 770, 84)],
                     id="7-ties-earliest-dropped"),
        pytest.param((100,) * 7, {"max_blocks": 1}, [(770, 770, 84)], id="ties-max-1-latest"),
        # two 200s, then four of six 100s: the latest four (op order) win
        pytest.param((100, 200, 100, 200, 100, 100, 100, 100), {},
                     [(220, 220, 184), (540, 540, 184), (750, 750, 84), (860, 860, 84),
                      (970, 970, 84), (1080, 1080, 84)],
                     id="partial-ties-latest-100s"),
    ],
)
def test_k_largest_with_tie_order(sizes, kwargs, expected):
    old, new = layout(sizes)
    assert relocations(old, new, **kwargs) == expected


def test_result_sorted_by_new_start_with_moved_coordinates():
    # old/new coordinates diverge: edits shrink and grow; the largest block is last in new
    old, new = build(200, (50, 5), 90, (0, 40), 120, (30, 0), (1, 300), 400)
    moved = relocations(old, new)
    assert moved == [(250, 205, 74), (340, 335, 104), (491, 755, 384)]
    assert [m[1] for m in moved] == sorted(m[1] for m in moved)


# ----------------------------------------------------------------------------- mb_min_gap

# A = 110..210 (100), B = 220..320 (100), C = 330..630 (300).  Gap from the end of A's
# relocated part (194) to B is 26, B's (304) to C is 26, A's to C is 136.
GAP_LAYOUT = (100, E, 100, E, 100, E, 300)
A, B, C = (110, 110, 84), (220, 220, 84), (330, 330, 284)


@pytest.mark.parametrize(
    "parts, gap, expected",
    [
        pytest.param(GAP_LAYOUT, 0, [A, B, C], id="gap-0-off"),
        pytest.param(GAP_LAYOUT, -5, [A, B, C], id="gap-negative-off"),
        pytest.param(GAP_LAYOUT, 26, [A, B, C], id="gap-26-equal-kept"),
        pytest.param(GAP_LAYOUT, 27, [A, C], id="gap-27-drops-B-C-measured-from-A"),
        pytest.param(GAP_LAYOUT, 136, [A, C], id="gap-136-C-at-limit"),
        # only A survives the filter -> the plan keeps the LARGEST block (C), not A
        pytest.param(GAP_LAYOUT, 137, [C], id="gap-137-quirk-one-left-keeps-largest"),
        pytest.param((100, E, 300, E, 100), 1000, [(110, 110, 284)],
                     id="quirk-leftmost-is-largest"),
    ],
)
def test_mb_min_gap(parts, gap, expected):
    old, new = build(*parts)
    assert relocations(old, new, mb_min_gap=gap) == expected


# ------------------------------------------------------------ side_len / side_ids capping

# A = 110..210 (100), B = 220..520 (300)
SIDE_LAYOUT = (100, E, 100, E, 300, E, 50)
SA, SB = (110, 110, 84), (220, 220, 284)


@pytest.mark.parametrize(
    "side_len, kwargs, expected",
    [
        pytest.param(None, {}, [SA, SB], id="no-cap"),
        pytest.param(520, {}, [SA, SB], id="cap-at-block-end"),
        pytest.param(519, {}, [SA], id="cap-one-short-drops-B"),
        pytest.param(505, {}, [SA], id="cap-past-relocated-rows-still-drops-B"),
        pytest.param(519, {"max_blocks": 1}, [SA], id="cap-then-largest-available"),
        pytest.param(210, {}, [SA], id="cap-at-A-end"),
        pytest.param(209, {}, [], id="cap-below-A"),
        pytest.param(0, {}, [], id="empty-side"),
        pytest.param(10**6, {}, [SA, SB], id="cap-beyond-old"),
    ],
)
def test_side_len_caps(side_len, kwargs, expected):
    old, new = build(*SIDE_LAYOUT)
    assert relocations(old, new, side_len=side_len, **kwargs) == expected


@pytest.mark.parametrize(
    "mutate_at, truncate, kwargs, expected",
    [
        pytest.param(None, None, {}, [SA, SB], id="aligned"),
        pytest.param(220, None, {}, [SA], id="B-first-row-differs"),
        pytest.param(503, None, {}, [SA], id="B-last-relocated-row-differs"),
        pytest.param(504, None, {}, [SA, SB], id="B-forwarded-token-differs-ok"),
        pytest.param(220, None, {"max_blocks": 1}, [SA], id="misaligned-does-not-use-a-slot"),
        pytest.param(None, 519, {}, [SA], id="side-ids-short-caps"),
        pytest.param(150, None, {}, [SB], id="A-differs"),
    ],
)
def test_side_ids_alignment(mutate_at, truncate, kwargs, expected):
    old, new = build(*SIDE_LAYOUT)
    side_ids = list(old)
    if mutate_at is not None:
        side_ids[mutate_at] = -1
    if truncate is not None:
        side_ids = side_ids[:truncate]
    assert relocations(old, new, side_ids=side_ids, **kwargs) == expected


# ------------------------------------------------------------------ helpers and details


def test_plan_blocks_reports_lead_and_blocks():
    old, new = build(100, (10, 20), 90, E, 200)
    assert plan_blocks(old, new) == (
        100, [Block(110, 120, 74, 90, 210), Block(210, 220, 184, 200, 420)])
    assert plan_blocks(*build((10, 20), 200)) == (None, [])
    assert plan_blocks(*build(100, (0, 20), 200)) == (None, [])
    assert plan_blocks(*build(100, (10, 20), 50)) == (100, [])


@pytest.mark.parametrize(
    "ops, lead",
    [
        pytest.param([("equal", 0, 5, 0, 5), ("insert", 5, 5, 5, 6)], 5, id="equal-first"),
        pytest.param([("replace", 0, 1, 0, 1), ("equal", 1, 5, 1, 5)], None, id="replace-first"),
        pytest.param([], None, id="empty"),
    ],
)
def test_leading_equal_end(ops, lead):
    assert leading_equal_end(ops) == lead


def test_candidates_must_start_after_leading_run():
    # not a tiling, just the filter: the second equal op starts inside the leading run
    ops = [("equal", 0, 200, 0, 200), ("equal", 300, 400, 150, 250), ("equal", 400, 500, 250, 350)]
    assert candidate_ops(ops, 200, side_len=None, len_positions=500) == [(2, ops[2])]
    assert candidate_ops(ops, 200, side_len=None, len_positions=499) == []


def test_precomputed_ops_are_used():
    old, new = build(100, (10, 20), 200)
    fake = [("equal", 0, 100, 0, 100), ("replace", 100, 110, 100, 120), ("equal", 110, 310, 120, 320)]
    assert relocations(old, new, ops=fake) == [(110, 120, 184)]
    assert relocations(old, new, ops=fake[:1] + [("replace", 100, 310, 100, 320)]) == []


# --------------------------------------------------------- spec §13.1 inputs and long inputs


def test_authors_find_session_prompt_plans_one_block():
    """§13.1 test 1's prompts (old 0..2999; new = old[:2000] + 5000..5099 + old[2100:]).

    The authors' test checks session matching only; the plan here is derived from §6.5:
    lead 2000, replace 100 by 100, one equal block of 900 -> 884 rows.
    """
    old = list(range(3000))
    new = old[:2000] + list(range(5000, 5100)) + old[2100:]
    assert relocations(old, new) == [(2100, 2100, 884)]
    assert plan_blocks(old, new)[0] == 2000


def test_authors_fast_path_prompt_plans_one_block():
    """§13.1 test 6's prompts (old 0..4095, token 2048 replaced): CDC path, one block."""
    old = list(range(4096))
    new = old[:2048] + [9999] + old[2049:]
    assert relocations(old, new) == [(2049, 2049, 2031)]


def test_long_swap_plan_follows_cdc_not_difflib():
    """Above 2048 tokens the plan comes from the CDC diff, which may keep another block."""
    rng = random.Random(0)
    a, b, c, d = ([rng.randrange(1000, 50000) for _ in range(n)] for n in (1500, 400, 300, 1200))
    old, new = a + b + c + d, a + c + b + d
    assert relocations(old, new) == [(1900, 1500, 284), (2200, 2200, 1184)]
    assert relocations(old, new, ops=difflib_opcodes(old, new)) == [(1500, 1800, 384), (2200, 2200, 1184)]


def test_long_several_edits():
    rng = random.Random(2024)
    base = [rng.randrange(1000, 50000) for _ in range(6000)]
    y = [rng.randrange(100000, 200000) for _ in range(340)]
    new = base[:1200] + y[:40] + base[1500:2600] + base[2650:4000] + y[40:] + base[4010:5990]
    assert relocations(new=new, old=base) == [
        (1500, 1240, 1084), (2650, 2340, 1334), (4010, 3990, 1964)]


def _b(new_start, num_rows, n_c=None):
    n_c = num_rows + 16 if n_c is None else n_c
    return Block(new_start + 100, new_start, num_rows, n_c, new_start + n_c)


@pytest.mark.parametrize(
    "accepted, gap, expected",
    [
        pytest.param([], 0, [], id="none"),
        pytest.param([_b(500, 200)], 0, [_b(500, 200)], id="one"),
        pytest.param([_b(900, 300), _b(100, 200)], 0, [_b(100, 200), _b(900, 300)], id="new-start-order"),
        # 900 - (100 + 216 - 16) = 600 >= 500: both kept.
        pytest.param([_b(900, 300), _b(100, 200)], 500, [_b(100, 200), _b(900, 300)], id="gap-kept"),
        # The gap filter keeps only the earliest block; the plan is still the largest one.
        pytest.param([_b(900, 300), _b(100, 200)], 700, [_b(900, 300)], id="gap-quirk-largest"),
    ],
)
def test_schedule_blocks(accepted, gap, expected):
    assert schedule_blocks(accepted, kext=16, mb_min_gap=gap) == expected


def test_candidate_ops_keeps_an_equal_run_of_exactly_min_tail_rows():
    """§6.5 step 1 drops a run shorter than ``min_tail``; a run of exactly ``min_tail`` stays a
    candidate (``accept_blocks`` then asks for ``min_tail`` rows after the forwarded ones)."""
    min_tail = 8
    ops = [("equal", 0, 10, 0, 10), ("delete", 10, 12, 10, 10),
           ("equal", 12, 12 + min_tail, 10, 10 + min_tail), ("insert", 20, 20, 18, 19),
           ("equal", 20, 20 + min_tail - 1, 19, 19 + min_tail - 1)]
    found = candidate_ops(ops, 10, side_len=None, len_positions=100, min_tail=min_tail)
    assert found == [(k, op) for k, op in enumerate(ops) if k > 0 and op[0] == "equal" and op[2] - op[1] >= min_tail]
    assert [k for k, _ in found] == [2]
