"""``--cache-policy scr`` when things go wrong: failing steps, retraction, crowded rounds.

One server with injected faults (``policy/faults.py``: a named SCR step raises for the rids of one
test) and SGLang's test retraction (``SGLANG_TEST_RETRACT``: every third decode round retracts a
request when two or more decode). SGLang's strict idle leak check stays on: a slot not given back
stops the scheduler, which the module teardown reports. Every answer that fell back to a plain
read is compared with the independent reference's cold read of the same prompt.
"""

from __future__ import annotations

import pytest

from eval.server import output_record, wait_for_events
from tests.engine.prompts import prompt_ids
from tests.engine.test_scr_reference import TOL, assert_only_contained_failures, check, edited, relocations, start_scr
from tests.reference.hybrid_reference import Reference
from tests.reference.scr_reference import Conversation, cold

pytestmark = pytest.mark.engine

FAULTS = ",".join([
    "scr.restore_state~fault-restore@1",  # block 1's state restore fails
    "scr.place_rows~fault-place@1",  # copying side rows into the pool fails
    "scr.side_store~fault-store@1",  # the side store at the first release fails
    "scr.round~fault-round@1+",  # every plan step of these requests fails
])


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return Reference(tiny_model_dir)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = start_scr(tiny_model_dir, tmp_path_factory, "scr_faults",
                       env={"CACHE_POLICY_FAULTS": FAULTS, "SGLANG_TEST_RETRACT": "1"})
    yield server
    server.stop()
    assert_only_contained_failures(server)


def ask(server, tokens, rid, max_new_tokens=8):
    return output_record(server.generate(tokens, max_new_tokens, rid=rid))


def event(server, rid):
    return wait_for_events(server.events_path, [rid])[rid]


@pytest.mark.parametrize("tag,step,seed", [("fault-restore", "restore", 301), ("fault-place", "place", 311),
                                           ("fault-round", "round", 321)])
def test_a_failing_step_ends_in_a_plain_read(server, ref, tag, step, seed):
    """The step raises on the edited turn: no rows move, the answer is the cold read's, the event
    says why, and the server keeps serving (the next request is answered)."""
    first, second = edited(seed, [(1400, 1600)])
    ask(server, first, f"{tag}.1")
    two = ask(server, second, f"{tag}.2")
    record = event(server, f"{tag}.2")
    assert record["moved"] == 0 and record["fallback"] and step in record["fallback"], record
    check(two, cold(ref, second, two["output_ids"]), f"{step} fault -> plain read")
    assert f"rid={tag}.2 step=" in server.log_text()
    assert len(ask(server, prompt_ids(7, 64), f"{tag}.after")["output_ids"]) == 8


def test_a_failing_side_store_drops_the_session(server, ref):
    """The store fails at turn 1's release: the half-written slot is given up, so turn 2 cannot
    relocate from it (a plain read, equal to the cold reference)."""
    first, second = edited(401, [(1400, 1600)])
    ask(server, first, "fault-store.1")
    assert "store" in (event(server, "fault-store.1")["fallback"] or "")
    two = ask(server, second, "fault-store.2")
    assert event(server, "fault-store.2")["moved"] == 0
    check(two, cold(ref, second, two["output_ids"]), "store fault -> next turn plain")


def test_retracted_spliced_requests_give_everything_back(server, ref):
    """Two spliced requests decode together (one batched request); test retraction takes one of
    them back every third round. A retracted request is read again without relocation and finishes; nothing leaks
    (strict idle check), and its event counts the retraction and says why it fell back.

    Values: a request never retracted equals the SCR reference of its conversation throughout; a
    retracted one equals it up to some output token r and, from r on, the cold reference (its
    prompt and answer so far read again plainly): a re-read that still used relocated rows, or
    a retraction that lost or repeated a token, has no such r."""
    convs = [edited(seed, [(1400, 1600)]) for seed in (411, 421)]
    conversations = [Conversation(ref) for _ in convs]
    for n, (first, _) in enumerate(convs):
        one = ask(server, first, f"retract-{n}.1")
        conversations[n].serve(first, one["output_ids"])
    # One batched request: both reach the scheduler together, so they decode side by side for all
    # 24 rounds (two separate requests would have to overlap by timing luck).
    response = server.post("/generate", {
        "input_ids": [second for _, second in convs], "rid": [f"retract-{n}.2" for n in range(2)],
        "return_logprob": True, "sampling_params": {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True},
    })
    by_rid = {item["meta_info"]["id"]: output_record(item) for item in response}
    twos = [by_rid[f"retract-{n}.2"] for n in range(2)]
    events = [event(server, f"retract-{n}.2") for n in range(2)]
    assert all(len(two["output_ids"]) == 24 for two in twos)
    assert sum(e["retractions"] for e in events) > 0, events
    for n, (e, two) in enumerate(zip(events, twos)):
        assert e["moved"] > 0  # both relocated at admission
        second, ids = convs[n][1], two["output_ids"]
        spliced = conversations[n].serve(second, ids, relocations(server, f"retract-{n}.2"))
        if not e["retractions"]:
            check(two, spliced, "decoded beside a retracted request")
            continue
        assert e["fallback"].startswith("retracted"), e
        plain = cold(ref, second, ids)
        switch = [r for r in range(len(ids) + 1)
                  if all(abs(a - b) < TOL for a, b in zip(two["logprobs"][:r], spliced.logprobs[:r]))
                  and all(abs(a - b) < TOL for a, b in zip(two["logprobs"][r:], plain.logprobs[r:]))]
        assert switch and min(switch) < len(ids), (two["logprobs"], spliced.logprobs, plain.logprobs)
        r = min(switch)
        assert ids[:r] == spliced.argmax[:r] and ids[r:] == plain.argmax[r:]
    assert len(ask(server, prompt_ids(9, 64), "retract.after")["output_ids"]) == 8


@pytest.mark.parametrize("knob", ["pin=1", "lead=1", "force=1", "v6=0"])
def test_a_single_phase_knob_is_refused_per_request(server, knob):
    """The single-phase path is not ported: a salt asking for it gets a 400 naming the knob (it
    used to run full SCR silently), and the server keeps serving."""
    with pytest.raises(RuntimeError, match=r"-> 400: .*" + knob.split("=")[0]):
        server.generate(prompt_ids(13, 64), 4, rid=f"knob-{knob}", extra_key=f"kvreuse:knobs:{knob}")
    assert len(ask(server, prompt_ids(13, 64), f"knob-{knob}.after")["output_ids"]) == 8
