"""``scr.diff``: the SCR token diff (spec §6.1–§6.3, §4.2 step 9, authors' tests §13.1 #5–#7)."""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import random
from difflib import SequenceMatcher

import pytest

import scr.diff as sd
from scr.diff import (
    cdc_bounds,
    diff_opcodes,
    diff_with_path,
    difflib_opcodes,
    edit_counts,
    fast_opcodes,
    is_passthrough,
    new_positions,
    verify_opcodes,
)
from scr.planner import plan_blocks


def apply_ops(old, new, ops):
    """Rebuild ``new`` from ``old`` using only old tokens for equal ops (checks the ops' claims)."""
    out = []
    for tag, i1, i2, j1, j2 in ops:
        out.extend(old[i1:i2] if tag == "equal" else new[j1:j2])
    return out


def rand_tokens(rng, n, lo=1000, hi=50000):
    return [rng.randrange(lo, hi) for _ in range(n)]


def fresh(rng, n):
    """Tokens outside the base vocabulary, so edges of edits cannot extend into them."""
    return [rng.randrange(100000, 200000) for _ in range(n)]


# --------------------------------------------------------------------------- short path


@pytest.mark.parametrize(
    "old, new, expected",
    [
        pytest.param([1, 2, 3], [1, 9, 3],
                     [("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2), ("equal", 2, 3, 2, 3)],
                     id="authors-5-replace-middle"),
        pytest.param([1, 2, 3], [1, 2, 3], [("equal", 0, 3, 0, 3)], id="identical"),
        pytest.param([1, 2, 3], [1, 2, 7, 3],
                     [("equal", 0, 2, 0, 2), ("insert", 2, 2, 2, 3), ("equal", 2, 3, 3, 4)],
                     id="insert-one"),
        pytest.param([1, 2, 3, 4], [1, 4],
                     [("equal", 0, 1, 0, 1), ("delete", 1, 3, 1, 1), ("equal", 3, 4, 1, 2)],
                     id="delete-two"),
        pytest.param([1, 2, 3], [1, 2, 3, 4, 5],
                     [("equal", 0, 3, 0, 3), ("insert", 3, 3, 3, 5)], id="append"),
        pytest.param([], [5, 6], [("insert", 0, 0, 0, 2)], id="empty-old"),
        pytest.param([5, 6], [], [("delete", 0, 2, 0, 0)], id="empty-new"),
        pytest.param([], [], [], id="both-empty"),
        pytest.param([1, 2], [3, 4], [("replace", 0, 2, 0, 2)], id="nothing-kept"),
    ],
)
def test_short_inputs_hand_written(old, new, expected):
    stats = {}
    ops, path = diff_with_path(old, new, stats=stats)
    assert ops == expected
    assert path == "difflib"
    assert stats == {}  # the short path touches no counter (§13.1 tests 6-7)


@pytest.mark.parametrize("seed", [0, 1, 2, 3], ids=lambda s: f"seed{s}")
def test_short_inputs_equal_difflib(seed):
    rng = random.Random(seed)
    old = [rng.randrange(20) for _ in range(300)]
    new = old[:50] + [rng.randrange(20) for _ in range(30)] + old[120:]
    expected = SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    assert diff_opcodes(old, new) == expected
    assert apply_ops(old, new, expected) == new


def test_autojunk_is_off():
    # A small alphabet makes token 0 "popular"; difflib's default autojunk would hide
    # the real match and return 2 ops.  The spec fixes autojunk=False.
    rng = random.Random(0)
    old = [rng.choice([0, 0, 0, 0, 1, 2, 3]) for _ in range(250)]
    new = old[:100] + [9] + old[100:]
    assert len(SequenceMatcher(None, old, new).get_opcodes()) == 2
    assert diff_opcodes(old, new) == [
        ("equal", 0, 100, 0, 100), ("insert", 100, 100, 100, 101), ("equal", 100, 250, 101, 251),
    ]


@pytest.mark.parametrize(
    "len_old, len_new, kwargs, path",
    [
        pytest.param(2047, 4000, {}, "difflib", id="old-2047-below-min"),
        pytest.param(4000, 2047, {}, "difflib", id="new-2047-below-min"),
        pytest.param(2048, 2048, {}, "fastdiff", id="both-2048-cdc"),
        pytest.param(4000, 4000, {"fastdiff": False}, "difflib", id="fastdiff-off"),
        pytest.param(500, 500, {"fastdiff_min": 100}, "fastdiff", id="lower-min-knob"),
    ],
)
def test_path_selection(len_old, len_new, kwargs, path, monkeypatch):
    calls = []
    real = sd.fast_opcodes

    def spy(old, new, **kw):
        calls.append(1)
        return real(old, new, **kw)

    monkeypatch.setattr(sd, "fast_opcodes", spy)
    rng = random.Random(7)
    base = rand_tokens(rng, max(len_old, len_new))
    old = base[:len_old]
    new = base[:len_new - 1] + fresh(rng, 1) if len_new <= len_old else base[:len_new]
    ops, got = diff_with_path(old, new, stats={}, **kwargs)
    assert got == path
    assert len(calls) == (1 if path == "fastdiff" else 0)
    assert apply_ops(old, new, ops) == new


def test_authors_5_short_does_not_call_fast_diff(monkeypatch):
    """§13.1 test 5: FASTDIFF on, minimum 2048, fast diff mocked and not called."""
    calls = []
    monkeypatch.setattr(sd, "fast_opcodes", lambda *a, **k: calls.append(a))
    stats = {}
    assert diff_opcodes([1, 2, 3], [1, 9, 3], stats=stats) == [
        ("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2), ("equal", 2, 3, 2, 3),
    ]
    assert calls == []
    assert stats == {}


# ------------------------------------------------------------------------ CDC internals


@pytest.mark.parametrize(
    "ids, expected",
    [
        pytest.param([], [0], id="empty"),
        # token 0 hashes to 0, so h stays 0 and every token closes a chunk
        pytest.param([0, 0, 0], [0, 1, 2, 3], id="zeros-every-token"),
        # 0x9E3779B1 has bits 8..13 = 0b111001 != 0: no boundary, end added once
        pytest.param([1], [0, 1], id="one-token-no-boundary"),
        # after token 1, each 0 shifts h left; bits 8..13 of (m << k) first all zero at
        # k = 14 (m's lowest set bit is bit 0), i.e. after the 14th zero (index 14)
        pytest.param([1] + [0] * 16, [0, 15, 16, 17], id="shift-out-after-14"),
    ],
)
def test_cdc_bounds_hand_computed(ids, expected):
    assert cdc_bounds(ids) == expected


def test_cdc_bounds_resynchronise_after_edit():
    rng = random.Random(11)
    old = rand_tokens(rng, 3000)
    new = old[:1000] + fresh(rng, 37) + old[1000:]
    bo, bn = cdc_bounds(old), cdc_bounds(new)
    assert bo[0] == 0 and bo[-1] == 3000 and bn[-1] == 3037
    # the boundary test sees at most the last 14 tokens, so from 14 tokens past the edit
    # the boundaries coincide (shifted by the insertion)
    assert [b for b in bo if b >= 1014] == [b - 37 for b in bn if b >= 1051]
    # about one boundary per 64 tokens
    assert 3000 / 64 * 0.6 < len(bo) < 3000 / 64 * 1.6


def test_fast_opcodes_without_extension_is_chunk_aligned():
    rng = random.Random(3)
    old = rand_tokens(rng, 4000)
    new = old[:2000] + fresh(rng, 5) + old[2010:]
    bo, bn = set(cdc_bounds(old)), set(cdc_bounds(new))
    raw = fast_opcodes(old, new, extend=False)
    assert verify_opcodes(old, new, raw)
    for tag, i1, i2, j1, j2 in raw:
        if tag == "equal":
            assert {i1, i2} <= bo and {j1, j2} <= bn
    # extension recovers the exact edit
    assert fast_opcodes(old, new) == [
        ("equal", 0, 2000, 0, 2000), ("replace", 2000, 2010, 2000, 2005),
        ("equal", 2010, 4000, 2005, 3995),
    ]
    assert raw != fast_opcodes(old, new)


# ---------------------------------------------------------------------------- CDC path


def _edit_cases():
    """(id, old, new, expected ops) built from seeded random tokens; new text uses fresh ids."""
    rng = random.Random(2024)
    base = rand_tokens(rng, 6000)
    y1, y2, y3 = fresh(rng, 40), fresh(rng, 7), fresh(rng, 300)
    return [
        ("delete-middle", base, base[:3000] + base[3500:],
         [("equal", 0, 3000, 0, 3000), ("delete", 3000, 3500, 3000, 3000),
          ("equal", 3500, 6000, 3000, 5500)]),
        ("insert-middle", base, base[:2500] + y1 + base[2500:],
         [("equal", 0, 2500, 0, 2500), ("insert", 2500, 2500, 2500, 2540),
          ("equal", 2500, 6000, 2540, 6040)]),
        ("replace-middle", base, base[:4000] + y2 + base[4100:],
         [("equal", 0, 4000, 0, 4000), ("replace", 4000, 4100, 4000, 4007),
          ("equal", 4100, 6000, 4007, 5907)]),
        ("replace-one-token", base, base[:2048] + [99] + base[2049:],
         [("equal", 0, 2048, 0, 2048), ("replace", 2048, 2049, 2048, 2049),
          ("equal", 2049, 6000, 2049, 6000)]),
        ("several-edits", base,
         base[:1200] + y1 + base[1500:2600] + base[2650:4000] + y3 + base[4010:5990],
         [("equal", 0, 1200, 0, 1200), ("replace", 1200, 1500, 1200, 1240),
          ("equal", 1500, 2600, 1240, 2340), ("delete", 2600, 2650, 2340, 2340),
          ("equal", 2650, 4000, 2340, 3690), ("replace", 4000, 4010, 3690, 3990),
          ("equal", 4010, 5990, 3990, 5970), ("delete", 5990, 6000, 5970, 5970)]),
        ("append-tail", base[:3000], base[:3000] + y3,
         [("equal", 0, 3000, 0, 3000), ("insert", 3000, 3000, 3000, 3300)]),
    ]


@pytest.mark.parametrize("old, new, expected", [pytest.param(*c[1:], id=c[0]) for c in _edit_cases()])
def test_cdc_path_exact_and_reconstructs(old, new, expected):
    stats = {}
    ops, path = diff_with_path(old, new, stats=stats)
    assert path == "fastdiff"
    assert stats == {"fastdiff_ok": 1}
    assert ops == expected
    assert verify_opcodes(old, new, ops)
    assert apply_ops(old, new, ops) == new


def test_cdc_differs_from_difflib_on_swapped_blocks():
    """The CDC diff pairs chunks, not tokens: on a swap it may keep a different block (§6.1 end)."""
    rng = random.Random(0)
    a, b, c, d = (rand_tokens(rng, n) for n in (1500, 400, 300, 1200))
    old, new = a + b + c + d, a + c + b + d
    ops, path = diff_with_path(old, new, stats={})
    assert path == "fastdiff"
    assert ops == [
        ("equal", 0, 1500, 0, 1500), ("delete", 1500, 1900, 1500, 1500),
        ("equal", 1900, 2200, 1500, 1800), ("insert", 2200, 2200, 1800, 2200),
        ("equal", 2200, 3400, 2200, 3400),
    ]
    assert difflib_opcodes(old, new) == [
        ("equal", 0, 1500, 0, 1500), ("insert", 1500, 1500, 1500, 1800),
        ("equal", 1500, 1900, 1800, 2200), ("delete", 1900, 2200, 2200, 2200),
        ("equal", 2200, 3400, 2200, 3400),
    ]
    assert apply_ops(old, new, ops) == new


def test_authors_6_fast_path(monkeypatch):
    """§13.1 test 6: old = 0..4095, one token replaced at 2048."""
    calls = []
    real = sd.fast_opcodes

    def spy(old, new, **kw):
        calls.append((old, new))
        return real(old, new, **kw)

    monkeypatch.setattr(sd, "fast_opcodes", spy)
    old = list(range(4096))
    new = old[:2048] + [9999] + old[2049:]
    stats = {}
    ops = diff_opcodes(old, new, stats=stats)
    assert calls == [(old, new)]
    assert verify_opcodes(old, new, ops)
    assert any(op[0] != "equal" for op in ops)
    assert stats == {"fastdiff_ok": 1}
    assert ops == [("equal", 0, 2048, 0, 2048), ("replace", 2048, 2049, 2048, 2049),
                   ("equal", 2049, 4096, 2049, 4096)]


# ------------------------------------------------------- CDC: a gap before the first equal block


def spec_cdc_opcodes(old, new, target=64):
    """§6.1 steps 1-5 written out again for these tests (independent of ``scr.diff``).

    Step 5 as the authors' code does it: one cursor walks the equal blocks, and every gap it
    crosses (before the first block, between blocks, after the last) is replace when both
    sides are non-empty, else delete or insert.
    """
    def bounds(ids):
        out, h = [0], 0
        for k, t in enumerate(ids):
            h = ((h << 1) ^ (t * 0x9E3779B1 % 2**32)) % 2**32
            if (h >> 8) & (target - 1) == 0:
                out.append(k + 1)
        return out if out[-1] == len(ids) else out + [len(ids)]

    ob, nb = bounds(old), bounds(new)
    table = {}
    oc = [table.setdefault(tuple(old[a:b]), len(table)) for a, b in zip(ob, ob[1:])]
    nc = [table.setdefault(tuple(new[a:b]), len(table)) for a, b in zip(nb, nb[1:])]
    blocks = [[ob[a1], ob[a2], nb[b1], nb[b2]]
              for tag, a1, a2, b1, b2 in SequenceMatcher(None, oc, nc, autojunk=False).get_opcodes()
              if tag == "equal"]
    low_i = low_j = 0
    for blk in blocks:
        while blk[0] > low_i and blk[2] > low_j and old[blk[0] - 1] == new[blk[2] - 1]:
            blk[0] -= 1
            blk[2] -= 1
        low_i, low_j = blk[1], blk[3]
    high_i, high_j = len(old), len(new)
    for blk in reversed(blocks):
        while blk[1] < high_i and blk[3] < high_j and old[blk[1]] == new[blk[3]]:
            blk[1] += 1
            blk[3] += 1
        high_i, high_j = blk[0], blk[2]
    ops, i, j = [], 0, 0
    for i1, i2, j1, j2 in blocks + [[len(old), len(old), len(new), len(new)]]:
        if i1 > i or j1 > j:
            ops.append(("replace" if i1 > i and j1 > j else "delete" if i1 > i else "insert", i, i1, j, j1))
        if i2 > i1:
            ops.append(("equal", i1, i2, j1, j2))
        i, j = i2, j2
    return ops


def _leading_gap_cases():
    """(id, old, new, expected ops). The edit sits in the first chunk, so the first chunk-equal
    block starts after the edit and extension stops there (the edit's last tokens differ: old
    edits use ids 100000-149999, new ones 150000-199999). ``P`` is a short common prefix with
    no chunk boundary inside it, so no chunk before the edit is equal on both sides."""
    rng = random.Random(31)
    base = rand_tokens(rng, 3000)
    x, y = [rng.randrange(100000, 150000) for _ in range(20)], [rng.randrange(150000, 200000) for _ in range(30)]
    p5, p40 = base[-5:], base[-45:-5]
    return [
        ("replace-at-start", x + base, y + base,
         [("replace", 0, 20, 0, 30), ("equal", 20, 3020, 30, 3030)]),
        ("delete-at-start", x + base, base,
         [("delete", 0, 20, 0, 0), ("equal", 20, 3020, 0, 3000)]),
        ("insert-at-start", base, y + base,
         [("insert", 0, 0, 0, 30), ("equal", 0, 3000, 30, 3030)]),
        ("one-token-at-start", x[:1] + base[1:], y[:1] + base[1:],
         [("replace", 0, 1, 0, 1), ("equal", 1, 3000, 1, 3000)]),
        # The leading replace swallows the 5 common tokens before the edit (difflib keeps them).
        ("short-common-prefix-swallowed", p5 + x + base, p5 + y + base,
         [("replace", 0, 25, 0, 35), ("equal", 25, 3025, 35, 3035)]),
        ("40-common-tokens-swallowed", p40 + x + base, p40 + y + base,
         [("replace", 0, 60, 0, 70), ("equal", 60, 3060, 70, 3070)]),
        ("plus-an-edit-in-the-middle", x + base[:1500] + base[1600:], y + base,
         [("replace", 0, 20, 0, 30), ("equal", 20, 1520, 30, 1530), ("insert", 1520, 1520, 1530, 1630),
          ("equal", 1520, 2920, 1630, 3030)]),
        # No chunk in common: the gap before the (absent) first block is the whole input.
        ("no-equal-chunk", [rng.randrange(100000, 150000) for _ in range(2100)],
         [rng.randrange(150000, 200000) for _ in range(2100)], [("replace", 0, 2100, 0, 2100)]),
    ]


@pytest.mark.parametrize("old, new, expected", [pytest.param(*c[1:], id=c[0]) for c in _leading_gap_cases()])
def test_cdc_gap_before_the_first_equal_block(old, new, expected):
    assert min(len(old), len(new)) >= sd.FASTDIFF_MIN  # the CDC path applies
    assert spec_cdc_opcodes(old, new) == expected  # the case is what its id says
    stats = {}
    ops, path = diff_with_path(old, new, stats=stats)
    assert ops == expected
    assert (path, stats) == ("fastdiff", {"fastdiff_ok": 1})  # accepted by the verifier, no difflib
    assert verify_opcodes(old, new, ops)
    assert apply_ops(old, new, ops) == new


def test_swallowed_common_prefix_means_no_plan():
    """Where the CDC ops start with a replace the spec builds no plan (§6.5 "Built only when"),
    although difflib's ops would start with a 5-token equal run and relocate the rest."""
    case = {c[0]: c for c in _leading_gap_cases()}["short-common-prefix-swallowed"]
    old, new = case[1], case[2]
    assert difflib_opcodes(old, new)[0] == ("equal", 0, 5, 0, 5)
    assert plan_blocks(old, new, side_ids=old) == (None, [])
    assert plan_blocks(old, new, side_ids=old, ops=difflib_opcodes(old, new))[1] != []


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"seed{s}")
def test_cdc_path_equals_the_spec_algorithm_on_random_edits(seed):
    """Random edits anywhere (including inside the first and the last chunk) on a small vocabulary,
    so chunks and runs repeat: the CDC answer is the spec's, and the verifier accepts it."""
    rng = random.Random(seed)
    old = [rng.randrange(40) for _ in range(2300)]
    new = list(old)
    for _ in range(rng.randrange(1, 5)):
        at = rng.choice([rng.randrange(0, 64), rng.randrange(len(new)), len(new) - rng.randrange(1, 64)])
        new[at:at + rng.randrange(0, 30)] = [rng.randrange(40) for _ in range(rng.randrange(0, 30))]
    stats = {}
    ops, path = diff_with_path(old, new, fastdiff_min=2000, stats=stats)
    assert ops == spec_cdc_opcodes(old, new)
    assert (path, stats) == ("fastdiff", {"fastdiff_ok": 1})


# ----------------------------------------------------------------------- verifier / fallback


# verify_opcodes (§6.1 step 6) accepts ops iff they start at (0, 0), are contiguous on both sides
# (each op starts where the previous one ended, on the old *and* the new side), end at
# (len(old), len(new)), and every equal op's old and new tokens are the same. Each refusal case
# below breaks exactly one condition where possible; the comment names the check that alone
# refuses it, so removing that check from verify_opcodes makes the case fail.
OLD, NEW = [1, 2, 3], [1, 9, 3]
DIFFLIB_OPS = [("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2), ("equal", 2, 3, 2, 3)]

VERIFIER_ACCEPTS = [
    pytest.param(OLD, NEW, DIFFLIB_OPS, id="difflib-ops"),
    pytest.param(OLD, NEW, [("replace", 0, 3, 0, 3)], id="one-replace"),
    pytest.param([], [], [], id="both-empty-no-ops"),
    pytest.param([], [4, 5], [("insert", 0, 0, 0, 2)], id="all-inserted"),
    pytest.param([4, 5], [], [("delete", 0, 2, 0, 0)], id="all-deleted"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], [("equal", 0, 3, 0, 3), ("insert", 3, 3, 3, 4)], id="append"),
    # Back-to-back equal ops are not merged by the CDC path (module docstring, interpretation 2).
    pytest.param([1, 2, 3], [1, 2, 3], [("equal", 0, 1, 0, 1), ("equal", 1, 3, 1, 3)], id="adjacent-equal-ops"),
]

VERIFIER_REFUSES = [
    # -- the end: i == len(old) and j == len(new)
    pytest.param(OLD, NEW + [4], DIFFLIB_OPS, id="covers-old-stops-short-of-new"),        # j == len(new)
    pytest.param(OLD + [4], NEW, DIFFLIB_OPS, id="covers-new-stops-short-of-old"),        # i == len(old)
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2)], id="short-end-both"),
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 1, 4, 1, 3)], id="overruns-old"),  # i == len(old)
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 1, 3, 1, 4)], id="overruns-new"),  # j == len(new)
    pytest.param([1], [], [], id="no-ops-but-old"),
    pytest.param([], [1], [], id="no-ops-but-new"),
    pytest.param(OLD, NEW, [], id="no-ops-both-non-empty"),
    # -- the start and contiguity: i1 == i and j1 == j
    pytest.param(OLD, NEW, [("replace", 1, 2, 1, 2), ("equal", 2, 3, 2, 3)], id="not-from-origin"),
    pytest.param([5, 1, 2], [1, 2], [("equal", 1, 3, 0, 2)], id="not-from-origin-old-only"),   # i1 == i
    pytest.param([1, 2], [5, 1, 2], [("equal", 0, 2, 1, 3)], id="not-from-origin-new-only"),   # j1 == j
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("equal", 2, 3, 2, 3)], id="gap-both"),
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 2, 3, 1, 3)], id="skips-part-of-old"),  # i1 == i
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 1, 3, 2, 3)], id="skips-part-of-new"),  # j1 == j
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 0, 2, 1, 2), ("equal", 2, 3, 2, 3)],
                 id="overlap-old"),                                                                 # i1 == i
    pytest.param(OLD, NEW, [("equal", 0, 1, 0, 1), ("replace", 1, 2, 0, 2), ("equal", 2, 3, 2, 3)],
                 id="overlap-new"),                                                                 # j1 == j
    pytest.param(OLD, NEW, DIFFLIB_OPS[::-1], id="out-of-order"),
    pytest.param(OLD, NEW, [DIFFLIB_OPS[0], DIFFLIB_OPS[2], DIFFLIB_OPS[1]], id="swapped-ops"),
    pytest.param(OLD, NEW, DIFFLIB_OPS + [DIFFLIB_OPS[2]], id="op-repeated"),
    # -- equal ops must be truly equal
    pytest.param(OLD, NEW, [("equal", 0, 3, 0, 3)], id="false-equality"),
    pytest.param([1, 2, 3, 4], [1, 9, 3, 5], [("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2), ("equal", 2, 4, 2, 4)],
                 id="last-equal-op-differs-in-its-last-token"),
    pytest.param([1, 2], [1, 2, 3], [("equal", 0, 2, 0, 3)], id="equal-op-of-unequal-lengths"),
    pytest.param([7, 7], [7, 8], [("equal", 0, 1, 0, 1), ("equal", 1, 2, 1, 2)], id="second-equal-op-differs"),
]


@pytest.mark.parametrize("old, new, ops", VERIFIER_ACCEPTS)
def test_verifier_accepts(old, new, ops):
    assert verify_opcodes(old, new, ops) is True


@pytest.mark.parametrize("old, new, ops", VERIFIER_REFUSES)
def test_verifier_refuses(old, new, ops):
    assert verify_opcodes(old, new, ops) is False


@pytest.mark.parametrize("seed", range(20), ids=lambda s: f"seed{s}")
def test_verifier_accepts_difflib_and_refuses_each_truncation(seed):
    """Difflib's own ops always pass; dropping the last op or shifting any op's start never does."""
    rng = random.Random(seed)
    old = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
    new = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
    ops = difflib_opcodes(old, new)
    assert verify_opcodes(old, new, ops) is True
    assert verify_opcodes(old, new, ops[:-1]) is False
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        for shifted in ((tag, i1 + 1, i2, j1, j2), (tag, i1, i2, j1 + 1, j2)):
            assert verify_opcodes(old, new, ops[:k] + [shifted] + ops[k + 1:]) is False


def test_authors_7_false_equality_falls_back(monkeypatch, caplog):
    """§13.1 test 7: mocked fast diff claims [1,2,3] == [1,9,3]; minimum 0."""
    calls = []

    def lying(old, new, **kw):
        calls.append((old, new))
        return [("equal", 0, 3, 0, 3)]

    monkeypatch.setattr(sd, "fast_opcodes", lying)
    stats = {}
    with caplog.at_level(logging.DEBUG, logger="scr.diff"):
        ops, path = diff_with_path([1, 2, 3], [1, 9, 3], fastdiff_min=0, stats=stats)
    assert ops == [("equal", 0, 1, 0, 1), ("replace", 1, 2, 1, 2), ("equal", 2, 3, 2, 3)]
    assert path == "fallback"
    assert len(calls) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "fastdiff rejected by verifier [n=1]; falling back to difflib"]
    assert stats == {"fastdiff_reject": 1}


@pytest.mark.parametrize(
    "behaviour, messages",
    [
        pytest.param("none", ["fastdiff rejected by verifier [n=1]; falling back to difflib"],
                     id="returns-none"),
        pytest.param("raise", ["fastdiff failed (RuntimeError('boom')); using difflib",
                               "fastdiff rejected by verifier [n=1]; falling back to difflib"],
                     id="raises"),
    ],
)
def test_fast_diff_none_or_exception_falls_back(behaviour, messages, monkeypatch, caplog):
    def broken(old, new, **kw):
        if behaviour == "raise":
            raise RuntimeError("boom")
        return None

    monkeypatch.setattr(sd, "fast_opcodes", broken)
    rng = random.Random(5)
    old = rand_tokens(rng, 3000)
    new = old[:1000] + fresh(rng, 3) + old[1000:]
    stats = {}
    with caplog.at_level(logging.DEBUG, logger="scr.diff"):
        ops, path = diff_with_path(old, new, stats=stats)
    assert path == "fallback"
    assert ops == difflib_opcodes(old, new)
    assert stats == {"fastdiff_reject": 1}
    assert [r.getMessage() for r in caplog.records] == messages


def test_reject_log_every_50(monkeypatch, caplog):
    monkeypatch.setattr(sd, "fast_opcodes", lambda old, new, **kw: None)
    stats = {}
    with caplog.at_level(logging.DEBUG, logger="scr.diff"):
        for _ in range(101):
            diff_opcodes([1], [2], fastdiff_min=0, stats=stats)
    assert stats == {"fastdiff_reject": 101}
    assert [r.getMessage() for r in caplog.records] == [
        f"fastdiff rejected by verifier [n={n}]; falling back to difflib" for n in (1, 51, 101)]


def test_module_stats_used_without_stats_arg(monkeypatch):
    monkeypatch.setattr(sd, "STATS", {})
    old = list(range(4096))
    diff_opcodes(old, old[:100] + [7] + old[101:])
    diff_opcodes([1, 2], [1, 3])
    assert sd.STATS == {"fastdiff_ok": 1}


# ------------------------------------------------------------------ §4.2 / §6.3 helpers


@pytest.mark.parametrize(
    "ops, counts, passthrough",
    [
        pytest.param([("equal", 0, 5, 0, 5), ("replace", 5, 7, 5, 10), ("equal", 7, 9, 10, 12)],
                     (7, 2, 5), False, id="replace-plans"),
        pytest.param([("equal", 0, 5, 0, 5), ("insert", 5, 5, 5, 8)], (5, 0, 3), True,
                     id="pure-append"),
        pytest.param([("equal", 0, 5, 0, 5), ("delete", 5, 8, 5, 5)], (5, 3, 0), True,
                     id="pure-deletion"),
        pytest.param([("replace", 0, 5, 0, 4)], (0, 5, 4), True, id="nothing-kept"),
        pytest.param([("equal", 0, 2, 0, 2), ("delete", 2, 4, 2, 2), ("equal", 4, 6, 2, 4),
                      ("insert", 6, 6, 4, 9)], (4, 2, 5), False, id="delete-and-insert"),
    ],
)
def test_edit_counts_and_passthrough(ops, counts, passthrough):
    assert edit_counts(ops) == counts
    assert is_passthrough(ops) is passthrough


@pytest.mark.parametrize(
    "ops, positions",
    [
        pytest.param([("equal", 0, 2, 0, 2), ("delete", 2, 4, 2, 2), ("insert", 4, 4, 2, 3),
                      ("equal", 4, 5, 3, 4)], [0, 1, 2, 3], id="mixed"),
        pytest.param([("delete", 0, 3, 0, 0)], [], id="all-deleted"),
        pytest.param([("replace", 0, 1, 0, 3)], [0, 1, 2], id="replace-grows"),
    ],
)
def test_new_positions(ops, positions):
    assert new_positions(ops) == positions
