"""``eval.offline``: the replay's arrival order, the offline scr arm (relocation, the tree it leaves,
the gate), each arm's costs adding up to the prompt, the table's columns by hand, and the command.
Its agreement with served runs is checked in ``tests/engine/test_bench_policies.py``."""

from __future__ import annotations

import json

import pytest

from eval.offline import gpu_time, table
from eval.offline.arms import DEFAULT_ARMS, ArmSpec, costs, exact_costs, radix_costs
from eval.offline.arrival import arrival_order
from eval.offline.scr_arm import CallCost, OfflineScr, read_spans, scr_costs, states_left
from eval.traces.format import TraceCall, write_trace
from scr.planner import Block
from scr.settings import ScrConfig

A, B, C, D = list(range(1000, 1200)), list(range(2000, 2300)), list(range(3000, 3400)), list(range(4000, 4050))


def call(conversation, turn, prompt, completion=(7, 8, 9), salt=None):
    return TraceCall(conversation=conversation, turn=turn, prompt_ids=list(prompt), completion_ids=list(completion),
                     cache_salt=salt)


def test_arrival_order_runs_the_first_call_alone_then_n_conversations_round_robin():
    calls = [call(c, t, [1]) for c, n in (("a", 3), ("b", 2), ("c", 2), ("d", 1)) for t in range(n)]
    order = [f"{c.conversation}{c.turn}" for c in arrival_order(calls, 2)]
    assert order == ["a0", "a1", "b0", "a2", "b1", "c0", "d0", "c1"]
    assert [f"{c.conversation}{c.turn}" for c in arrival_order(calls, 1)] == [
        f"{c.conversation}{c.turn}" for c in calls]
    assert arrival_order([], 4) == []


def test_read_spans_and_the_states_a_relocating_request_leaves():
    blocks = [Block(500, 200, 384, 400, 600)]
    spans = read_spans(0, blocks, 650)
    assert spans == [(0, 200), (584, 650)]
    assert states_left(spans, blocks, 650, 652, in_tree=True, chunk=128) == [128, 200, 650, 652]
    assert states_left(spans, blocks, 650, 652, in_tree=False, chunk=128) == [128, 200]
    assert states_left(read_spans(100, [], 650), [], 650, 652, True, 512) == [612, 650, 652]


def edit_calls():
    """A conversation whose middle (B) is deleted between two calls, then an append."""
    first = A + B + C
    second = A + C + D
    return [call("a", 0, first), call("a", 1, second), call("a", 2, second + [7, 8] + D)]


SMALL = dict(match_min_tokens=8, session_identity="content")


def test_scr_relocates_what_survives_a_deletion():
    costs_ = scr_costs(edit_calls(), ScrConfig(**SMALL), chunk=128)
    first, second, third = costs_
    assert (first.prefix, first.moved, first.kind) == (0, 0, "cold")
    # the tree holds states at 128-token chunk ends of the first call: 128 is inside A
    assert second.prefix == 128 and second.kind == "plan"
    assert second.moved == len(C) - 16  # the block's last min_extend tokens are read
    assert second.spans == [(128, 200), (200 + len(C) - 16, len(A + C + D))]
    assert second.prefix + second.moved + second.read == len(A + C + D)
    # the append resumes past the relocated rows, where the second call ended (prompt + completion[:-1])
    assert third.prefix == len(A + C + D) + 2 and third.moved == 0
    assert first.session == second.session == third.session


def test_without_relocated_rows_in_the_tree_the_next_call_resumes_before_them():
    config = ScrConfig(**SMALL, relocated_in_tree=False)
    third = scr_costs(edit_calls(), config, chunk=128)[2]
    assert third.prefix == 200 and third.moved == 0  # phase 1's last state (the stop), no more


def test_no_snapshot_no_plan():
    """A first call that decodes one token takes no state snapshot, so the gate declines the plan."""
    calls = edit_calls()
    calls[0] = call("a", 0, calls[0].prompt_ids, completion=(7,))
    second = scr_costs(calls, ScrConfig(**SMALL), chunk=128)[1]
    assert second.moved == 0 and second.prefix + second.read == len(calls[1].prompt_ids)


def test_content_matching_needs_its_minimum_prefix():
    second = scr_costs(edit_calls(), ScrConfig(match_min_tokens=1024), chunk=128)[1]
    assert second.moved == 0 and second.kind == "cold"  # 200 common tokens: a new session


def test_a_session_per_conversation_needs_no_content_match():
    server = OfflineScr(ScrConfig(match_min_tokens=1024, session_identity="rid"), chunk=128)
    second = [server.serve(c) for c in edit_calls()][1]
    assert second.moved == len(C) - 16


def test_every_arm_adds_up_to_the_prompt():
    calls = edit_calls() + [call("b", 0, A + D)]
    prompt = sum(len(c.prompt_ids) for c in calls)
    for spec in DEFAULT_ARMS:
        arm = costs(spec, calls, message_end=8)
        assert len(arm) == len(calls)
        assert sum(x.prefix + x.moved + x.read for x in arm) == prompt, spec
    radix = radix_costs(calls, chunk=128)
    assert [x.prefix for x in radix][:2] == [0, 128]
    grid = exact_costs(calls, piece=64, retain=128)
    assert all(end - start <= 64 for x in grid for start, end in x.spans)


def test_exact_kept_reads_in_forwards_of_the_gpu_chunk_ending_at_keep_points():
    """cut=kept with B = the GPU chunk (128 here): a cold read of three 100-token messages (end 9)
    ends forwards at the floored message ends 64, 192 and at the chunk ends 128, 256; an append
    resumes at 256 and ends a forward at its floored prompt end 320 (tests/unit/test_bench_cuts.py
    computes the same trace by hand)."""
    first = ([1] * 99 + [9]) * 3
    calls = [call("a", 0, first), call("a", 1, first + [1] * 49 + [9])]
    kept = costs(ArmSpec("k", "exact", {"cut": "kept"}), calls, message_end=9, gpu_chunk=128)
    assert [x.spans for x in kept] == [[(0, 64), (64, 128), (128, 192), (192, 256), (256, 300)],
                                       [(256, 320), (320, 350)]]
    quiet = costs(ArmSpec("k", "exact", {"cut": "kept", "message_end": ""}), calls, message_end=9, gpu_chunk=128)
    assert [x.spans for x in quiet] == [[(0, 128), (128, 256), (256, 300)], [(256, 320), (320, 350)]]
    wide = costs(ArmSpec("k", "exact", {"cut": "kept", "piece_tokens": "256"}), calls, message_end=9, gpu_chunk=128)
    assert wide[0].spans == [(0, 64), (64, 192), (192, 256), (256, 300)]
    # keeps=inside: the same reuse, forwards end at chunk ends (from each read's start) and prompt ends only
    inside = costs(ArmSpec("k", "exact", {"cut": "kept", "keeps": "inside"}), calls, message_end=9, gpu_chunk=128)
    assert [x.spans for x in inside] == [[(0, 128), (128, 256), (256, 300)], [(256, 350)]]
    assert [x.prefix for x in inside] == [x.prefix for x in kept] == [0, 256]
    curve = gpu_time.Curve((1.0, 0.0, 0.0, 0.0))  # one second per forward
    row = table.arm_row(calls, kept, curve, gpu_chunk=128)
    assert row["forwards_per_question"] == 7 and row["read_s_per_question"] == pytest.approx(7.0)
    assert row["read"] == pytest.approx((300 + 94) / 650)


def test_arm_row_by_hand():
    calls = [call("a", 0, [1] * 100, [2] * 10), call("b", 0, [1] * 300, [2] * 30)]
    arm = [CallCost(0, 0, [(0, 100)]), CallCost(50, 50, [(100, 300)])]
    curve = gpu_time.Curve((1.0, 0.0, 0.0, 0.0))  # one second per forward
    row = table.arm_row(calls, arm, curve, gpu_chunk=64, decode_rate=10.0)
    assert row["prefix"] == pytest.approx(50 / 400) and row["moved"] == pytest.approx(50 / 400)
    assert row["read"] == pytest.approx(300 / 400)
    assert row["pflops_per_question"] == pytest.approx(2 * table.BODY_PARAMS * (300 + 40) / 1e15 / 2)
    assert row["forwards_per_question"] == pytest.approx((2 + 4) / 2)  # 64-token chunks: 100 -> 2, 200 -> 4
    assert row["read_s_per_question"] == pytest.approx(3.0) and row["write_s_per_question"] == pytest.approx(2.0)
    assert row["read_time_share"] == pytest.approx(0.6)
    with pytest.raises(AssertionError, match="prompt"):
        table.arm_row(calls, [CallCost(0, 0, [(0, 99)]), arm[1]], curve)


def test_the_command_writes_its_report(tmp_path, capsys):
    from eval.offline.run import main

    trace = tmp_path / "t.jsonl"
    write_trace(edit_calls() + [call("b", 0, A + D)], trace)
    assert main(["--trace", str(trace), "--tokenizer", "tiny", "--concurrency", "2", "--out", str(tmp_path / "o"),
                 "--arm", "scr-rows=scr:side_tokens=600,session_identity=rid",
                 "--arm", "e256=exact:cut=messages,min_piece=64,piece_tokens=128,retain_every=256"]) == 0
    text = capsys.readouterr().out
    assert "| prefix / moved / read |" in text and "est. read share of GPU time" in text and "estimate" in text
    saved = json.loads((tmp_path / "o" / "offline.json").read_text())
    assert list(saved[0]["arms"]) == [a.name for a in DEFAULT_ARMS] + ["scr-rows", "e256"]
    assert saved[0]["arms"]["radix"]["ratio"] == 1.0
    # side slots of 600 rows hold no 650-token conversation: nothing to relocate, unlike scr rid's 30,000
    assert saved[0]["arms"]["scr-rows"]["moved"] == 0 < saved[0]["arms"]["scr rid"]["moved"]
    assert (tmp_path / "o" / "REPORT.md").read_text().startswith("Radix, exact and scr offline")


@pytest.mark.parametrize("arm, message", [("x=radix:chunk=4", "chunk"), ("x=scr:nope=1", "nope"),
                                          ("radix=exact", "two arms share a name")])
def test_bad_arms_are_usage_errors(tmp_path, capsys, arm, message):
    from eval.offline.run import main

    trace = tmp_path / "t.jsonl"
    write_trace(edit_calls(), trace)
    with pytest.raises(SystemExit) as exit_:
        main(["--trace", str(trace), "--arm", arm])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
