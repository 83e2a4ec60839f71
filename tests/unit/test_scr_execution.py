"""scr/execution.py: SCR's plan as ``policy.api`` steps, and the rules its step carrier asks."""

from __future__ import annotations

import pytest

from policy.api import Read, Plan, Relocate, Restore
from scr.cursor import RelocationCursor
from scr.execution import (Counters, RelocationProgress, blocks_of, chunk_admission, evict_amount, evict_floor,
                           new_cursor, plan_gate, relocation_plan, relocation_refusal, snapshot_at_prefill_end,
                           state_at_release)
from patches.request_book import TrackedRequest, accounting, request_event
from scr.gates import Gate
from scr.intercept import Intercept
from scr.planner import Block
from scr.sessions import SessionAdmission, MatchReport, Session
from scr.settings import ScrConfig

BLOCK = Block(old_start=1700, new_start=1500, num_rows=1284, n_c=1300, new_end=2800)


@pytest.mark.parametrize(
    "rows, slot, full_len, prefix, arm_restore, can_restore, expected",
    [
        pytest.param(100, 0, 1000, 500, False, False, None, id="ok"),
        pytest.param(100, 0, 601, 500, True, True, None, id="ok-one-token-left-with-restore"),
        pytest.param(0, 0, 1000, 500, False, False, "nothing to splice (rows=0 slot=0 left=500)", id="no-rows"),
        pytest.param(100, None, 1000, 500, False, False, "nothing to splice (rows=100 slot=None left=400)",
                     id="no-slot"),
        pytest.param(100, 0, 600, 500, False, False, "nothing to splice (rows=100 slot=0 left=0)",
                     id="nothing-left-for-logits"),
        pytest.param(100, 0, 1000, 500, True, False, "no state slot to restore into", id="restore-without-slot"),
    ],
)
def test_relocation_refusal(rows, slot, full_len, prefix, arm_restore, can_restore, expected):
    assert relocation_refusal(rows, slot, full_len, prefix, arm_restore, can_restore) == expected


@pytest.mark.parametrize(
    "extend_end, stop, chunk_slot_free, expected",
    [
        pytest.param(1500, 1500, True, None, id="ends-at-stop"),
        pytest.param(1200, 1500, True, None, id="middle-chunk"),
        pytest.param(1501, 1500, True, "admitted extend ends at 1501 > |A|+|B'| 1500", id="past-stop"),
        pytest.param(1500, 1500, False, "another request became the chunked request", id="chunk-taken"),
        pytest.param(1600, 1500, False, "admitted extend ends at 1600 > |A|+|B'| 1500", id="past-stop-first"),
    ],
)
def test_chunk_admission(extend_end, stop, chunk_slot_free, expected):
    assert chunk_admission(extend_end, stop, chunk_slot_free) == expected


@pytest.mark.parametrize(
    "need, available, evictable, floor, margin, expected",
    [
        pytest.param(1000, 200, 5000, 2000, 2048, 2848, id="evict-shortfall-plus-margin"),
        pytest.param(1000, 200, 2800, 2000, 2048, 2848, id="exactly-at-floor"),
        pytest.param(1000, 200, 2799, 2000, 2048, None, id="below-floor-declined"),
        pytest.param(1000, 0, 0, 0, 0, None, id="nothing-evictable"),
    ],
)
def test_evict_amount(need, available, evictable, floor, margin, expected):
    assert evict_amount(need, available, evictable, floor, margin) == expected


@pytest.mark.parametrize("size, frac, expected", [(10000, 0.2, 2000), (999, 0.2, 199), (10, 0.0, 0)])
def test_evict_floor(size, frac, expected):
    assert evict_floor(size, frac) == expected


def state(**fields) -> RelocationProgress:
    return RelocationProgress("s000001", Intercept("cold", ScrConfig()), **fields)


CURSOR = RelocationCursor((BLOCK,), resume_limit=1500, max_retries=8, restore=True)


@pytest.mark.parametrize(
    "config, has_shadow, tracked, finished, has_index, expected",
    [
        pytest.param(ScrConfig(), True, state(), False, True, True, id="session-request"),
        pytest.param(ScrConfig(), False, state(), False, True, False, id="no-shadow"),
        pytest.param(ScrConfig(ssm_snap="release"), True, state(), False, True, False, id="snap-at-release"),
        pytest.param(ScrConfig(), True, None, False, True, False, id="untracked"),
        pytest.param(ScrConfig(), True, RelocationProgress(None, Intercept("off", ScrConfig())), False, True,
                     False, id="no-session"),
        pytest.param(ScrConfig(), True, state(cursor=CURSOR), False, True, False, id="plan-running"),
        pytest.param(ScrConfig(), True, state(), True, True, False, id="finished"),
        pytest.param(ScrConfig(), True, state(), False, False, False, id="no-state-row"),
    ],
)
def test_snapshot_at_prefill_end(config, has_shadow, tracked, finished, has_index, expected):
    assert snapshot_at_prefill_end(config, has_shadow, tracked, finished, has_index) is expected


RELEASE = ScrConfig(ssm_snap="release")


@pytest.mark.parametrize(
    "config, has_shadow, stored, has_index, state_saved, expected",
    [
        pytest.param(RELEASE, True, True, True, False, "save", id="release-snap"),
        pytest.param(RELEASE, True, True, True, True, "save", id="release-snap-over-prefill"),
        pytest.param(ScrConfig(ssm_snap="release", ssm_mode="strict"), True, True, True, False, "drop",
                     id="strict-never-at-release"),
        pytest.param(RELEASE, True, False, True, False, "drop", id="nothing-stored"),
        pytest.param(RELEASE, False, True, True, True, None, id="no-shadow-keeps"),
        pytest.param(ScrConfig(), True, True, True, True, None, id="prefill-end-taken"),
        pytest.param(ScrConfig(), True, True, True, False, "drop", id="prefill-end-missed"),
    ],
)
def test_state_at_release(config, has_shadow, stored, has_index, state_saved, expected):
    assert state_at_release(config, has_shadow, stored, has_index, state_saved) == expected


@pytest.mark.parametrize(
    "prompt, cached, moved, expected",
    [
        pytest.param(3000, 1024, 0, (1024, 1976), id="tree-only"),
        pytest.param(3000, 1500 + 2 * 1284, 1284, (1500, 216), id="one-block-counted-twice"),
        pytest.param(3000, 0, 0, (0, 3000), id="cold"),
    ],
)
def test_accounting(prompt, cached, moved, expected):
    assert accounting(prompt, cached, moved) == expected


def plan_outcome(side_slot, state_tokens, **config) -> Intercept:
    session = Session("s000001", None, side_slot=side_slot, state_tokens=state_tokens)
    admission = SessionAdmission(session, False, (), 1, (), MatchReport(session, "matched"))
    return Intercept("plan", ScrConfig(**config), admission, kept=2800, blocks=(BLOCK,), resume_limit=1500,
                     side_slot=side_slot)


@pytest.mark.parametrize(
    "outcome, has_state, has_shadow, expected",
    [
        pytest.param(plan_outcome(0, 1500), True, True, Gate(True, restore=True), id="fork"),
        pytest.param(plan_outcome(12, 1500), True, True, Gate(False, reason="no_snapshot"), id="slot-outside-shadow"),
        pytest.param(plan_outcome(0, -1), True, True, Gate(False, reason="no_snapshot"), id="stale-state"),
        pytest.param(plan_outcome(0, -1), False, False, Gate(True, reason="ssm_na"), id="dense-model"),
    ],
)
def test_plan_gate(outcome, has_state, has_shadow, expected):
    assert plan_gate(outcome, has_state, has_shadow) == expected


def test_new_cursor_starts_at_the_first_block_with_the_gates_restore():
    request = state(gate=Gate(True, restore=True))
    request.outcome = plan_outcome(0, 1500, splice_retry=3)
    cursor = new_cursor(request, relocation_plan("r", request.outcome, 3000))
    assert (cursor.stop, cursor.max_retries, cursor.restore, cursor.index) == (1500, 3, True, 0)
    assert cursor.blocks == (BLOCK,) and cursor.resume_limit == 1500


def test_new_cursor_restores_only_where_the_plan_has_a_restore():
    request = state(gate=Gate(True, restore=True))
    request.outcome = plan_outcome(0, 1500, ssm_mode="none")
    assert new_cursor(request, relocation_plan("r", request.outcome, 3000)).restore is False


def test_relocation_plan_reads_relocates_restores_and_reads_the_rest():
    outcome = plan_outcome(0, 1500)
    plan = relocation_plan("r", outcome, 3000)
    assert plan == Plan("r", 0, (Read(0, 1500), Relocate(1500, 1284, 1700, 0), Restore(2784, 0),
                                 Read(2784, 3000)), resume_limit=1500, admission=outcome)
    plan.validate(3000)


def test_relocation_plan_of_two_blocks_restores_with_the_first_only():
    second = Block(old_start=3100, new_start=2900, num_rows=84, n_c=100, new_end=3000)
    outcome = Intercept("plan", ScrConfig(), plan_outcome(0, 1500).admission, kept=2800, blocks=(BLOCK, second),
                        resume_limit=1024, side_slot=3)
    plan = relocation_plan("r", outcome, 3100)
    plan.validate(3100)
    assert plan.steps == (Read(0, 1500), Relocate(1500, 1284, 1700, 3), Restore(2784, 3), Read(2784, 2900),
                          Relocate(2900, 84, 3100, 3), Read(2984, 3100))
    assert blocks_of(plan.relocations(), ScrConfig().min_extend) == (BLOCK, second)


@pytest.mark.parametrize("kind", ["cold", "passthrough", "no_plan", "off"])
def test_every_other_outcome_reads_the_prompt_from_the_tree_hit(kind):
    plan = relocation_plan("r", Intercept(kind, ScrConfig()), 3000)
    assert (plan.steps, plan.resume_limit) == ((Read(0, 3000),), 3000)


def test_retraction_ends_the_plan_and_says_whether_one_was_running():
    quiet = state()
    assert quiet.retracted() is False
    relocated = state(cursor=CURSOR, phase1=True, cut=True, outside_tree=True, direct=("slots", 100))
    assert relocated.retracted() is True
    assert (relocated.cursor, relocated.phase1, relocated.cut, relocated.outside_tree, relocated.direct) == (
        None, False, False, False, None)


@pytest.mark.parametrize(
    "fields, prefix_len, expected",
    [
        pytest.param(dict(cursor=CURSOR, phase1=True), 1024, True, id="before-stop"),
        pytest.param(dict(cursor=CURSOR, phase1=True), 1500, False, id="at-stop"),
        pytest.param(dict(cursor=CURSOR, phase1=False), 1024, False, id="not-in-phase1"),
        pytest.param(dict(cursor=None, phase1=True), 1024, False, id="no-plan"),
    ],
)
def test_keeps_chunk(fields, prefix_len, expected):
    assert state(**fields).keeps_chunk(prefix_len) is expected


def test_counters_count_and_uncount_relocations():
    counters = Counters()
    counters.relocated(100)
    counters.relocated(50)
    counters.relocated(50, sign=-1)
    assert (counters.relocated_blocks, counters.relocated_tokens) == (1, 100)


def test_request_event_counts_relocated_rows_once():
    record = TrackedRequest(queued_ts=5.0, tokens=(), plan=relocation_plan("r", plan_outcome(0, 1500), 3000),
                            moved=1284, blocks=1, fallback="store: boom", retractions=1)
    event = request_event(record, None, rid="r", policy="scr", prompt_tokens=3000, cached_tokens=1500 + 2 * 1284,
                          decode_tokens=4, cache_salt="t", finish_reason="stop")
    assert (event.prefix_reused, event.moved, event.read) == (1500, 1284, 216)
    assert (event.rid, event.policy, event.blocks, event.fallback, event.retractions) == (
        "r", "scr", 1, "store: boom", 1)
    assert (event.queued_ts, event.plan_resume, event.decode_tokens) == (5.0, None, 4)  # made at enqueue: no resume
