"""``exact_cache``: the rules (cuts, hit rule, keep points), ``ExactConfig``, ``ExactPolicy.plan``
and the ``replay`` model, against hand-computed tables (``docs/exact.md`` §1, §5.4).

Unless a case says otherwise: B = 64 (piece), R = 256 (retention interval), S = 0 (spec drop).
Notation in the comments: L = prompt length, m = matched depth, A = resume bound, c* = resume,
e = largest cut <= L - 1, J = junction.
"""

from __future__ import annotations

import random

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from exact_cache.replay import ReplayTree, replay
from exact_cache.rules import KeepKind, cuts, floor_cut, keep_points, pieces, resume_bound, resume_point
from policy.api import Arrival, Read, Plan, Release, Snapshot
from tests.reference.exact_oracle import ExactOracle, expected_reuse

B, R = 64, 256
PER, END, JUN = KeepKind.PERIODIC, KeepKind.PROMPT_END, KeepKind.JUNCTION
END_BACK, JUN_BACK = KeepKind.PROMPT_END_BACK, KeepKind.JUNCTION_BACK


# ---------------------------------------------------------------------- cuts, floor_cut, pieces


@pytest.mark.parametrize(
    "prompt_len, expected",
    [
        pytest.param(1, [], id="L1-none"),
        pytest.param(64, [], id="L64-B-itself-is-not-inside"),
        pytest.param(65, [64], id="L65"),
        pytest.param(128, [64], id="L128-never-at-L"),
        pytest.param(129, [64, 128], id="L129"),
        pytest.param(300, [64, 128, 192, 256], id="L300"),
    ],
)
def test_cuts(prompt_len, expected):
    assert cuts(prompt_len, B) == expected


@pytest.mark.parametrize(
    "position, expected",
    [
        pytest.param(0, 0, id="0"),
        pytest.param(63, 0, id="63-below-first-cut"),
        pytest.param(64, 64, id="64-on-a-cut"),
        pytest.param(65, 64, id="65"),
        pytest.param(299, 256, id="299"),
        pytest.param(-1, 0, id="negative-is-0"),
        pytest.param(-64, 0, id="negative-cut-is-0"),
    ],
)
def test_floor_cut(position, expected):
    assert floor_cut(position, B) == expected


@pytest.mark.parametrize(
    "start, prompt_len, expected",
    [
        pytest.param(0, 150, [(0, 64), (64, 128), (128, 150)], id="from-0-with-tail"),
        pytest.param(64, 150, [(64, 128), (128, 150)], id="from-a-cut"),
        pytest.param(128, 150, [(128, 150)], id="from-the-last-cut-tail-only"),
        pytest.param(0, 128, [(0, 64), (64, 128)], id="exact-multiple-no-short-tail"),
        pytest.param(0, 1, [(0, 1)], id="one-token"),
        pytest.param(0, 64, [(0, 64)], id="one-full-piece"),
        pytest.param(128, 128, [], id="start-at-end-nothing-to-read"),
    ],
)
def test_pieces(start, prompt_len, expected):
    assert pieces(start, prompt_len, B) == expected


@pytest.mark.parametrize("start", [1, 63, 100, 65], ids=["1", "63", "100", "65"])
def test_pieces_rejects_a_start_that_is_not_a_cut(start):
    with pytest.raises(ValueError) as info:
        pieces(start, 300, B)
    assert str(info.value) == f"a read starts at 0 or at a cut, not at {start} (piece 64)"


# ---------------------------------------------------------------------- resume_bound (A)


@pytest.mark.parametrize(
    "matched, prompt_len, spec_drop, expected",
    [
        pytest.param(0, 300, 0, 0, id="nothing-matched"),
        pytest.param(63, 300, 0, 0, id="m-below-B"),
        pytest.param(64, 300, 0, 64, id="m-on-a-cut"),
        pytest.param(100, 300, 0, 64, id="m-mid-piece-floors"),
        pytest.param(299, 300, 0, 256, id="m=L-1-floors-to-e"),  # floor(299/64)*64 = 256
        pytest.param(256, 257, 0, 256, id="m=L-1-is-a-multiple-of-B"),  # 256 = 4*64, and 256 < 257
        pytest.param(255, 256, 0, 192, id="m=L-1-L-multiple-of-B"),  # L = 256: floor(255/64)*64 = 192
        pytest.param(1000, 300, 0, 256, id="m-past-L-1-capped"),  # min(1000, 299) = 299 -> 256
        pytest.param(256, 256, 0, 192, id="m=L-capped-to-L-1"),  # min(256, 255) = 255 -> 192
        pytest.param(0, 1, 0, 0, id="one-token-prompt"),
        pytest.param(299, 300, 1, 192, id="S1-drops-one-piece"),  # 256 - 64
        pytest.param(200, 300, 1, 128, id="S1-mid-piece"),  # 192 - 64
        pytest.param(64, 300, 1, 0, id="S1-A=B-drops-to-0"),  # 64 - 64
        pytest.param(100, 300, 1, 0, id="S1-A=B-after-floor"),  # floor(100) = 64, - 64
        pytest.param(63, 300, 1, 0, id="S1-never-below-0"),  # max(0, 0 - 64)
        pytest.param(1000, 300, 1, 192, id="S1-capped-then-dropped"),  # 256 - 64
    ],
)
def test_resume_bound(matched, prompt_len, spec_drop, expected):
    assert resume_bound(matched, prompt_len, B, spec_drop) == expected


# ---------------------------------------------------------------------- resume_point (c*)


@pytest.mark.parametrize(
    "bound, depths, expected",
    [
        pytest.param(256, (), 0, id="no-snapshots"),
        pytest.param(0, (64, 128), 0, id="bound-0"),
        pytest.param(128, (192, 256), 0, id="all-above-bound-ignored"),
        pytest.param(128, (64, 192, 256), 64, id="above-bound-ignored"),
        pytest.param(256, (64, 128), 128, id="deepest-chosen"),
        pytest.param(128, (128, 64), 128, id="at-bound-counts-order-irrelevant"),
        pytest.param(128, (0,), 0, id="0-ignored"),
        pytest.param(128, (0, 64), 64, id="0-ignored-beside-a-real-one"),
        pytest.param(256, [256, 192, 64], 256, id="list-input"),
    ],
)
def test_resume_point(bound, depths, expected):
    assert resume_point(bound, depths) == expected


def test_resume_point_accepts_a_generator():
    assert resume_point(200, (d for d in (64, 128, 256))) == 128


# ---------------------------------------------------------------------- keep_points


@pytest.mark.parametrize(
    "prompt_len, resume, bound, spec_drop, expected",
    [
        # L=600: periodic 256, 512; e = floor(599/64)*64 = 576.
        pytest.param(600, 0, 0, 0, {256: PER, 512: PER, 576: END}, id="cold-periodic-and-prompt-end"),
        # L=300: e = floor(299/64)*64 = 256 = R: one position, PERIODIC wins.
        pytest.param(300, 0, 0, 0, {256: PER}, id="periodic-only-prompt-end-coincides"),
        # L=513: periodic 256, 512; e = floor(512/64)*64 = 512 -> PERIODIC.
        pytest.param(513, 0, 0, 0, {256: PER, 512: PER}, id="prompt-end-on-second-periodic"),
        # resume 256: periodic 256 is not > c*; A = 256 is not > c*: no junction.
        pytest.param(600, 256, 256, 0, {512: PER, 576: END}, id="points-at-or-below-resume-dropped"),
        # A = 128 > c* = 0: junction at 128.
        pytest.param(600, 0, 128, 0, {128: JUN, 256: PER, 512: PER, 576: END}, id="junction"),
        pytest.param(600, 64, 192, 0, {192: JUN, 256: PER, 512: PER, 576: END}, id="junction-above-resume"),
        pytest.param(600, 128, 128, 0, {256: PER, 512: PER, 576: END}, id="junction-equal-resume-absent"),
        pytest.param(600, 0, 256, 0, {256: PER, 512: PER, 576: END}, id="junction-on-periodic-takes-periodic"),
        pytest.param(600, 64, 576, 0, {256: PER, 512: PER, 576: END}, id="junction-on-prompt-end-takes-end"),
        # L=400: periodic 256; e = floor(399/64)*64 = 384; e-B = 320; J = 192; J-B = 128.
        pytest.param(
            400, 0, 192, 1, {128: JUN_BACK, 192: JUN, 256: PER, 320: END_BACK, 384: END}, id="S1-back-points",
        ),
        # J-B = 128 is not > c* = 128.
        pytest.param(400, 128, 192, 1, {192: JUN, 256: PER, 320: END_BACK, 384: END}, id="S1-junction-back-at-resume"),
        # e-B = 320 is not > c* = 320; periodic 256 below; A = 320 not > c*: only e.
        pytest.param(400, 320, 320, 1, {384: END}, id="S1-prompt-end-back-at-resume"),
        # L=600, S=1: e-B = 512 is already periodic and stays PERIODIC.
        pytest.param(600, 0, 0, 1, {256: PER, 512: PER, 576: END}, id="S1-end-back-on-periodic"),
        # L=100: e = 64, e-B = 0 is never kept.
        pytest.param(100, 0, 0, 1, {64: END}, id="S1-end-back-0-dropped"),
        # S=1 and J = B: J-B = 0 is never kept.
        pytest.param(300, 0, 64, 1, {64: JUN, 192: END_BACK, 256: PER}, id="S1-junction-back-0-dropped"),
        pytest.param(50, 0, 0, 0, {}, id="shorter-than-B-empty"),
        pytest.param(50, 0, 0, 1, {}, id="shorter-than-B-empty-S1"),
        pytest.param(64, 0, 0, 0, {}, id="L=B-empty"),  # e = floor(63/64)*64 = 0
        pytest.param(65, 0, 0, 0, {64: END}, id="L=B+1"),
        # L=192: e = floor(191/64)*64 = 128 = L - B.
        pytest.param(192, 0, 0, 0, {128: END}, id="L-multiple-of-B-e=L-B"),
        # L=512: 512 is not below L so not periodic; e = 448 = L - B.
        pytest.param(512, 0, 0, 0, {256: PER, 448: END}, id="L=2R-no-periodic-at-L"),
        # A repeat: c* = e already, nothing new to keep.
        pytest.param(600, 576, 576, 0, {}, id="repeat-nothing-new"),
    ],
)
def test_keep_points(prompt_len, resume, bound, spec_drop, expected):
    found = keep_points(prompt_len, resume, bound, B, R, spec_drop)
    assert found == expected
    assert list(found) == sorted(expected)  # ascending positions
    assert all(type(kind) is KeepKind for kind in found.values())


def test_keep_kind_values():
    assert [kind.value for kind in KeepKind] == [
        "periodic", "prompt_end", "junction", "prompt_end_back", "junction_back", "message",
    ]


# ---------------------------------------------------------------------- ExactConfig


def test_config_defaults():
    config = ExactConfig()
    assert (config.piece_tokens, config.retain_every, config.spec_drop, config.max_snapshots) == (832, 6656, 0, 0)
    assert config.retain_every == 8 * config.piece_tokens


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(dict(piece_tokens=100), "piece_tokens=100: must be a positive multiple of 64", id="piece-100"),
        pytest.param(dict(piece_tokens=0), "piece_tokens=0: must be a positive multiple of 64", id="piece-0"),
        pytest.param(dict(piece_tokens=-64), "piece_tokens=-64: must be a positive multiple of 64", id="piece-neg"),
        pytest.param(
            dict(piece_tokens=64, retain_every=100),
            "retain_every=100: must be a positive multiple of piece_tokens=64",
            id="retain-not-multiple",
        ),
        pytest.param(
            dict(piece_tokens=192),  # 6656 / 192 = 34.67
            "retain_every=6656: must be a positive multiple of piece_tokens=192",
            id="default-retain-not-multiple-of-192",
        ),
        pytest.param(
            dict(piece_tokens=64, retain_every=0),
            "retain_every=0: must be a positive multiple of piece_tokens=64",
            id="retain-0",
        ),
        pytest.param(dict(spec_drop=2), "spec_drop=2: must be 0 or 1", id="spec-drop-2"),
        pytest.param(dict(spec_drop=-1), "spec_drop=-1: must be 0 or 1", id="spec-drop-neg"),
        pytest.param(
            dict(max_snapshots=-1),
            "max_snapshots=-1: must be >= 0 (0 = SGLang's pool sizing)",
            id="max-snapshots-negative",
        ),
    ],
)
def test_config_rejects(kwargs, message):
    with pytest.raises(ValueError) as info:
        ExactConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(piece_tokens=64, retain_every=64), id="R=B"),
        pytest.param(dict(piece_tokens=128, retain_every=6656), id="default-R-with-128"),
        pytest.param(dict(spec_drop=1, max_snapshots=2), id="S1-budget-2"),
    ],
)
def test_config_accepts(kwargs):
    config = ExactConfig(**kwargs)
    for key, value in kwargs.items():
        assert getattr(config, key) == value


# ---------------------------------------------------------------------- ExactPolicy


def policy(spec_drop: int = 0) -> ExactPolicy:
    return ExactPolicy(ExactConfig(piece_tokens=B, retain_every=R, spec_drop=spec_drop))


def arrival(prompt_len: int, matched: int = 0, states: tuple[int, ...] = (), rid: str = "r") -> Arrival:
    return Arrival(
        rid=rid, tokens=tuple(range(prompt_len)), cache_key=None, tree_hit=max(states, default=0),
        tree_match=matched, tree_states=states,
    )


COLD_600 = Plan(
    rid="r",
    resume=0,
    steps=(
        Read(0, 64), Read(64, 128), Read(128, 192), Read(192, 256),
        Snapshot(256, "periodic"),
        Read(256, 320), Read(320, 384), Read(384, 448), Read(448, 512),
        Snapshot(512, "periodic"),
        Read(512, 576),
        Snapshot(576, "prompt_end"),  # e = floor(599/64)*64
        Read(576, 600),  # the tail: runs for logits, never kept
    ),
)

# m = 400 -> A = 384; the tree's deepest state <= 384 is 256 -> c* = 256; J = 384 > 256.
RESUMED_600 = Plan(
    rid="r",
    resume=256,
    steps=(
        Read(256, 320), Read(320, 384),
        Snapshot(384, "junction"),
        Read(384, 448), Read(448, 512),
        Snapshot(512, "periodic"),
        Read(512, 576),
        Snapshot(576, "prompt_end"),
        Read(576, 600),
    ),
)

# S = 1, the tree after a cold S=1 read of the same prompt: KV [0, 576), states 256, 512, 576.
# m = 576 -> A = 576 - 64 = 512 -> c* = 512; keep > 512: e = 576 (e - B = 512 is not > c*).
REPEAT_600_S1 = Plan(rid="r", resume=512, steps=(Read(512, 576), Snapshot(576, "prompt_end"), Read(576, 600)))


@pytest.mark.parametrize(
    "spec_drop, incoming, expected",
    [
        pytest.param(0, arrival(600), COLD_600, id="cold-600"),
        pytest.param(0, arrival(600, matched=400, states=(128, 256)), RESUMED_600, id="resumed-junction"),
        pytest.param(1, arrival(600, matched=576, states=(256, 512, 576)), REPEAT_600_S1, id="S1-repeat"),
        # m = 599 (a repeat after a read that kept 576): c* = 576, only the tail is read.
        pytest.param(
            0, arrival(600, matched=576, states=(256, 512, 576)), Plan("r", 576, (Read(576, 600),)),
            id="repeat-tail-only",
        ),
        # A state deeper than A is on the path but unusable: m = 300 -> A = 256; 320 ignored.
        pytest.param(
            0, arrival(400, matched=300, states=(64, 320)),
            Plan("r", 64, (
                Read(64, 128), Read(128, 192), Read(192, 256), Snapshot(256, "periodic"),
                Read(256, 320), Read(320, 384), Snapshot(384, "prompt_end"), Read(384, 400),
            )),
            id="state-above-A-ignored",
        ),
        pytest.param(0, arrival(50), Plan("r", 0, (Read(0, 50),)), id="shorter-than-B"),
        pytest.param(0, arrival(1), Plan("r", 0, (Read(0, 1),)), id="one-token"),
    ],
)
def test_exact_plan(spec_drop, incoming, expected):
    plan = policy(spec_drop).plan(incoming)
    assert plan == expected
    plan.validate(len(incoming.tokens))


def test_exact_plan_ignores_tree_hit():
    """Only ``tree_match`` and ``tree_states`` matter; ``tree_hit`` is the engine's own answer."""
    base = arrival(600)
    other = Arrival(rid="r", tokens=base.tokens, cache_key="salt", tree_hit=300)
    assert policy().plan(other) == COLD_600


def test_plan_snapshots_and_forwards():
    assert COLD_600.snapshots() == {256: "periodic", 512: "periodic", 576: "prompt_end"}
    assert COLD_600.forwards() == [
        (0, 64), (64, 128), (128, 192), (192, 256), (256, 320), (320, 384), (384, 448), (448, 512),
        (512, 576), (576, 600),
    ]
    assert Plan("r", 5, ()).snapshots() == {} and Plan("r", 5, ()).forwards() == []


@pytest.mark.parametrize(
    "plan, prompt_len, message",
    [
        pytest.param(
            Plan("r", 0, (Snapshot(0, "periodic"), Read(0, 64))), 64,
            "plan r: snapshot at 0 is not within the read forward before it", id="snapshot-before-any-read",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 64), Snapshot(96, "periodic"), Read(64, 100))), 100,
            "plan r: snapshot at 96 is not within the read forward before it", id="snapshot-past-the-read",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 64), Read(64, 100), Snapshot(32, "periodic"))), 100,
            "plan r: snapshot at 32 is not within the read forward before it", id="snapshot-in-an-earlier-read",
        ),
        pytest.param(
            Plan("r", 64, (Read(64, 128), Snapshot(64, "junction"), Read(128, 150))), 150,
            "plan r: snapshot at 64 is not within the read forward before it", id="snapshot-at-the-read-start",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 256), Snapshot(192, "message"), Snapshot(128, "message"), Read(256, 300))), 300,
            "plan r: snapshot at 128 is not within the read forward before it", id="snapshots-descending",
        ),
        pytest.param(
            Plan("r", 0, (Read(0, 256), Snapshot(128, "message"), Snapshot(128, "periodic"), Read(256, 300))), 300,
            "plan r: snapshot at 128 is not within the read forward before it", id="two-at-one-position",
        ),
        pytest.param(
            Plan("r", 64, (Snapshot(64, "junction"), Read(64, 100))), 100,
            "plan r: snapshot at 64 is not within the read forward before it", id="snapshot-at-resume",
        ),
    ],
)
def test_validate_rejects_misplaced_snapshots(plan, prompt_len, message):
    with pytest.raises(ValueError) as info:
        plan.validate(prompt_len)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param((Read(0, 64), Snapshot(64, "periodic"), Read(64, 100)), id="at-the-end"),
        pytest.param((Read(0, 64), Snapshot(32, "periodic"), Read(64, 100)), id="inside"),
        pytest.param((Read(0, 64), Snapshot(1, "periodic"), Read(64, 100)), id="just-past-the-start"),
        pytest.param((Read(0, 100), Snapshot(64, "message"), Snapshot(99, "prompt_end"), Snapshot(100, "periodic")),
                     id="several-ascending-up-to-the-prompt-end"),
        pytest.param((Read(0, 64), Snapshot(64, "message"), Read(64, 100), Snapshot(70, "junction"),
                      Snapshot(80, "prompt_end")), id="one-read-each"),
    ],
)
def test_validate_accepts_snapshots_within_the_read_before_them(steps):
    """``keeps=inside``: a state kept inside a forward, several per forward, ascending."""
    plan = Plan("r", 0, steps)
    assert plan.validate(100) is None
    assert plan.forwards() == [(s.start, s.end) for s in steps if isinstance(s, Read)]
    assert plan.snapshots() == {s.at: s.kind for s in steps if isinstance(s, Snapshot)}


def test_server_settings_exact():
    assert policy().server_settings() == {
        "chunked_prefill_size": 64,
        "prefill_max_requests": 1,
        "enable_mixed_chunk": False,
        "page_size": 1,
        "mamba_radix_cache_strategy": "no_buffer",
        "disable_overlap_schedule": True,
        "radix_cache_backend": "exact",
    }
    assert ExactPolicy(ExactConfig()).server_settings()["chunked_prefill_size"] == 832


def test_exact_policy_is_stateless():
    exact = policy()
    assert ExactPolicy.name == "exact"
    assert ExactPolicy.config_class is ExactConfig
    assert exact.release(Release(rid="r", prompt_tokens=5, decode_tokens=2)) is None
    assert exact.check() is None
    assert exact.plan(arrival(600)) == exact.plan(arrival(600)) == COLD_600


# ---------------------------------------------------------------------- replay: scripted traces


def text(start: int, n: int) -> list[int]:
    """n distinct tokens; different ``start`` values give disjoint texts."""
    return list(range(start, start + n))


def edit(prompt: list[int], position: int, token: int) -> list[int]:
    changed = list(prompt)
    changed[position] = token
    return changed


P200 = text(1000, 200)  # e = floor(199/64)*64 = 192: keeps {192}, text [0, 192)
P300 = text(1000, 300)  # e = 256 = R: keeps {256}, text [0, 256)
P256 = text(1000, 256)  # L = 4B: e = floor(255/64)*64 = 192 = L - B
SYSTEM = text(5000, 100)  # a shared system prompt

U1, A1, U2, A2, U3 = text(1000, 150), text(2000, 50), text(3000, 100), text(4000, 40), text(6000, 110)
TURN1 = U1  # L = 150
TURN2 = U1 + A1 + U2  # L = 300: the answer A1 was never cached (decode output)
TURN3 = TURN2 + A2 + U3  # L = 450

X1, Y1 = text(10000, 150), text(20000, 150)
X2, Y2 = X1 + text(11000, 150), Y1 + text(21000, 150)


@pytest.mark.parametrize(
    "prompts, spec_drop, expected",
    [
        # 2nd: m = 192 (text [0,192)), A = 192, state at 192.
        pytest.param([P200, P200], 0, [0, 192], id="repeat"),
        pytest.param([P300, P300], 0, [0, 256], id="repeat-end-on-periodic"),
        # 2nd (L=300): m = 192, A = 192, c* = 192; keeps 256. 3rd (L=400): m = 256 -> 256.
        pytest.param([P200, P300, text(1000, 400)], 0, [0, 192, 256], id="append-twice"),
        # edit at 100: m = 100, A = 64, no state <= 64 -> 0 (leaves junction 64).
        pytest.param([P200, edit(P200, 100, -1)], 0, [0, 0], id="edit-mid-piece"),
        # the same edit again: m = 100, A = 64, the junction state at 64 -> 64.
        pytest.param([P200, edit(P200, 100, -1), edit(P200, 100, -2)], 0, [0, 0, 64], id="edit-twice-hits-junction"),
        # back to the original: m = 192 (P200's own text), c* = 192.
        pytest.param([P200, edit(P200, 100, -1), P200], 0, [0, 0, 192], id="edit-then-original"),
        # edit at the cut 128: m = 128, A = 128, no state <= 128 -> 0; junction 128; again -> 128.
        pytest.param(
            [P200, edit(P200, 128, -1), edit(P200, 128, -2)], 0, [0, 0, 128], id="edit-at-a-cut-twice",
        ),
        # P300 kept 256: an edit at 256 matches 256 tokens -> A = 256 -> c* = 256.
        pytest.param([P300, edit(P300, 256, -1)], 0, [0, 256], id="edit-at-a-cut-with-state"),
        pytest.param([P300, edit(P300, 257, -1)], 0, [0, 256], id="edit-just-after-a-state"),
        # edit at 255: m = 255, A = 192, no state at or below 192 -> 0.
        pytest.param([P300, edit(P300, 255, -1)], 0, [0, 0], id="edit-just-before-a-state"),
        # L = 256 = 4B: the first read keeps e = 192 = L - B; the repeat hits it.
        pytest.param([P256, P256], 0, [0, 192], id="exact-multiple-of-B-repeat"),
        # turn2: m = 128 (turn1 kept e = floor(149/64)*64 = 128) -> 128; keeps 256.
        # turn3: m = 256 -> 256.
        pytest.param([TURN1, TURN2, TURN3], 0, [0, 128, 256], id="three-turns"),
        pytest.param([X1, Y1, X2, Y2], 0, [0, 0, 128, 128], id="two-interleaved-sessions"),
        # X1 keeps 192; Y1: m = 100 (shared system prompt), A = 64 -> 0, leaves junction 64;
        # X2, Y2 append to their own first turns -> 192; Z1: m = 100 -> the junction 64.
        pytest.param(
            [SYSTEM + text(10000, 100), SYSTEM + text(20000, 100), SYSTEM + text(10000, 200),
             SYSTEM + text(20000, 200), SYSTEM + text(30000, 100)],
            0, [0, 0, 192, 192, 64], id="sessions-sharing-a-system-prompt",
        ),
        # S = 1: the first read keeps 192 and 128 (e - B); the repeat: A = 192 - 64 = 128.
        pytest.param([P200, P200], 1, [0, 128], id="S1-repeat"),
        # S = 1, L = 256: keeps 192 and 128; repeat: m = 192, A = 128.
        pytest.param([P256, P256], 1, [0, 128], id="S1-exact-multiple-of-B-repeat"),
        # S = 1, edit at 100: A = 64 - 64 = 0 twice; the junction never forms (A = 0).
        pytest.param([P200, edit(P200, 100, -1), edit(P200, 100, -2)], 1, [0, 0, 0], id="S1-edit-mid-piece-twice"),
        # S = 1, edit at 150: m = 150, A = 128 - 64 = 64; P200 kept 128, 192 only -> 0; junction 64.
        # again: A = 64, the junction state -> 64.
        pytest.param([P200, edit(P200, 150, -1), edit(P200, 150, -2)], 1, [0, 0, 64], id="S1-edit-twice-hits-junction"),
        # S = 1 turns: turn1 keeps 128, 64. turn2: m = 128, A = 64 -> 64; keeps 192 (e-B), 256.
        # turn3: m = 256, A = 192 -> 192.
        pytest.param([TURN1, TURN2, TURN3], 1, [0, 64, 192], id="S1-three-turns"),
    ],
)
def test_replay(prompts, spec_drop, expected):
    assert replay(prompts, piece=B, retain_every=R, spec_drop=spec_drop) == expected


@pytest.mark.parametrize(
    "prompts, spec_drop, expected_keeps",
    [
        pytest.param([P200, P200], 0, [{192: END}, {}], id="repeat"),
        pytest.param([P200, edit(P200, 100, -1)], 0, [{192: END}, {64: JUN, 192: END}], id="edit-leaves-junction"),
        pytest.param(
            [TURN1, TURN2, TURN3], 1,
            # turn3 resumes at 192, below the state 256 that turn2 kept: 256 is read and kept again.
            [{64: END_BACK, 128: END}, {192: END_BACK, 256: PER}, {256: PER, 384: END_BACK, 448: END}],
            id="S1-three-turns",
        ),
    ],
)
def test_replay_tree_keep_points(prompts, spec_drop, expected_keeps):
    tree = ReplayTree(B, R, spec_drop)
    assert [tree.serve(prompt)[1] for prompt in prompts] == expected_keeps


def test_replay_tree_holds_text_to_the_deepest_keep_point():
    tree = ReplayTree(B, R)
    tree.serve(P200)
    tree.serve(edit(P200, 100, -1))
    assert tree.texts == [tuple(P200[:192]), tuple(edit(P200, 100, -1)[:192])]
    assert set(tree.snapshots) == {tuple(P200[:192]), tuple(P200[:64]), tuple(edit(P200, 100, -1)[:192])}


# ---------------------------------------------------------------------- replay: brute-force cross-check


def random_trace(rng: random.Random) -> list[list[int]]:
    """Short prompts over 3 symbols, often built from an earlier prompt so prefixes collide."""
    prompts: list[list[int]] = []
    for _ in range(rng.randint(1, 8)):
        if prompts and rng.random() < 0.7:
            base = list(rng.choice(prompts))
            cut = rng.randint(0, len(base))
            prompt = base[:cut] + [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        else:
            prompt = [rng.randrange(3) for _ in range(rng.randint(1, 40))]
        prompts.append(prompt[:40] or [rng.randrange(3)])
    return prompts


@pytest.mark.parametrize("piece, retain", [(4, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("spec_drop", [0, 1], ids=["S0", "S1"])
def test_replay_matches_the_brute_force_oracle(spec_drop, piece, retain):
    """``replay`` (the product's predictor, built on ``exact_cache.rules``) against the oracle the
    engine tests use (``tests/reference/exact_oracle.py``: the spec's rules tried position by
    position, no repo imports), on random traces whose prompts reuse, edit and cap each other."""
    rng = random.Random(20240611 + spec_drop + 100 * retain)
    checked = hits = capped = 0
    for _ in range(150):
        prompts = random_trace(rng)
        caps = [rng.choice([None, None, rng.randint(0, len(p) + 2)]) for p in prompts]
        tree, oracle = ReplayTree(piece, retain, spec_drop), ExactOracle(piece, retain, spec_drop)
        for prompt, cap in zip(prompts, caps):
            resume, keep = tree.serve(prompt, cap)
            expected = oracle.serve(prompt, cap)
            assert (resume, sorted(keep)) == expected, (prompts, caps)
            assert resume % piece == 0 and resume < len(prompt)
            hits += resume > 0
            capped += cap is not None and cap < len(prompt) - 1
        assert replay(prompts, piece=piece, retain_every=retain, spec_drop=spec_drop, caps=caps) == \
            expected_reuse(prompts, piece=piece, retain_every=retain, spec_drop=spec_drop, caps=caps)
        checked += len(prompts)
    assert checked > 400 and hits > 80 and capped > 50  # the traces exercise reuse and caps, not just cold reads


def test_replay_with_a_match_cap():
    """A cold 300-token read keeps one snapshot, at 256 (B = 64, R = 256). Read again, the prompt
    resumes there; capped at 100 (a request asking for prompt logprobs from 100), no snapshot lies
    within reach and it resumes at 0; a cap beyond the usual len - 1 changes nothing."""
    prompt = list(range(300))
    assert replay([prompt, prompt], piece=B, retain_every=R) == [0, 256]
    assert replay([prompt, prompt], piece=B, retain_every=R, caps=[None, 100]) == [0, 0]
    assert replay([prompt, prompt], piece=B, retain_every=R, caps=[None, 299]) == [0, 256]
    with pytest.raises(ValueError, match="1 caps for 2 prompts"):
        replay([prompt, prompt], piece=B, retain_every=R, caps=[None])
