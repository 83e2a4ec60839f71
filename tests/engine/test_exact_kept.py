"""``--cache-policy exact`` with ``cut=kept`` on the tiny model (CPU): forwards end only at chunk
ends (B = 128) and keep points (R = 256, message ends, prompt end, junction, all floored to the
64-token grid); a read resumes at any kept 64-multiple. Exact's engine matrix under this rule:
warm = cold bit for bit (ids and logprobs), cold = the independent reference (``tests/reference``),
reuse = the brute-force oracle (``kept=True``, with the message-end token read from the tokenizer);
alone and beside 1 and 3 decoding neighbours; an edit, a deleted message, an append, turns, and an
8,400-token read. The GPU check's exact-kept step is judged here too (its CPU dry run's checks).

This holds only where the engine's kernels give a row the same bits whatever forward read it (the
kept rule's premise, docs/exact.md §5.13): a warm read here runs other forwards than the cold read.
The matrix runs on a ``keeps=inside`` server (states kept inside forwards, docs/exact.md §5.14);
a ``keeps=ends`` server runs three of its cases, the long read and where its forwards end.

One server for the module, on the long-context variant of the tiny model (the same weights, 131,072
positions), so the 8,400-token case needs no server of its own; a state pool of 160 slots holds a
long read's periodic states without evicting (the oracle assumes no eviction).
"""

from __future__ import annotations

import pytest

from eval.server import wait_for_events
from tests.engine.conftest import start_server
from tests.engine.exact_checks import (LONG_CONTEXT_ARGS, im_end, long_context_model, long_conversation, messages,
                                       warm_beside_neighbours)
from tests.engine.prompts import prompt_ids
from tests.engine.test_exact_messages import SPEC
from tests.engine.test_exact_server import BASE, CASES, edited, run_and_compare
from tests.reference.exact_oracle import ExactOracle, expected_reuse

pytestmark = pytest.mark.engine

B, R = 128, 256


@pytest.fixture(scope="module")
def long_model():
    return long_context_model()


@pytest.fixture(scope="module")
def kept_reference(long_model):
    from tests.reference.hybrid_reference import Reference

    return Reference(long_model)


@pytest.fixture(scope="module", params=["ends", "inside"])
def kept_server(request, long_model, tmp_path_factory):
    """The module's server, once with ``keeps=ends`` (every keep point ends a forward) and once with
    ``keeps=inside`` (states kept inside forwards, docs/exact.md §5.14): the same matrix on both."""
    tmp = tmp_path_factory.mktemp(f"exact-kept-{request.param}")
    args = [*LONG_CONTEXT_ARGS, "--max-mamba-cache-size", "160", "--cache-policy", "exact",
            "--cache-events", str(tmp / "events.jsonl"), "--decode-log-interval", "1"]
    for setting in (f"piece_tokens={B}", f"retain_every={R}", "cut=kept", f"keeps={request.param}"):
        args += ["--cache-policy-set", setting]
    server = start_server(long_model, tmp, f"exact-kept-{request.param}", args, state_pool=False)
    server.events_path = tmp / "events.jsonl"
    server.im_end = im_end(long_model)
    server.keeps = request.param
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "read [" not in server.log_text()  # no forward off the plan


def kept_rules(server) -> dict:
    """The oracle's settings for the module's server."""
    return dict(piece=B, retain_every=R, kept=True, message_end=server.im_end)


KEPT_CASES = {
    **{name: CASES[name] for name in ("repeat", "append", "middle_delete")},  # test_exact_server's
    "edit_off_the_chunk_grid": [BASE, edited(BASE, 330, 340)],  # resumes at 256 (periodic), junction 320
    "turns": [BASE[:300], BASE[:300] + prompt_ids(111, 80), BASE[:300] + prompt_ids(111, 80) + prompt_ids(112, 70)],
}


# Under keeps=ends (the default) the module runs these cases, the long read and where forwards end;
# the whole matrix runs under keeps=inside, whose forwards the states no longer shape (CI time).
ENDS_CASES = ("repeat", "edit_off_the_chunk_grid", "turns")


def inside_only(server, name: str = "") -> None:
    if server.keeps != "inside" and name not in ENDS_CASES:
        pytest.skip("keeps=ends runs a subset of the matrix (ENDS_CASES); all of it runs under keeps=inside")


@pytest.mark.parametrize("name", list(KEPT_CASES))
def test_kept_rule_warm_equals_cold(kept_server, kept_reference, name):
    inside_only(kept_server, name)
    warm = run_and_compare(kept_server, KEPT_CASES[name], kept_reference, **kept_rules(kept_server))
    assert warm[0]["cached_tokens"] == 0
    if name in ("repeat", "append"):
        assert warm[1]["cached_tokens"] == 576  # the prompt end floored to the grid: off the chunk grid (128)


def test_a_deleted_message_resumes_at_the_floor_of_the_message_end_before_it(kept_server, kept_reference):
    """Message 2 (240..440) deleted: the prompts share [0, 240); the first read kept 192, the floor
    of message 1's end, and the edit resumes there."""
    inside_only(kept_server)
    im = kept_server.im_end
    prompts = [messages(im, *SPEC), messages(im, *SPEC[:2], *SPEC[3:])]
    warm = run_and_compare(kept_server, prompts, kept_reference, **kept_rules(kept_server))
    assert [w["cached_tokens"] for w in warm] == [0, 192]


@pytest.mark.parametrize("neighbours", [1, 3])
def test_a_warm_answer_beside_decoding_neighbours_is_the_cold_solo_answer(kept_server, kept_reference, neighbours):
    """Resumed at a junction (320, kept by the edit at 330 read just before it), which no cold read
    of the prompt stops at, then decoded beside 1 or 3 others (``exact_checks.warm_beside_neighbours``)."""
    inside_only(kept_server)
    prompt = edited(BASE, 330, 340)
    others = [prompt_ids(seed=160 + n, length=200) for n in range(neighbours)]
    assert ExactOracle(B, R, kept=True).serve(prompt)[1] == [256, 512, 576]  # the cold read's keep points
    history = [BASE, edited(BASE, 330, 335)]
    assert expected_reuse([*history, prompt], **kept_rules(kept_server))[-1] == 320
    warm, _ = warm_beside_neighbours(kept_server, kept_reference, prompt, others, history=history)
    assert warm["cached_tokens"] == 320


def test_a_long_conversation_resumes_past_8k_where_no_cold_read_ends_a_forward(kept_server, kept_reference):
    """The long-context conversation without its nudge (8,400 tokens, eleven 750-token messages and a
    150-token one), read after its first 8,300 tokens: the first read kept its prompt end floored,
    8,256, and the second resumes there. A cold read of the 8,400 tokens ends forwards at 8,192
    (a chunk end and the floor of the message end 8,250) and 8,320, never at 8,256, so the warm
    read's rows past 8,192 come from other forwards than the cold read's; warm = cold bit for bit,
    cold = the reference. (The cheapest honest form: two long reads and one long reference read.)"""
    _, prompt = long_conversation(kept_server.im_end)
    rules = kept_rules(kept_server)
    warm = run_and_compare(kept_server, [prompt[:8300], prompt], kept_reference, cold=[1], decode=24, tag="long",
                           **rules)
    assert [w["cached_tokens"] for w in warm] == [0, 8256]
    events = wait_for_events(kept_server.events_path, ["long.w1", "long.c1"])
    assert events["long.w1"]["pieces"][0] == [8256, 8384]  # the chunk from the read's start; the prompt end, floored
    cold_ends = {end for _, end in events["long.c1"]["pieces"]}
    assert {8192, 8320} <= cold_ends and 8256 not in cold_ends


def test_keep_points_end_forwards_only_under_keeps_ends(kept_server):
    """Where the states of a cold 600-token read are kept (R = 256, its prompt end floored: 256, 512,
    576) and which forwards read it: under ``keeps=ends`` every keep point ends a forward
    (forwards [0, 128) [128, 256) [256, 384) [384, 512) [512, 576) [576, 600)); under
    ``keeps=inside`` forwards end only at the chunk ends and the prompt end ([0, 128) ... [512, 600)),
    and the state at 576 is kept inside the last one."""
    kept_server.flush_cache()
    kept_server.generate(BASE, 2, rid="where.c0")
    event = wait_for_events(kept_server.events_path, ["where.c0"])["where.c0"]
    assert ExactOracle(B, R, kept=True, message_end=kept_server.im_end).serve(BASE)[1] == [256, 512, 576]
    assert [position for position, _ in event["snapshots"]] == [256, 512, 576]
    ends = [end for _, end in event["pieces"]]
    if kept_server.keeps == "ends":
        assert ends == [128, 256, 384, 512, 576, 600]
    else:
        assert ends == [128, 256, 384, 512, 600]
    assert event["fallback"] is None


def test_the_gpu_checks_kept_step_passes_on_this_server(kept_server):
    """``scripts/gpu_check.sh``'s exact-kept step (its CPU dry run) judged on this module's server,
    which has its settings (B = 128, R = 256, cut=kept): the launcher's premise line on CPU, and
    the step's quick cases, warm = cold bit for bit with the reuse it expects. (The whole step,
    with its own server, is ``python -m eval.gpu_check --device cpu --only exact-kept``.)"""
    inside_only(kept_server)  # the step serves keeps=inside
    from eval.gpu_check import exact
    from eval.gpu_check.exact_cases import SETUPS, cases_for
    from eval.gpu_check.report import PASS, Checks

    setup = SETUPS["kept"]
    assert (setup.cut, setup.keeps, setup.piece_tokens, setup.retain_every) == ("kept", kept_server.keeps, B, R)
    checks, answers = Checks(), []
    exact.check_premise(checks, kept_server, cuda=False)
    for case in cases_for(setup, quick=True):
        exact.check_case(checks, kept_server, case, "kept", answers)
    result = checks.result("exact-kept")
    assert result.status == PASS, result.checks
    assert len(result.checks) == 1 + 2 * len(cases_for(setup, quick=True)) >= 9
