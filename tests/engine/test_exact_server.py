"""``--cache-policy exact`` on the tiny model (CPU), B = 64, R = 256 (and once B = 832): the case matrix.

Every warm answer (token ids and logprobs) must equal, bit for bit, a cold answer of the same
prompt read after ``/flush_cache`` with the same pieces, and that cold answer must equal the
independent reference (``tests/reference``: transformers weights, no repo imports) within
``REFERENCE_TOL``, so a bug that is the same warm and cold (the tree backend, the row-wise decode,
the piece-aligned chunking) cannot pass. Every reused length must equal the brute-force oracle of
the spec's rules (``tests/reference/exact_oracle.py``, not ``exact_cache.replay``) over the
prompts served so far (the no-eviction cases).
"""

from __future__ import annotations

import pytest

from eval.server import output_record, wait_for_events
from tests.engine.conftest import assert_equals_reference, start_server
from tests.engine.exact_checks import warm_beside_neighbours
from tests.engine.prompts import prompt_ids
from tests.reference.exact_oracle import expected_reuse

pytestmark = pytest.mark.engine

B, R = 64, 256
DECODE = 6


def exact_args(tmp, *settings):
    args = ["--cache-policy", "exact", "--cache-events", str(tmp / "events.jsonl"),
            "--cache-policy-set", f"piece_tokens={B}", "--cache-policy-set", f"retain_every={R}"]
    for setting in settings:
        args += ["--cache-policy-set", setting]
    return args


@pytest.fixture(scope="module")
def exact_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact")
    server = start_server(tiny_model_dir, tmp, "exact", [*exact_args(tmp, f"dump_snapshots={tmp / 'snapshots'}"),
                                                         "--decode-log-interval", "1"])
    server.events_path = tmp / "events.jsonl"
    server.dump = tmp / "snapshots"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "read [" not in server.log_text()  # no forward off the planned pieces


def run_and_compare(server, prompts: list[list[int]], reference, *, check_reuse: bool = True, cold=None,
                    decode: int = DECODE, tag: str | None = None, **rules):
    """Serve ``prompts`` warm, then each one cold (or the ones indexed by ``cold``); each cold
    answer against the reference, each warm one against its cold one bit for bit. ``rules``: the
    oracle's (``expected_reuse``: piece, retain_every, spec_drop, message_end, kept, ...), this
    module's B and R by default. Request ids are ``<tag>.w<i>`` and ``<tag>.c<i>``. Returns the
    warm records."""
    rules = {"piece": B, "retain_every": R, **rules}
    tag = tag or f"p{id(prompts)}"
    server.flush_cache()
    warm = [output_record(server.generate(p, decode, rid=f"{tag}.w{i}")) for i, p in enumerate(prompts)]
    if check_reuse:
        assert [w["cached_tokens"] for w in warm] == expected_reuse(prompts, **rules)
    referenced: set[tuple] = set()  # a prompt served twice is checked against the reference once
    for i in range(len(prompts)) if cold is None else cold:
        server.flush_cache()
        record = output_record(server.generate(prompts[i], decode, rid=f"{tag}.c{i}"))
        assert record["cached_tokens"] == 0
        if tuple(prompts[i]) not in referenced:
            assert_equals_reference(reference, prompts[i], record, f"cold read {i}")
            referenced.add(tuple(prompts[i]))
        assert warm[i]["output_ids"] == record["output_ids"]
        assert warm[i]["logprobs"] == record["logprobs"]  # bit for bit
    return warm


BASE = prompt_ids(seed=100, length=600)


def edited(base, start, end, filler_seed=101):
    """``base`` with ``[start, end)`` replaced by the same number of other tokens."""
    return base[:start] + prompt_ids(filler_seed, end - start) + base[end:]


CASES = {
    "repeat": [BASE, BASE],
    "tail_replaced": [BASE, BASE[:560] + prompt_ids(102, 40)],
    "append": [BASE, BASE + prompt_ids(103, 90)],
    "middle_delete": [BASE, BASE[:200] + BASE[330:]],
    "same_edit_twice": [BASE, edited(BASE, 300, 340), edited(BASE, 300, 340)],
    "cut_just_before_a_piece_boundary": [BASE, edited(BASE, 319, 330)],
    "edit_just_after_a_periodic_state": [BASE, edited(BASE, 260, 270)],
    "length_an_exact_multiple_of_B": [BASE[:512], BASE[:512], BASE[:512] + prompt_ids(104, 64)],
    "two_interleaved_conversations": [
        BASE, prompt_ids(105, 400), BASE + prompt_ids(106, 30), prompt_ids(105, 400) + prompt_ids(107, 70),
    ],
}


def test_spec_drop_lands_one_piece_early(tiny_model_dir, tmp_path, reference):
    """S = 1: an edit just after a periodic state falls back to the state before it."""
    prompts = [BASE, edited(BASE, 260, 270), BASE]
    assert expected_reuse(prompts, piece=B, retain_every=R, spec_drop=1) == [0, 0, 512]
    assert expected_reuse(prompts, piece=B, retain_every=R, spec_drop=0) == [0, 256, 576]
    with start_server(tiny_model_dir, tmp_path, "exact-s1", exact_args(tmp_path, "spec_drop=1")) as server:
        run_and_compare(server, prompts, reference, spec_drop=1)
    assert server.fatal_lines() == []


def test_eviction_under_a_tiny_snapshot_budget_only_shortens_hits(tiny_model_dir, tmp_path, reference):
    prompts = [BASE, prompt_ids(120, 600), BASE, edited(BASE, 300, 310), prompt_ids(120, 600) + [5] * 20]
    budget = ["--max-running-requests", "1"]
    with start_server(tiny_model_dir, tmp_path, "exact-tiny",
                      [*budget, *exact_args(tmp_path, "max_snapshots=3")], state_pool=False) as server:
        warm = run_and_compare(server, prompts, reference, check_reuse=False)
        assert "max_mamba_cache_size=4" in server.log_text()
    no_eviction = expected_reuse(prompts, piece=B, retain_every=R)
    reused = [w["cached_tokens"] for w in warm]
    assert all(r <= full for r, full in zip(reused, no_eviction))
    assert reused != no_eviction  # the budget did evict something
    assert server.fatal_lines() == []


def test_pieces_of_832_edits_equal_the_reference(tiny_model_dir, tmp_path, reference):
    """The default piece (B = 832, R = 6656) on 1,700-token prompts: an edit at 1,000 finds no
    state below it (the first read kept only its prompt end, 1,664) and leaves a junction at 832;
    an edit at 1,200 resumes there. Warm = cold bit for bit, cold = the reference, reuse = the
    oracle. (Appends are in the B = 64 matrix; three prompts keep this test near a minute.)"""
    base = prompt_ids(seed=170, length=1700)
    prompts = [base, edited(base, 1000, 1010, filler_seed=171), edited(base, 1200, 1210, filler_seed=172)]
    args = ["--cache-policy", "exact", "--cache-events", str(tmp_path / "events.jsonl")]
    with start_server(tiny_model_dir, tmp_path, "exact-832", args) as server:
        warm = run_and_compare(server, prompts, reference, piece=832, retain_every=6656)
    assert [w["cached_tokens"] for w in warm] == [0, 0, 832]
    assert server.fatal_lines() == []


@pytest.mark.parametrize("name", list(CASES))
def test_case_matrix(exact_server, reference, name):
    warm = run_and_compare(exact_server, CASES[name], reference)
    assert warm[0]["cached_tokens"] == 0


def test_second_and_third_turn(exact_server, reference):
    """A conversation whose turns append the previous answer and a new message."""
    exact_server.flush_cache()
    prompts, records = [], []
    prompt = prompt_ids(110, 300)
    for turn in range(3):
        prompts.append(prompt)
        records.append(output_record(exact_server.generate(prompt, DECODE)))
        prompt = prompt + records[-1]["output_ids"] + prompt_ids(111 + turn, 80)
    assert [r["cached_tokens"] for r in records] == expected_reuse(prompts, piece=B, retain_every=R)
    assert records[1]["cached_tokens"] == 256 and records[2]["cached_tokens"] == 384
    run_and_compare(exact_server, prompts, reference)


def test_events_record_resume_and_keep_points(exact_server):
    exact_server.flush_cache()
    exact_server.generate(BASE, 2, rid="ev-first")
    exact_server.generate(edited(BASE, 400, 410), 2, rid="ev-edit")
    events = wait_for_events(exact_server.events_path, ["ev-first", "ev-edit"])
    first, edit = events["ev-first"], events["ev-edit"]
    assert (first["policy"], first["plan_resume"], first["prefix_reused"]) == ("exact", 0, 0)
    assert first["snapshots"] == [[256, "periodic"], [512, "periodic"], [576, "prompt_end"]]
    # The edit at 400: A = 384, deepest snapshot <= 384 is 256; 384 becomes a junction.
    assert (edit["plan_resume"], edit["prefix_reused"], edit["read"]) == (256, 256, 344)
    assert edit["snapshots"] == [[384, "junction"], [512, "periodic"], [576, "prompt_end"]]
    assert first["forwards_off_plan"] == edit["forwards_off_plan"] == 0


def test_snapshots_equal_a_cold_read_stopped_after_the_same_piece(exact_server):
    """The state kept at 512 by a resumed read equals, bit for bit, the state a cold read keeps
    when its prompt ends right after the piece [448, 512). (The module's server dumps every kept
    state, ``dump_snapshots``.)"""
    import torch

    dump, server = exact_server.dump, exact_server
    edit = edited(BASE, 300, 310)
    server.flush_cache()
    server.generate(BASE, 2, rid="base")
    resumed = output_record(server.generate(edit, 2, rid="resumed"))
    assert resumed["cached_tokens"] == 256
    server.flush_cache()
    server.generate(edit[:513], 2, rid="cold")  # prompt end e = floor(512 / 64) * 64 = 512
    warm = torch.load(dump / "resumed-512.pt")
    cold = torch.load(dump / "cold-512.pt")
    assert len(warm["conv"]) == len(cold["conv"]) >= 1
    for a, b in zip(warm["conv"], cold["conv"]):
        assert a.shape[0] == 6 and torch.equal(a, b)  # 6 GDN layers
    assert torch.equal(warm["temporal"], cold["temporal"])
    assert warm["temporal"].abs().sum() > 0
    # The base read kept 512 too, but from other text: its state must differ.
    assert not torch.equal(torch.load(dump / "base-512.pt")["temporal"], warm["temporal"])


def test_launcher_refuses_settings_that_break_exactness(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "patches.launch_server", "--model-path", str(tiny_model_dir),
         "--cache-policy", "exact", "--mamba-ssm-dtype", "bfloat16"],
        capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert "--cache-policy exact cannot guarantee its results with these settings:" in result.stderr
    assert "the recurrent state must stay fp32: drop --mamba-ssm-dtype / SGLANG_MAMBA_SSM_DTYPE (bfloat16)" in result.stderr


def test_launcher_checks_what_sglang_resolved_not_just_the_command_line(tiny_model_dir):
    """A repeated flag: the command-line check sees the first value, SGLang keeps the last."""
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "patches.launch_server", "--model-path", str(tiny_model_dir),
         "--cache-policy", "exact", "--chunked-prefill-size", "832", "--chunked-prefill-size", "128"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 2
    assert "needs --chunked-prefill-size 832, SGLang resolved 128" in result.stderr


def test_a_capped_match_is_recorded_and_replayed(exact_server):
    """A request asking for prompt logprobs from ``logprob_start_len`` is matched no further than
    that (SGLang's rule): the event records the cap, and the oracle given the cap agrees with the
    server; the capped answer is still the cold one, bit for bit."""
    prompts = [prompt_ids(seed=140, length=300)] * 2
    exact_server.flush_cache()
    first = output_record(exact_server.generate(prompts[0], DECODE, rid="cap.1"))
    capped = exact_server.generate(prompts[1], DECODE, rid="cap.2", logprob_start_len=100)
    events = wait_for_events(exact_server.events_path, ["cap.1", "cap.2"])
    assert events["cap.2"]["match_cap"] == 100 and events["cap.1"]["match_cap"] is None
    caps = [events["cap.1"]["match_cap"], events["cap.2"]["match_cap"]]
    assert [first["cached_tokens"], output_record(capped)["cached_tokens"]] == \
        expected_reuse(prompts, piece=B, retain_every=R, caps=caps) == [0, 0]
    assert expected_reuse(prompts, piece=B, retain_every=R) == [0, 256]  # what an uncapped request would reuse


@pytest.mark.parametrize("neighbours", [1, 3])
def test_a_warm_answer_decoded_beside_others_is_the_cold_solo_answer(exact_server, reference, neighbours):
    """Exact under load (``exact_checks.warm_beside_neighbours``): the warm request decodes in one
    batch with 1 or 3 others, and equals the cold read decoded alone, bit for bit."""
    prompt = prompt_ids(seed=150 + neighbours, length=300)
    others = [prompt_ids(seed=160 + n, length=200) for n in range(neighbours)]
    warm_beside_neighbours(exact_server, reference, prompt, others)


def test_startup_record_names_the_resolved_settings_and_the_added_flags(exact_server):
    from dataclasses import asdict

    from exact_cache.config import ExactConfig
    from policy.events import read_startups

    (startup,) = read_startups(str(exact_server.events_path))
    assert startup["policy"] == "exact"
    assert startup["settings"] == asdict(ExactConfig(piece_tokens=B, retain_every=R, dump_snapshots=str(exact_server.dump)))
    args = startup["server_args"]
    assert args[args.index("--radix-cache-backend") + 1] == "exact"
    assert args[args.index("--chunked-prefill-size") + 1] == str(B)
