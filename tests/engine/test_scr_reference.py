"""``--cache-policy scr`` value by value: served logprobs and greedy ids equal an independent reference.

The reference (``tests/reference/scr_reference.py`` on ``tests/reference/hybrid_reference.py``)
computes, on the transformers weights of the tiny checkpoint and without importing the code under
test, what an SCR request must produce given the server's decisions (each block's stop, old
position and rows, read from the server's own splice lines); each test also pins those decisions
to what its edit implies, so a wrong plan cannot pass either. Ids must be equal, logprobs within
1e-4 (fp32 on CPU; measured distances are ~1e-6). A count-only test cannot see a wrong rotation,
a wrong state or rows from the wrong place: these can.

Sensitivity: the same harness with re-rotation switched off on the server (``rerot=0`` knob) must
disagree with the rotating reference (and agree with a reference that does not rotate).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from eval.server import output_record, wait_for_events
from scr.authors_log import parse_line
from tests.engine.conftest import start_server
from tests.engine.prompts import prompt_ids
from tests.reference.hybrid_reference import Reference
from tests.reference.scr_reference import Conversation, Relocation, cold, distance

pytestmark = pytest.mark.engine

TOL = 1e-4
TOKENS = 8
CHUNK = 256  # SCR_ARGS' --chunked-prefill-size: the forwards a read is made of
SCR_ARGS = ["--schedule-policy", "fcfs", "--chunked-prefill-size", "256", "--max-running-requests", "4", "--max-total-tokens", "12288",
            "--cache-policy", "scr", "--cache-policy-set", "side_sessions=16",
            "--cache-policy-set", "side_tokens=4096"]
DISTANCES: list[dict] = []  # every comparison, written to .artifacts for the closing table


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return Reference(tiny_model_dir)


def start_scr(tiny_model_dir, tmp_path_factory, name, extra=(), env=None):
    """A scr test server (``SCR_ARGS`` and ``extra``), its events file at ``server.events_path``."""
    tmp = tmp_path_factory.mktemp(name)
    server = start_server(tiny_model_dir, tmp, name, [*SCR_ARGS, *extra, "--cache-events", str(tmp / "events.jsonl")],
                          env=env)
    server.events_path = tmp / "events.jsonl"
    return server


def assert_only_contained_failures(server):
    """Teardown of a server with injected faults: containment logs each failure's traceback;
    anything else fatal (a leak, a dead scheduler or rank, a broken invariant) fails."""
    assert [line for line in server.fatal_lines() if "Traceback" not in line] == [], server.log_tail()
    text = server.log_text()
    assert "Scheduler hit an exception" not in text and "invariant check failed" not in text, server.log_tail()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = start_scr(tiny_model_dir, tmp_path_factory, "scr_ref")
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


@pytest.fixture(scope="module", autouse=True)
def record_distances():
    yield
    from tests.conftest import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "scr_reference_distances.json").write_text(json.dumps(DISTANCES, indent=1))


# ---------------------------------------------------------------------------------------------- helpers


def phase1_hit(server, rid: str) -> int:
    """Where the server's tree served ``rid`` up to before its phase-1 read (``radix_a=`` of its phase1 line)."""
    for line in server.log_text().splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[20") and "] " in line else line
        parsed = parse_line(text) if text.startswith("[kvreuse]") else None
        if parsed and parsed["kind"] == "phase1" and parsed.get("rid") == rid:
            return parsed["radix_n0"]
    raise AssertionError(f"no phase1 line for {rid}")


def relocations(server, rid: str) -> list[Relocation]:
    """The server's decisions for ``rid``: one ``Relocation`` per spliced block, from its phase2 and
    ``v6 splice OK`` lines (stop, rows; old position = stop - rot_delta)."""
    phase2, splices = [], []
    for line in server.log_text().splitlines():
        text = line.split("] ", 1)[1] if line.startswith("[20") and "] " in line else line
        if not text.startswith("[kvreuse]"):
            continue
        parsed = parse_line(text)
        if parsed and parsed.get("rid") == rid:
            if parsed["kind"] == "phase2":
                phase2.append(parsed)
            elif parsed["kind"] == "splice_ok":
                splices.append(parsed)
    assert len(phase2) == len(splices)
    return [Relocation(s["stop"], s["stop"] - p["rot_delta"], s["relocated"]) for p, s in zip(phase2, splices)]


def ask(server, tokens, rid, salt=None):
    extra = {"extra_key": salt} if salt is not None else {}
    return output_record(server.generate(tokens, TOKENS, rid=rid, **extra))


def check(record, expected, label: str, tol: float = TOL) -> float:
    delta, ids_equal = distance(record["logprobs"], record["output_ids"], expected)
    DISTANCES.append({"case": label, "max_abs_logprob_delta": delta, "ids_equal": ids_equal})
    assert ids_equal, f"{label}: greedy ids {record['output_ids']} != reference {expected.argmax}"
    assert delta < tol, f"{label}: max |Δ logprob| {delta:.3g} >= {tol}"
    return delta


def edited(seed: int, cuts, new: int = 40) -> tuple[list[int], list[int]]:
    """A 2400-token first prompt and a second that drops each ``[a, b)`` of ``cuts`` and appends text."""
    first = prompt_ids(seed, 2400)
    second, position = [], 0
    for a, b in cuts:
        second += first[position:a]
        position = b
    return first, second + first[position:] + prompt_ids(seed + 1, new)


def run_two_turns(server, ref, seed, cuts, tag, salt=None, ssm_mode="fork"):
    """Turn 1 (cold) and the edited turn 2, each compared with the reference; returns the pieces.

    Turn 2 must have relocated the blocks the edit implies (its splice lines and its event's
    ``moved``): with no relocation the reference would be a plain read and the values would
    agree, so a case that never relocated could pass."""
    first, second = edited(seed, cuts)
    conversation = Conversation(ref)
    one = ask(server, first, f"{tag}.1", salt)
    check(one, conversation.serve(first, one["output_ids"]), f"{tag} turn 1 (cold)")
    two = ask(server, second, f"{tag}.2", salt)
    blocks = relocations(server, f"{tag}.2")
    assert blocks == expected_blocks(cuts), (tag, blocks)
    moved = wait_for_events(server.events_path, [f"{tag}.2"])[f"{tag}.2"]["moved"]
    assert moved == sum(b.rows for b in blocks) > 0, (tag, moved)
    expected = conversation.serve(second, two["output_ids"], blocks, ssm_mode=ssm_mode)
    return conversation, second, two, blocks, expected


def expected_blocks(cuts, old_len=2400, kext=16):
    """The plan the edit implies: each surviving run after a cut moves, minus its last kext tokens."""
    blocks, removed = [], 0
    ends = [a for a, _ in cuts[1:]] + [old_len]
    for (a, b), end in zip(cuts, ends):
        removed += b - a
        blocks.append(Relocation(b - removed, b, end - b - kext))
    return blocks


# ---------------------------------------------------------------------------------------------- cases


def test_one_block_off_the_chunk_grid(server, ref):
    """Deletion at 1400 (the tree's last state is at 1280): phase 1 reads [1280, 1400), 784 rows move."""
    cuts = [(1400, 1600)]
    _, _, two, blocks, expected = run_two_turns(server, ref, 101, cuts, "ref-one")
    assert blocks == expected_blocks(cuts)
    check(two, expected, "one block, stop off the grid, fork")


def test_one_block_on_the_chunk_grid_spliced_on_the_queue(server, ref):
    """Deletion at 1280 = 5 x 256: the radix match ends at the stop, the splice happens before
    admission and the fork restore replaces the state copied from the matched node."""
    cuts = [(1280, 1480)]
    _, _, two, blocks, expected = run_two_turns(server, ref, 111, cuts, "ref-grid")
    assert blocks == expected_blocks(cuts)
    check(two, expected, "one block, stop on the grid (direct splice), fork")
    # The trace (on by default) reads the state back: the restore landed (after == shadow) and
    # replaced a different state (before != after), i.e. nothing staged overwrote it.
    (restore,) = [line for line in server.log_text().splitlines() if "ev=ssm_restore" in line and "rid=ref-grid.2 " in line]
    fields = dict(item.split("=", 1) for item in restore.split("ev=ssm_restore ", 1)[1].split())
    assert fields["after"] == fields["shadow"] and fields["before"] != fields["after"]


def test_two_blocks(server, ref):
    cuts = [(1300, 1400), (1900, 2000)]
    _, _, two, blocks, expected = run_two_turns(server, ref, 121, cuts, "ref-two")
    assert blocks == expected_blocks(cuts)
    check(two, expected, "two blocks, fork")


def test_splice_on_the_queue_then_a_second_block(server, ref):
    """Block 1 spliced before admission (stop 1280 on the grid), then block 2: the request must stay
    a forced middle chunk up to block 2's stop, not sample there (review defect 2)."""
    cuts = [(1280, 1380), (1900, 2000)]
    _, second, two, blocks, expected = run_two_turns(server, ref, 131, cuts, "ref-queue2")
    assert blocks == expected_blocks(cuts)
    assert two["prompt_tokens"] == len(second)
    check(two, expected, "direct splice then a second block, fork")


def test_none_mode(server, ref):
    """``ssm=none``: no restore; the GDN layers continue from their own state at the stop."""
    cuts = [(1400, 1600)]
    salt = "kvreuse:knobs:ssm=none"
    _, _, two, blocks, expected = run_two_turns(server, ref, 141, cuts, "ref-none", salt, ssm_mode="none")
    assert blocks == expected_blocks(cuts)
    check(two, expected, "one block, none")
    # The same rows under fork would give other numbers: the mode is visible in the values.
    fork = Conversation(ref)
    first, second = edited(141, cuts)
    fork.serve(first, ask(server, first, "ref-none-probe", "probe-none")["output_ids"])
    forked = fork.serve(second, two["output_ids"], blocks, ssm_mode="fork")
    assert max(abs(a - b) for a, b in zip(forked.logprobs, expected.logprobs)) > 10 * TOL


def test_the_relocated_requests_next_turn(server, ref):
    """Turn 3 edits turn 2 again: its side rows are turn 2's own (relocated) rows and its fork state
    is turn 2's prompt-end state, both as the reference computed them."""
    cuts = [(1400, 1600)]
    conversation, second, two, blocks, expected = run_two_turns(server, ref, 151, cuts, "ref-next")
    check(two, expected, "turn 2 of three")
    third = second[:1800] + second[1950:] + prompt_ids(153, 40)
    three = ask(server, third, "ref-next.3")
    blocks3 = relocations(server, "ref-next.3")
    assert blocks3 and blocks3[0].stop == 1800 and blocks3[0].old_start == 1950
    # Turn 2's relocated rows are in the tree (the default): turn 3's phase 1 re-reads [1400, 1800),
    # whose tokens the tree holds, and after each forward SGLang points it at the tree's rows.
    expected3 = conversation.serve(third, three["output_ids"], blocks3, read_from=phase1_hit(server, "ref-next.3"),
                                   chunk=CHUNK)
    check(three, expected3, "turn 3 after a relocated turn 2")


def test_a_stale_state_makes_the_next_edit_decline(server, ref):
    """Turn 2 appends and finishes on its first token inside one chunk: it is released before the
    prefill-end hook, so the session's state is marked stale (its K/V is turn 2's, its state would
    be turn 1's). Under fork the edited turn 3 then relocates nothing and is a plain read."""
    first = prompt_ids(201, 2400)
    second = first + prompt_ids(202, 60)
    third = second[:1400] + second[1600:] + prompt_ids(203, 40)
    ask(server, first, "stale-next.1")
    server.generate(second, 1, rid="stale-next.2")
    assert "ssm snapshot dropped: rid=stale-next.2" in server.log_text()
    three = ask(server, third, "stale-next.3")
    events = wait_for_events(server.events_path, ["stale-next.3"])
    assert events["stale-next.3"]["moved"] == 0 and not relocations(server, "stale-next.3")
    check(three, cold(ref, third, three["output_ids"]), "stale state: plain read")


def test_a_rid_with_spaces_and_a_line_break_relocates(server, ref):
    """Any rid SGLang accepts gets SCR: a rid with a space made the authors' log line refuse to
    render, the plan fell back and the conversation was read plainly. Its lines are one line each
    (the rid percent-encoded) and read back to the same rid; the values equal the reference."""
    cuts = [(1400, 1600)]
    tag = "odd rid\nFinish: FORGED ü"
    _, _, two, blocks, expected = run_two_turns(server, ref, 211, cuts, tag)
    assert blocks == expected_blocks(cuts)
    check(two, expected, "a rid with a space and a line break")
    stray = [line for line in server.log_text().splitlines() if "FORGED" in line and not line.startswith("[20")]
    assert stray == [], stray


def test_cold_reads_equal_the_reference(server, ref):
    prompt = prompt_ids(161, 700)
    record = ask(server, prompt, "ref-cold", salt="ref-cold")
    check(record, cold(ref, prompt, record["output_ids"]), "cold read")


def test_without_rerotation_the_check_fails(server, ref):
    """Sensitivity: with ``rerot=0`` the served numbers differ from the rotating reference (so the
    harness sees a wrong rotation) and equal a reference that does not rotate either."""
    cuts = [(1400, 1600)]
    salt = "kvreuse:knobs:rerot=0"
    first, second = edited(171, cuts)
    rotating, plain = Conversation(ref), Conversation(ref)
    one = ask(server, first, "ref-norot.1", salt)
    rotating.serve(first, one["output_ids"])
    plain.serve(first, one["output_ids"])
    two = ask(server, second, "ref-norot.2", salt)
    blocks = relocations(server, "ref-norot.2")
    assert blocks == expected_blocks(cuts)
    check(two, plain.serve(second, two["output_ids"], blocks, rerotate_keys=False), "no re-rotation vs same")
    wrong = rotating.serve(second, two["output_ids"], blocks)
    delta, ids_equal = distance(two["logprobs"], two["output_ids"], wrong)
    DISTANCES.append({"case": "no re-rotation vs rotating reference", "max_abs_logprob_delta": delta,
                      "ids_equal": ids_equal})
    assert delta > 100 * TOL or not ids_equal, f"a missing rotation went unnoticed (Δ={delta:.3g})"


def test_two_tenants_with_identical_content_concurrently(server, ref):
    """Same conversation under two salts at once: each tenant's turn 2 relocates its own rows and
    equals the reference of its own history (nothing crosses between salts)."""
    cuts = [(1400, 1600)]
    first, second = edited(181, cuts)
    salts = ("tenant-x", "tenant-y")
    with ThreadPoolExecutor(2) as pool:
        ones = list(pool.map(lambda s: ask(server, first, f"ref-{s}.1", s), salts))
        twos = list(pool.map(lambda s: ask(server, second, f"ref-{s}.2", s), salts))
    events = wait_for_events(server.events_path, [f"ref-{s}.2" for s in salts])
    for salt, one, two in zip(salts, ones, twos):
        conversation = Conversation(ref)
        conversation.serve(first, one["output_ids"])
        blocks = relocations(server, f"ref-{salt}.2")
        assert events[f"ref-{salt}.2"]["moved"] == sum(b.rows for b in blocks) > 0
        check(two, conversation.serve(second, two["output_ids"], blocks), f"tenant {salt} turn 2")


def test_a_queue_splice_in_a_round_a_phase1_request_owns(server, ref):
    """One batch, fcfs: A starts phase 1 (stop 1500, off the grid) and owns the round; B's radix
    match ends at its stop (1280) so it is spliced on the waiting queue, then refused for the
    round. B's slots must come back (review defect 4: they leaked); both answers are SCR's."""
    a_first, a_second = edited(431, [(1500, 1700)])
    b_first, b_second = edited(441, [(1280, 1480)])
    conv_a, conv_b = Conversation(ref), Conversation(ref)
    conv_a.serve(a_first, ask(server, a_first, "crowd-a.1")["output_ids"])
    conv_b.serve(b_first, ask(server, b_first, "crowd-b.1")["output_ids"])
    response = server.post("/generate", {
        "input_ids": [a_second, b_second], "rid": ["crowd-a.2", "crowd-b.2"], "return_logprob": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
    })
    records = {item["meta_info"]["id"]: output_record(item) for item in response}
    for conv, prompt, rid, cuts in ((conv_a, a_second, "crowd-a.2", [(1500, 1700)]),
                                    (conv_b, b_second, "crowd-b.2", [(1280, 1480)])):
        blocks = relocations(server, rid)
        assert blocks == expected_blocks(cuts), (rid, blocks)
        check(records[rid], conv.serve(prompt, records[rid]["output_ids"], blocks), f"crowded round {rid}")
    server.flush_cache()  # the strict idle leak check runs once the scheduler is idle


# ---------------------------------------------------------------------------------------------- relocated rows in the tree


def relocated_then_appended(server, ref, seed: int, tag: str):
    """Turn 2 relocates one block (checked against the reference), turn 3 appends to turn 2's prompt
    and answer: (second, two, blocks, turn 2's reference, third, three, turn 3's event)."""
    _, second, two, blocks, expected = run_two_turns(server, ref, seed, [(1400, 1600)], tag)
    check(two, expected, f"{tag}: turn 2")
    third = second + two["output_ids"] + prompt_ids(seed + 2, 40)
    three = ask(server, third, f"{tag}.3")
    event = wait_for_events(server.events_path, [f"{tag}.3"])[f"{tag}.3"]
    return second, two, blocks, expected, third, three, event


def test_relocated_in_tree_and_its_next_append(server, ref):
    """The default, ``relocated_in_tree=1`` (the authors' code): turn 2's relocated rows and its final
    state enter the tree; turn 3 appends, resumes from them and must equal the reference continuing
    turn 2."""
    second, two, blocks, expected, third, three, event = relocated_then_appended(server, ref, 191, "tree")
    committed = len(second) + TOKENS - 1
    assert event["prefix_reused"] == committed and event["moved"] == 0, event
    resumed = Conversation(ref).serve(third, three["output_ids"], prefix=expected.cache)
    check(three, resumed, "relocated_in_tree=1, next append from the tree")


def test_a_second_edit_inside_the_relocated_rows(server, ref):
    """Turn 3 deletes a stretch inside the rows turn 2 relocated (and that sit in the tree): the
    tree serves only what was read exactly before turn 2's stop, phase 1 reads up to the new stop,
    and the rows after the deletion (turn 2's own relocated rows) move again."""
    cuts = [(1400, 1600)]
    conversation, second, two, blocks, expected = run_two_turns(server, ref, 221, cuts, "inside")
    check(two, expected, "turn 2 before an edit inside its relocated rows")
    assert blocks[0].stop == 1400 and blocks[0].rows > 400
    third = second[:1700] + second[1800:] + prompt_ids(223, 40)  # [1700, 1800) is inside [1400, 1400 + rows)
    three = ask(server, third, "inside.3")
    event = wait_for_events(server.events_path, ["inside.3"])["inside.3"]
    blocks3 = relocations(server, "inside.3")
    assert blocks3 and blocks3[0].stop == 1700 and blocks3[0].old_start == 1800, blocks3
    assert event["prefix_reused"] <= 1400 and event["moved"] == sum(b.rows for b in blocks3), event
    expected3 = conversation.serve(third, three["output_ids"], blocks3, read_from=phase1_hit(server, "inside.3"),
                                   chunk=CHUNK)
    check(three, expected3, "turn 3 edits inside relocated rows")
    # Sensitivity: a reference that keeps its fresh rows there (the ablation's tree) differs.
    first = edited(221, cuts)[0]
    fresh = Conversation(ref, relocated_in_tree=False)
    fresh.serve(first, ask(server, first, "inside-probe", "probe-inside")["output_ids"])
    fresh.serve(second, two["output_ids"], blocks)
    apart = fresh.serve(third, three["output_ids"], blocks3, read_from=phase1_hit(server, "inside.3"), chunk=CHUNK)
    assert max(abs(a - b) for a, b in zip(apart.logprobs, expected3.logprobs)) > 10 * TOL


@pytest.fixture(scope="module")
def notree_server(tiny_model_dir, tmp_path_factory):
    server = start_scr(tiny_model_dir, tmp_path_factory, "scr_ref_notree", ["--cache-policy-set", "relocated_in_tree=0"])
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


def test_without_relocated_rows_in_the_tree_the_next_append_rereads(notree_server, ref):
    """The ablation ``relocated_in_tree=0`` (their README's sentence): the tree keeps only what was
    read exactly, so the append after a relocated turn resumes at or before the stop and reads the
    rest: a plain read's values."""
    _, _, blocks, _, third, three, event = relocated_then_appended(notree_server, ref, 231, "notree")
    assert event["prefix_reused"] <= blocks[0].stop and event["moved"] == 0, event
    check(three, cold(ref, third, three["output_ids"]), "relocated_in_tree=0, next append re-reads")
