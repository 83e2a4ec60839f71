"""``ScrPolicy``: the seam's plan, admission through the session table, unsupported settings."""

from __future__ import annotations

import pytest

from policy.api import Arrival, Read, Relocate, RequestRefused, Restore
from scr.policy import ScrPolicy
from scr.settings import ScrConfig

GOOD = {"chunked_prefill_size": 512, "tp_size": 1, "disable_radix_cache": False}


@pytest.mark.parametrize(
    "changes, problem",
    [
        pytest.param({}, None, id="supported"),
        pytest.param({"disable_radix_cache": True}, "--disable-radix-cache", id="no-radix-cache"),
        pytest.param({"chunked_prefill_size": -1}, "chunked prefill is off", id="no-chunking"),
        pytest.param({"chunked_prefill_size": None}, "chunked prefill is off", id="chunking-unset"),
        pytest.param({"chunked_prefill_size": 0}, "chunked prefill is off", id="chunk-size-zero"),
        pytest.param({"chunked_prefill_size": 1}, None, id="chunk-size-one"),
        pytest.param({"tp_size": 2}, None, id="tensor-parallel"),  # ranks kept in step (policy/ranks.py)
        pytest.param({"tp_size": 2, "enable_dp_attention": True}, "--enable-dp-attention", id="dp-attention"),
        pytest.param({"pp_size": 2}, "--pp-size > 1", id="pipeline"),
        pytest.param({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache", id="hicache"),
        pytest.param({"speculative_algorithm": "EAGLE"}, "speculative decoding", id="speculative"),
        pytest.param({"mamba_radix_cache_strategy": "no_buffer"}, None, id="no-buffer"),
        pytest.param({"kv_cache_dtype": "bf16"}, None, id="kv-bf16"),
        pytest.param({"kv_cache_dtype": "fp8_e4m3"}, "--kv-cache-dtype fp8_e4m3: SCR re-rotates", id="kv-fp8"),
        pytest.param({"kv_cache_dtype": "fp4_e2m1"}, "--kv-cache-dtype fp4_e2m1: SCR re-rotates", id="kv-fp4"),
        pytest.param({"mamba_radix_cache_strategy": "extra_buffer"}, "--mamba-radix-cache-strategy extra_buffer: ",
                     id="extra-buffer"),
        pytest.param({"mamba_radix_cache_strategy": "extra_buffer_lazy"},
                     "--mamba-radix-cache-strategy extra_buffer_lazy: ", id="extra-buffer-lazy"),
    ],
)
def test_startup_problems(changes, problem):
    problems = ScrPolicy(ScrConfig()).startup_problems({**GOOD, **changes}, {}, on_cuda=True)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(problem)


def test_extra_buffer_refusal_says_why_and_what_to_use():
    [problem] = ScrPolicy(ScrConfig()).startup_problems(
        {**GOOD, "mamba_radix_cache_strategy": "extra_buffer"}, {}, on_cuda=True)
    assert problem == ("--mamba-radix-cache-strategy extra_buffer: SCR's recurrent-state save and restore "
                       "(docs/scr.md §9.2, §9.4) have only been run with no_buffer, whose state slots it copies; use "
                       "--mamba-radix-cache-strategy no_buffer")


def test_a_cold_request_is_planned_at_enqueue_as_a_read_from_wherever_the_tree_match_ends():
    policy = ScrPolicy(ScrConfig())
    plan = policy.plan(Arrival(rid="r", tokens=tuple(range(10)), cache_key=None, tree_hit=0))
    assert policy.plans_at == "enqueue" and plan.admission.kind == "cold"
    assert (plan.steps, plan.resume_limit) == ((Read(0, 10),), 10)


def test_the_plan_after_a_stored_turn_relocates_the_block_the_admission_found():
    policy = ScrPolicy(ScrConfig())
    old = list(range(3000))
    first = policy.plan(Arrival(rid="a.1", tokens=tuple(old), cache_key=None, tree_hit=0))
    policy.sessions.finish(first.admission.sid, old + [7, 7], store=True)
    new = old[:1500] + old[1700:] + [9] * 30
    plan = policy.plan(Arrival(rid="a.2", tokens=tuple(new), cache_key=None, tree_hit=0))
    plan.validate(len(new))
    rows = 1300 - 16
    assert plan.steps == (Read(0, 1500), Relocate(1500, rows, 1700, plan.admission.side_slot),
                          Restore(1500 + rows, plan.admission.side_slot), Read(1500 + rows, len(new)))
    assert plan.resume_limit == 1500


def test_an_unsupported_knob_is_a_refusal_naming_the_field():
    with pytest.raises(RequestRefused) as refused:
        ScrPolicy(ScrConfig()).plan(Arrival(rid="k", tokens=(1, 2), cache_key="kvreuse:knobs:pin=1", tree_hit=0))
    assert refused.value.field == "cache_salt"


def test_admit_plans_after_a_stored_turn():
    policy = ScrPolicy(ScrConfig())
    old = list(range(3000))
    first = policy.admit(old, None)
    assert first.kind == "cold"
    policy.sessions.finish(first.sid, old + [7, 7], store=True)
    new = old[:1500] + old[1700:] + [9] * 30
    second = policy.admit(new, None)
    assert second.kind == "plan" and second.sid == first.sid
    assert [(b.old_start, b.new_start, b.num_rows) for b in second.blocks] == [(1700, 1500, 1300 - 16)]
    policy.check()


def test_kvreuse_off_takes_no_session():
    policy = ScrPolicy(ScrConfig())
    assert policy.admit(list(range(2000)), "kvreuse:off").kind == "off"
    assert len(policy.sessions) == 0


def planned(config=None):
    """A policy with one stored turn and the plan of an edited second turn."""
    policy = ScrPolicy(config or ScrConfig())
    old = list(range(3000))
    first = policy.admit(old, None)
    policy.store_turn(first.sid, old + [7, 7])
    new = old[:1500] + old[1700:] + [9] * 30
    return policy, policy.admit(new, None), new


@pytest.mark.parametrize(
    "case, expected",
    [
        pytest.param("pinned", (True, True, "s000001"), id="pinned-ids-match"),
        pytest.param("wrong-ids", (False, False, "s000001"), id="ids-differ"),
        pytest.param("wrong-ids-no-t6", (True, False, "s000001"), id="ids-differ-guard-off"),
        pytest.param("slot-released", (False, False, None), id="slot-released"),
        pytest.param("slot-retaken", (False, True, "s000001"), id="slot-taken-again"),
    ],
)
def test_relocation_guard(case, expected):
    # One side slot, so a released slot comes back as the same number with a new generation.
    policy, outcome, new = planned(ScrConfig(side_sessions=1, t6_guard=case != "wrong-ids-no-t6"))
    block = outcome.blocks[0]
    ids = new[block.new_start:block.new_start + block.num_rows]
    if case.startswith("wrong-ids"):
        ids = [0] * len(ids)
    if case.startswith("slot-"):
        policy.drop_private(outcome.sid)
    if case == "slot-retaken":
        assert policy.snapshot_slot(outcome.sid) == (0, True)  # the same slot, a new acquisition
        policy.sessions.get(outcome.sid).side_ids = tuple(range(3000))
    guard = policy.relocation_guard(outcome, block.old_start, block.num_rows, ids)
    assert (guard.ok, guard.ids_match, guard.owner) == expected


def test_snapshot_is_invalid_until_taken():
    policy, outcome, _ = planned()
    sid = outcome.sid
    policy.snapshot_taken(sid, 3000)
    assert policy.snapshot_slot(sid) == (0, False)  # the session's own slot, already held
    assert policy.sessions.get(sid).state_tokens == -1  # a copy failing now leaves no valid snapshot
    policy.snapshot_taken(sid, 2830)
    assert policy.sessions.get(sid).state_tokens == 2830
    policy.drop_state(sid)
    assert policy.sessions.get(sid).state_tokens == -1


def test_snapshot_slot_takes_a_free_slot_or_none():
    policy = ScrPolicy(ScrConfig(side_sessions=1))
    a = policy.admit(list(range(2000)), "a").sid
    b = policy.admit(list(range(5000, 7000)), "b").sid
    assert policy.num_free_slots == 1
    assert policy.snapshot_slot(a) == (0, True)
    assert policy.snapshot_slot(b) == (None, False) and policy.num_free_slots == 0


def test_count_out_and_store_turn_balance_inflight():
    policy = ScrPolicy(ScrConfig())
    quiet = policy.admit(list(range(2000)), "a").sid
    stored = policy.admit(list(range(2000)), "b").sid
    policy.count_out(quiet)
    store = policy.store_turn(stored, list(range(2010)))
    assert (store.slot, store.keep, store.end, store.acquired) == (0, 0, 2010, True)
    assert [policy.sessions.get(sid).inflight for sid in (quiet, stored)] == [0, 0]
    policy.count_out("s999999", if_present=True)  # gone already: nothing to count out
    with pytest.raises(KeyError):
        policy.count_out("s999999")
    policy.check()
