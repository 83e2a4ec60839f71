"""``--cache-policy exact`` with ``cut=messages`` on the tiny model (CPU): pieces that also end right
after message ends (``<|im_end|>``), B = 64, R = 256, min_piece = 16.

Values, not counts: every warm answer (ids and logprobs) equals, bit for bit, a cold read of the
same prompt (same cut rule, cache flushed), and the cold read equals the independent reference
within ``REFERENCE_TOL``. Reuse equals the brute-force oracle with the message rule
(``tests/reference/exact_oracle.py``), and each event's ``pieces`` equals the oracle's cuts from
the resume point, so a warm read that ran other pieces than a cold one cannot pass. The message-end
token's id is read from the tokenizer here, not from the code under test. Answers decode 24
tokens: a warm read whose shared KV rows came from another piece (the rule that cut *at*
``<|im_start|>``) first differed at the 3rd to 8th token.
"""

from __future__ import annotations

import pytest

from eval.server import output_record, wait_for_events
from tests.engine.conftest import assert_equals_reference, start_server
from tests.engine.exact_checks import (LONG_CONTEXT_ARGS, im_end, long_context_model, long_conversation, messages,
                                         warm_beside_neighbours)
from tests.engine.prompts import prompt_ids
from tests.reference.exact_oracle import ExactOracle, expected_reuse

pytestmark = pytest.mark.engine

B, R, MIN = 64, 256, 16
DECODE = 24


@pytest.fixture(scope="module")
def message_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact-messages")
    args = ["--cache-policy", "exact", "--cache-events", str(tmp / "events.jsonl"), "--decode-log-interval", "1"]
    for setting in (f"piece_tokens={B}", f"retain_every={R}", "cut=messages", f"min_piece={MIN}"):
        args += ["--cache-policy-set", setting]
    server = start_server(tiny_model_dir, tmp, "exact-messages", args)
    server.events_path = tmp / "events.jsonl"
    server.im_end = im_end(tiny_model_dir)
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "read [" not in server.log_text()  # no forward off the planned pieces


def oracle_args(server):
    return dict(piece=B, retain_every=R, message_end=server.im_end, min_piece=MIN)


def serve_and_compare(server, prompts, reference, tag: str):
    """Warm in order, then each cold; the checks of the module docstring. Returns the warm records
    and their events."""
    server.flush_cache()
    rids = [f"{tag}.w{i}" for i in range(len(prompts))]
    warm = [output_record(server.generate(p, DECODE, rid=rid)) for p, rid in zip(prompts, rids)]
    oracle = ExactOracle(B, R, 0, server.im_end, MIN)
    expected = [oracle.serve(p)[0] for p in prompts]
    assert [w["cached_tokens"] for w in warm] == expected
    events = wait_for_events(server.events_path, rids)
    for prompt, rid, resume in zip(prompts, rids, expected):
        bounds = [resume] + [c for c in oracle.cuts(tuple(prompt)) if c > resume] + [len(prompt)]
        assert events[rid]["pieces"] == [list(p) for p in zip(bounds, bounds[1:])], rid
        assert events[rid]["forwards_off_plan"] == 0
    checked: set[tuple] = set()
    for i, (prompt, record) in enumerate(zip(prompts, warm)):
        server.flush_cache()
        cold = output_record(server.generate(prompt, DECODE, rid=f"{tag}.c{i}"))
        assert cold["cached_tokens"] == 0
        if tuple(prompt) not in checked:
            assert_equals_reference(reference, prompt, cold, f"{tag} cold read {i}")
            checked.add(tuple(prompt))
        assert record["output_ids"] == cold["output_ids"]
        assert record["logprobs"] == cold["logprobs"]  # bit for bit
    return warm, events


SPEC = ((300, 150), (301, 90), (302, 200), (303, 40), (304, 120))  # ends before 150, 240, 440, 480; 600 tokens


def test_long_context_message_cuts_past_8k(tmp_path):
    """The long-context tiny model (131,072 positions), B = 832, R = 6,656, min_piece = 64: an
    8,500-token prompt of eleven 750-token messages, a 100-token nudge and a 150-token message,
    then the same with the nudge deleted. The edit resumes exactly where the nudge began (8,250;
    the grid rule at 7,488 at best), its read runs past 8,192, and it equals the cold read bit for
    bit, which equals the reference. (Sized so one server start, two long reads and one reference
    read are the cost.)"""
    from tests.reference.hybrid_reference import Reference

    model = long_context_model()
    im = im_end(model)
    base, deleted = long_conversation(im)
    args = [*LONG_CONTEXT_ARGS, "--max-running-requests", "1", "--cache-policy", "exact", "--cache-policy-set", "cut=messages"]
    server = start_server(model, tmp_path, "exact-long-messages", args, state_pool=False)
    try:
        server.flush_cache()
        first = output_record(server.generate(base, DECODE))
        warm = output_record(server.generate(deleted, DECODE))
        server.flush_cache()
        cold = output_record(server.generate(deleted, DECODE))
    finally:
        server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert (first["cached_tokens"], warm["cached_tokens"], cold["cached_tokens"]) == (0, 8250, 0)
    assert expected_reuse([base, deleted], piece=832, retain_every=6656, message_end=im, min_piece=64) == [0, 8250]
    assert (warm["output_ids"], warm["logprobs"]) == (cold["output_ids"], cold["logprobs"])
    assert_equals_reference(Reference(model, gdn="chunk"), deleted, cold, "8,400-token read")


def test_an_agent_deletes_a_message_and_the_read_resumes_exactly_there(message_server, reference):
    """Message 2 (240..440) deleted: the edited prompt shares [0, 240), 240 is a cut of both prompts
    (after message 1's end, 26 tokens after the grid cut 214) and the first read kept a state
    there, so the read resumes at 240, off the 64 grid; the grid rule (states at 256 and 576 only)
    would read it all again."""
    im = message_server.im_end
    base = messages(im, *SPEC)
    deleted = messages(im, *SPEC[:2], *SPEC[3:])
    warm, _ = serve_and_compare(message_server, [base, deleted], reference, "del")
    assert [w["cached_tokens"] for w in warm] == [0, 240]
    assert expected_reuse([base, deleted], piece=B, retain_every=R) == [0, 0]


def test_an_edit_inside_a_message_and_a_short_message_merged(message_server, reference):
    """An edit at 300 (inside message 2) resumes at 240, the message boundary before it. Deleting the
    40-token message 3 (440..480) resumes lower than 440: 440 is only 8 tokens after the grid cut
    432, so it is no cut (min_piece = 16) and no state was kept there; the deepest state below is
    304, the periodic one (the first cut at or above R = 256)."""
    im = message_server.im_end
    base = messages(im, *SPEC)
    inside = base[:300] + prompt_ids(310, 10) + base[310:]
    short_deleted = messages(im, *SPEC[:3], *SPEC[4:])
    warm, events = serve_and_compare(message_server, [base, inside, short_deleted], reference, "inside")
    assert [w["cached_tokens"] for w in warm] == [0, 240, 304]
    kinds = dict(map(tuple, events["inside.w0"]["snapshots"]))
    assert kinds[150] == kinds[240] == kinds[480] == "message" and kinds[304] == "periodic" and 440 not in kinds


def test_a_prompt_diverging_inside_a_piece_does_not_reuse_rows_read_in_a_shorter_one(message_server, reference):
    """Message 1 (150..168) is 18 tokens; the edit keeps 17 of them and lengthens the message to 24
    tokens. Both prompts start a piece at 150, but it ends at 168 in the first and at 174 in the
    second, so rows 150-166 differ in the last bit between the two reads (on CPU the GDN gates of
    an 18-row piece put row 166 in the SIMD tail, of a 24-row piece in the body). The edit resumes
    at 150 and must keep its own rows: the tree's keys name each row's piece end
    (``exact_cache.rules.piece_keys``), so the first prompt's rows 150-166 never match."""
    im = message_server.im_end
    base = messages(im, (350, 150), (351, 18), (352, 200))
    edited = base[:167] + prompt_ids(353, 6) + [im] + base[168:]
    warm, events = serve_and_compare(message_server, [base, edited], reference, "straddle")
    assert [w["cached_tokens"] for w in warm] == [0, 150]
    assert events["straddle.w1"]["pieces"][0] == [150, 174]


def test_turns_append_the_answer_and_a_new_message(message_server, reference):
    """A conversation of three turns: each appends the previous answer (closed by the end token,
    as the chat template closes it) and a new message."""
    im = message_server.im_end
    message_server.flush_cache()
    prompts, prompt = [], messages(im, (320, 200), (321, 100))
    for turn in range(3):
        prompts.append(prompt)
        answer = output_record(message_server.generate(prompt, DECODE))["output_ids"]
        prompt = prompt + answer + [im] + messages(im, (322 + turn, 70))
    warm, _ = serve_and_compare(message_server, prompts, reference, "turns")
    assert all(w["cached_tokens"] > 0 for w in warm[1:])
    assert expected_reuse(prompts, **oracle_args(message_server)) == [w["cached_tokens"] for w in warm]


def test_a_warm_answer_beside_three_decoding_neighbours_is_the_cold_solo_answer(message_server, reference):
    """Resumed at a message boundary, decoded in one batch with 3 others
    (``exact_checks.warm_beside_neighbours``): ids and logprobs equal the cold read decoded alone,
    which equals the reference."""
    im = message_server.im_end
    others = [messages(im, (330 + n, 120), (340 + n, 80)) for n in range(3)]
    warm, _ = warm_beside_neighbours(message_server, reference, messages(im, *SPEC[:2], *SPEC[3:]), others,
                                     history=[messages(im, *SPEC)])
    assert warm["cached_tokens"] == 240
