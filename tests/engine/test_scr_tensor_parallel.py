"""``--cache-policy scr`` under ``--tp-size 2`` on the CPU path (docs/tensor_parallel.md §4).

Each rank relocates and re-rotates its own KV heads and restores its own share of the recurrent
state; the ranks exchange one row after each tensor step (``policy/ranks.py``). Checked on one TP 2
server against the independent reference (values, as ``test_scr_reference``): three turns of one
conversation, two conversations at once, and a failure injected on rank 1 only
(``policy/faults.py`` ``#1``) that must end in the same plain read on both ranks, not a hang.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from eval.server import wait_for_events
from tests.engine import test_scr_reference as scr_ref
from tests.engine.prompts import prompt_ids
from tests.reference.hybrid_reference import Reference
from tests.reference.scr_reference import Conversation, cold

pytestmark = pytest.mark.engine

SCR_FAULTS = ",".join([
    "scr.place_rows~tp-place#1@1",  # rank 1's row copy fails, rank 0's succeeds
    "scr.restore_copy~tp-restore#1@1",  # rank 1's state copy fails, rank 0's succeeds (and is undone)
    "scr.side_store~tp-store#1@1",  # rank 1's side store at turn 1's release fails
])


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return Reference(tiny_model_dir)


@pytest.fixture(scope="module")
def scr_tp(tiny_model_dir, tmp_path_factory):
    server = scr_ref.start_scr(tiny_model_dir, tmp_path_factory, "scr_tp2", ["--tp-size", "2"],
                               env={"CACHE_POLICY_FAULTS": SCR_FAULTS})
    yield server
    server.stop()
    scr_ref.assert_only_contained_failures(server)


def rank_lines(server, text: str) -> list[str]:
    return [line for line in server.log_text().splitlines() if text in line]


def test_scr_three_turns_under_tp2_equal_the_reference(scr_tp, ref):
    """Turn 2 relocates one block (each rank its own KV heads, re-rotated, and its share of the
    forked state); turn 3 relocates turn 2's relocated rows again. Values against the reference."""
    cuts = [(1400, 1600)]
    conversation, second, two, blocks, expected = scr_ref.run_two_turns(scr_tp, ref, 151, cuts, "tp-three")
    assert blocks == scr_ref.expected_blocks(cuts)
    scr_ref.check(two, expected, "tp2: turn 2, one block, fork")
    third = second[:1800] + second[1950:] + prompt_ids(153, 40)
    three = scr_ref.ask(scr_tp, third, "tp-three.3")
    blocks3 = scr_ref.relocations(scr_tp, "tp-three.3")
    assert blocks3 and (blocks3[0].stop, blocks3[0].old_start) == (1800, 1950)
    # turn 2's relocated rows are in the tree: turn 3's phase-1 forwards point at them (test_scr_reference)
    expected3 = conversation.serve(third, three["output_ids"], blocks3, read_from=scr_ref.phase1_hit(scr_tp, "tp-three.3"),
                                   chunk=scr_ref.CHUNK)
    scr_ref.check(three, expected3, "tp2: turn 3")
    events = wait_for_events(scr_tp.events_path, ["tp-three.2", "tp-three.3"])
    assert [(events[rid]["moved"], events[rid]["fallback"]) for rid in ("tp-three.2", "tp-three.3")] == [
        (blocks[0].rows, None), (blocks3[0].rows, None)]


def test_scr_two_conversations_at_once_under_tp2(scr_tp, ref):
    """Two conversations (different salts) at once; each relocates its own rows and equals the
    reference of its own history (the values do not depend on how the rounds interleave)."""
    cuts = [(1300, 1400), (1900, 2000)]
    first, second = scr_ref.edited(161, cuts)
    salts = ("tp-x", "tp-y")
    with ThreadPoolExecutor(2) as pool:
        ones = list(pool.map(lambda s: scr_ref.ask(scr_tp, first, f"{s}.1", s), salts))
        twos = list(pool.map(lambda s: scr_ref.ask(scr_tp, second, f"{s}.2", s), salts))
    for salt, one, two in zip(salts, ones, twos):
        conversation = Conversation(ref)
        conversation.serve(first, one["output_ids"])
        blocks = scr_ref.relocations(scr_tp, f"{salt}.2")
        assert blocks == scr_ref.expected_blocks(cuts)
        scr_ref.check(two, conversation.serve(second, two["output_ids"], blocks), f"tp2: {salt} two blocks")


@pytest.mark.parametrize("tag, step, seed", [("tp-place", "place_rows", 171), ("tp-restore", "restore_copy", 191)])
def test_scr_a_copy_failing_on_rank_1_only_ends_in_one_plain_read(scr_tp, ref, tag, step, seed):
    """Rank 1's row copy (or state copy) fails, rank 0's succeeds: both give the slots back, rank 0
    puts back the state it had overwritten, and both read the rest (a hang or a mixed read
    otherwise). The answer is the cold read; both ranks log the fallback."""
    first, second = scr_ref.edited(seed, [(1400, 1600)])
    scr_ref.ask(scr_tp, first, f"{tag}.1")
    two = scr_ref.ask(scr_tp, second, f"{tag}.2")
    event = wait_for_events(scr_tp.events_path, [f"{tag}.2"])[f"{tag}.2"]
    assert event["moved"] == 0 and event["fallback"] == f"round: PeerFailed: {step} failed on TP rank(s) 1"
    scr_ref.check(two, cold(ref, second, two["output_ids"]), f"tp2: rank-1 {step} fault -> plain read")
    fallbacks = rank_lines(scr_tp, f"scr fallback: rid={tag}.2 step=round outcome=plain_read")
    assert len(fallbacks) == 2 and sum("InjectedFault" in line for line in fallbacks) == 1, fallbacks
    assert len(scr_ref.ask(scr_tp, prompt_ids(7, 64), f"{tag}.after")["output_ids"]) == scr_ref.TOKENS


def test_scr_a_side_store_failing_on_rank_1_only_drops_the_session_on_both(scr_tp, ref):
    """Rank 1 cannot store turn 1's rows: rank 0 drops its copy too, so turn 2 relocates nothing on
    either rank and equals the cold read."""
    first, second = scr_ref.edited(181, [(1400, 1600)])
    scr_ref.ask(scr_tp, first, "tp-store.1")
    assert wait_for_events(scr_tp.events_path, ["tp-store.1"])["tp-store.1"]["fallback"] == (
        "store: PeerFailed: side_store failed on TP rank(s) 1")
    fallbacks = rank_lines(scr_tp, "scr fallback: rid=tp-store.1 step=store outcome=plain_read")
    assert len(fallbacks) == 2 and sum("InjectedFault" in line for line in fallbacks) == 1, fallbacks
    two = scr_ref.ask(scr_tp, second, "tp-store.2")
    assert wait_for_events(scr_tp.events_path, ["tp-store.2"])["tp-store.2"]["moved"] == 0
    assert not scr_ref.relocations(scr_tp, "tp-store.2")
    scr_ref.check(two, cold(ref, second, two["output_ids"]), "tp2: rank-1 store fault -> plain read")
