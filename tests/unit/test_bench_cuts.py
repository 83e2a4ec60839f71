"""``eval.bench_cuts``: the offline replay per namespace, the read floors, the summary row and the
``cut=kept`` arms (forwards and PFLOPs of a tiny trace by hand)."""

from __future__ import annotations

import pytest

from eval.bench_cuts import (BODY_PARAMS, floors, forward_end_table, forward_ends, kept_arms, kept_inside, replay_arm,
                              summary)
from eval.traces.format import TraceCall
from exact_cache.rules import KeepKind
from tests.reference.exact_oracle import expected_reuse

E = 9  # message-end token


def call(conversation, turn, prompt, completion=(), salt=None):
    return TraceCall(conversation=conversation, turn=turn, prompt_ids=list(prompt), completion_ids=list(completion),
                     cache_salt=salt)


def test_floors_count_new_tokens_and_the_previous_completion():
    first = list(range(100, 110))
    calls = [call("a", 0, first, [11, 12]), call("a", 1, first + [11, 12, 13, 14], [15]),
             call("b", 0, first, [])]
    new, completions = floors(calls)
    assert new == 10 + 2 + 10  # a's first prompt, a's 13 and 14, b's first prompt (new to b)
    assert completions == 2  # 11 and 12 came from a's previous completion


def test_replay_arm_keeps_namespaces_apart_and_agrees_with_the_oracle():
    base = [1] * 20 + [E] + [2] * 30 + [E] + [1] * 10
    edited = base[:21] + [0] * 25 + [E] + [1] * 10
    calls = [call("a", 0, base, salt="x"), call("a", 1, edited, salt="x"), call("b", 0, edited, salt="y")]
    run = replay_arm(calls, piece=16, retain_every=64, message_end=E, min_piece=4)
    oracle = expected_reuse([base, edited], piece=16, retain_every=64, message_end=E, min_piece=4)
    assert run["reused"][:2] == oracle and oracle[1] == 21  # resumed right after the first message end
    assert run["reused"][2] == 0  # another namespace shares nothing
    assert [p[0][0] for p in run["pieces"]] == [0, 21, 0]


def test_summary_row():
    calls = [call("a", 0, [1] * 100, [2] * 5), call("a", 1, [1] * 200, [2] * 5)]
    row = summary(calls, [0, 100], [[(0, 64), (64, 100)], [(100, 164), (164, 200)]], questions=1)
    assert row["prefix"] == pytest.approx(100 / 300) and row["read"] == pytest.approx(200 / 300)
    assert row["pflops_per_question"] == pytest.approx(2 * BODY_PARAMS * (200 + 10) / 1e15)
    assert row["forwards_per_question"] == 4 and row["pieces_under_128"] == 1.0
    low, high = row["gpu_estimate_pflops_per_question"]
    assert low == pytest.approx(2 * BODY_PARAMS * (200 + 150 * 4 + 10) / 1e15) and high > low


def messages(*lengths: int) -> list[int]:
    """Messages of the given lengths, each ending in the message-end token E."""
    out: list[int] = []
    for length in lengths:
        out += [1] * (length - 1) + [E]
    return out


def kept_calls():
    """A cold call of three 100-token messages, then the same prompt with a 50-token message appended."""
    first = messages(100, 100, 100)
    return [call("a", 0, first, [2] * 5), call("a", 1, first + messages(50), [2] * 5)]


def test_kept_arms_by_hand():
    """B = 128. Call 1 (300 tokens, cold): message ends 100, 200 floor to 64, 192; the prompt end
    floors to 256, a chunk multiple; forwards end at 64, 128, 192, 256, 300. Call 2 (350 tokens)
    resumes at 256 and keeps the prompt end at 320: forwards [256, 320), [320, 350). Reads 300 + 94."""
    arms = kept_arms(kept_calls(), 1, E, 128)
    with_messages, without = arms["exact cut=kept B=128"], arms["exact cut=kept B=128, no message keeps"]
    assert with_messages["pflops_per_question"] == pytest.approx(2 * BODY_PARAMS * (300 + 94 + 10) / 1e15)
    assert with_messages["prefix"] == pytest.approx(256 / 650)
    assert with_messages["forwards_per_question"] == 7 and with_messages["states_held"] == 4  # 64, 192, 256, 320
    assert with_messages["forward_ends_per_question"] == {"prompt": 2, "chunk": 2, "message": 2, "prompt_end": 1}
    low, _ = with_messages["gpu_estimate_pflops_per_question"]
    assert low == pytest.approx(2 * BODY_PARAMS * (394 + 150 * 7 + 10) / 1e15)
    # without message keeps: call 1 reads [0, 128), [128, 256), [256, 300); the same reuse
    assert without["pflops_per_question"] == with_messages["pflops_per_question"]
    assert without["forwards_per_question"] == 5 and without["states_held"] == 2  # 256, 320
    assert without["forward_ends_per_question"] == {"prompt": 2, "chunk": 2, "prompt_end": 1}
    # keeps=inside: call 1 reads [0, 128) (keeps 64 inside), [128, 256) (192 inside, 256 at its end),
    # [256, 300); call 2 reads [256, 350) in one forward, keeping 320 inside it. Same reuse and states.
    inside = arms["exact cut=kept B=128 keeps=inside"]
    assert inside["pflops_per_question"] == with_messages["pflops_per_question"]
    assert inside["forwards_per_question"] == 4 and inside["states_held"] == 4
    assert inside["forward_ends_per_question"] == {"prompt": 2, "chunk": 2}
    assert inside["kept_inside_per_question"] == 3 and with_messages["kept_inside_per_question"] == 0
    low, _ = inside["gpu_estimate_pflops_per_question"]
    assert low == pytest.approx(2 * BODY_PARAMS * (394 + 150 * 4 + 10) / 1e15)


def test_kept_arms_count_chunk_ends_from_the_read_start():
    """B = 128, R = 6,656. Call 1 as in ``test_kept_arms_by_hand``. Call 2 inserts 5 tokens at 150
    (305 tokens): matched 150, bound 128 holds no state, so it resumes at 64 (a message keep) and
    keeps the junction 128, the message end after 205 floored to 192, the prompt end floored to 256.
    Chunk ends count from 64: 192 (not 128 or 256). Ends: [64, 128) junction, [128, 192) chunk,
    [192, 256) prompt end, [256, 305). Inside: [64, 192) keeping 128 inside and 192 at its end,
    [192, 305) keeping 256 inside. Reads 300 + 241."""
    first = messages(100, 100, 100)
    calls = [call("a", 0, first, [2] * 5), call("a", 1, first[:150] + [2] * 5 + first[150:], [2] * 5)]
    arms = kept_arms(calls, 1, E, 128)
    ends, inside = arms["exact cut=kept B=128"], arms["exact cut=kept B=128 keeps=inside"]
    for row in (ends, inside):
        assert row["prefix"] == pytest.approx(64 / 605)
        assert row["pflops_per_question"] == pytest.approx(2 * BODY_PARAMS * (300 + 241 + 10) / 1e15)
        assert row["states_held"] == 6  # 64, 192, 256 of call 1; 128, 192, 256 of call 2 (another text)
    assert ends["forwards_per_question"] == 9 and ends["kept_inside_per_question"] == 0
    assert ends["forward_ends_per_question"] == {"prompt": 2, "chunk": 3, "message": 2, "junction": 1,
                                                 "prompt_end": 1}
    assert inside["forwards_per_question"] == 5 and inside["kept_inside_per_question"] == 4  # 64, 192; 128, 256
    assert inside["forward_ends_per_question"] == {"prompt": 2, "chunk": 3}
    run = replay_arm(calls, piece=128, retain_every=6656, message_end=E, kept=True, inside=True)
    assert run["pieces"][1] == [(64, 192), (192, 305)]
    assert run["keeps"][1] == {128: KeepKind.JUNCTION, 192: KeepKind.MESSAGE, 256: KeepKind.PROMPT_END}
    assert kept_inside(run["pieces"], run["keeps"]) == 4


def test_forward_ends_name_the_keep_point_unless_a_chunk_ends_there():
    pieces = [[(64, 128), (128, 150), (150, 200)], [(0, 200)]]
    keeps = [{128: KeepKind.JUNCTION, 150: KeepKind.JUNCTION, 192: KeepKind.PROMPT_END}, {}]
    assert forward_ends(pieces, keeps, 128) == {"prompt": 2, "junction": 2}  # chunks from 64: 192
    assert forward_ends(pieces, keeps, 64) == {"prompt": 2, "chunk": 1, "junction": 1}  # 128 = 64 + 64
    assert forward_ends(pieces, keeps, 832) == {"prompt": 2, "junction": 2}


def test_replay_arm_under_the_kept_rule_agrees_with_the_oracle():
    calls = kept_calls()
    run = replay_arm(calls, piece=128, retain_every=256, message_end=E, kept=True)
    prompts = [c.prompt_ids for c in calls]
    assert run["reused"] == expected_reuse(prompts, piece=128, retain_every=256, message_end=E, kept=True) == [0, 256]
    assert run["pieces"][1] == [(256, 320), (320, 350)]
    assert run["keeps"][1] == {320: KeepKind.PROMPT_END}


def test_the_forward_end_table_gives_ratios_to_radix():
    row = {"forwards_per_question": 10.0, "forward_ends_per_question": {"prompt": 3.0, "chunk": 1.0, "message": 6.0},
           "kept_inside_per_question": 0.0}
    inside = {"forwards_per_question": 4.0, "forward_ends_per_question": {"prompt": 3.0, "chunk": 1.0},
              "kept_inside_per_question": 6.0}
    result = {"arms": {"radix (offline, 512)": {"forwards_per_question": 4.0}, "exact cut=kept B=128": row,
                       "exact cut=kept B=128 keeps=inside": inside, "exact": {"forwards_per_question": 99.0}}}
    lines = forward_end_table(result)
    assert lines[-2] == "| exact cut=kept B=128 | 10.0 | 2.50 | 3.0 | 1.0 | 0.0 | 6.0 | 0.0 | 0.0 | 0.0 |"
    assert lines[-1] == "| exact cut=kept B=128 keeps=inside | 4.0 | 1.00 | 3.0 | 1.0 | 0.0 | 0.0 | 0.0 | 0.0 | 6.0 |"
    assert len([line for line in lines if line.startswith("| exact")]) == 2
    assert forward_end_table({"arms": {"radix (offline, 512)": {"forwards_per_question": 4.0}}}) == []


def test_a_kept_piece_off_the_grid_is_a_usage_error(tmp_path, capsys):
    from eval.bench_cuts import main

    with pytest.raises(SystemExit) as exit_:
        main(["--trace", str(tmp_path / "t.jsonl"), "--kept-piece", "100"])
    assert exit_.value.code == 2 and "multiple of 64" in capsys.readouterr().err
