"""Forced decoding (``patches/forced.py``) and ``python -m eval.replay`` on a served tiny model.

One ``--cache-policy radix`` server for the module (no extra flag: the launcher turns SGLang's
logit processors on itself): forced ids come back as sent (logprob 0 each), bad forcing and a
client-supplied ``custom_logit_processor`` get a 400 naming the field and the server keeps
serving. Then the point of replay: a four-turn conversation (append, a section deleted from the
middle, append) is served unforced and greedy, recorded as a trace, the cache flushed, and the
trace replayed forced under another salt; every request must get the same ``cached_tokens`` and
the same events (reused, moved, read, decode) as the unforced run: forcing does not change what
the cache does. The same comparison runs on an ``scr`` server (moved rows included).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from eval.accounting.provenance import check_client, rows_from_events
from eval.replay.run import run_replay
from eval.server import wait_for_events
from eval.traces.format import TraceCall, write_trace
from policy.events import RequestEvent
from tests.engine.conftest import RADIX_ARGS, start_server
from tests.engine.prompts import prompt_ids

pytestmark = pytest.mark.engine

VOCAB = 512  # the tiny model's embedding rows
DECODE = 8
FIELD = "sampling_params.custom_params.forced_output_ids"
EVENT_FIELDS = ("prompt_tokens", "prefix_reused", "moved", "read", "decode_tokens", "blocks")
ROOM = ["--max-total-tokens", "12288"]  # the conversation's ~2,400 tokens stay cached between turns
# 256-token prefill forwards (a later flag wins): ~10 recurrent-state checkpoints per prompt, so the
# 32-slot state pool keeps the one before the edit (with 32-token forwards it evicts it: reuse 0).
CHUNK = ["--chunked-prefill-size", "256"]


def _server(tiny_model_dir, tmp_path_factory, name: str, args: list[str], state_pool: bool = True):
    tmp = tmp_path_factory.mktemp(name)
    server = start_server(tiny_model_dir, tmp, name, [*args, "--cache-events", str(tmp / "events.jsonl")],
                          state_pool=state_pool)
    server.events_path = tmp / "events.jsonl"
    server.tmp = tmp
    return server


def _stop(server) -> None:
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "Scheduler hit an exception" not in server.log_text(), server.log_tail()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = _server(tiny_model_dir, tmp_path_factory, "replay_radix", [*RADIX_ARGS, *ROOM, *CHUNK, "--cache-policy", "radix"])
    yield server
    _stop(server)


# exact under forced replay is covered by tests/engine/test_bench_policies.py (every call's reuse
# equals exact_cache.replay); scr is compared here because forcing must not change what it moves.
POLICY_ARGS = {
    "scr": (["--cache-policy", "scr", *CHUNK, "--max-running-requests", "4", *ROOM,
             "--cache-policy-set", "side_sessions=16"], True),
}


@pytest.fixture(scope="module", params=sorted(POLICY_ARGS))
def policy_server(request, tiny_model_dir, tmp_path_factory):
    args, state_pool = POLICY_ARGS[request.param]
    server = _server(tiny_model_dir, tmp_path_factory, f"replay_{request.param}", args, state_pool)
    server.policy = request.param
    yield server
    _stop(server)


def send(server, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + "/generate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def forced_payload(ids, **params) -> dict:
    return {"input_ids": prompt_ids(5, 40), "return_logprob": True,
            "sampling_params": {"temperature": 0.0, "custom_params": {"forced_output_ids": ids}, **params}}


def assert_refused(server, payload: dict, field: str) -> str:
    status, body = send(server, payload)
    message = body.get("error", {}).get("message") if "error" in body else body.get("message")
    assert status == 400 and message.startswith(f"{field}: "), (status, body)
    status, good = send(server, {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and len(good["output_ids"]) == 2  # still serving
    return message


# ---------------------------------------------------------------------- forced decoding


def test_forced_ids_come_back_with_logprob_zero(server):
    ids = [7, 7, 7, 300, 11, 479]  # not what the model would say
    status, body = send(server, forced_payload(ids))  # max_new_tokens and ignore_eos filled in
    assert status == 200, body
    assert body["output_ids"] == ids
    assert [entry[0] for entry in body["meta_info"]["output_token_logprobs"]] == [0.0] * len(ids)
    status, body = send(server, forced_payload([9, 8], max_new_tokens=2, temperature=1.0, top_p=0.5))
    assert status == 200 and body["output_ids"] == [9, 8]  # sampling forced too


def test_forced_id_outside_the_vocabulary_is_a_400(server):
    message = assert_refused(server, forced_payload([1, VOCAB]), FIELD)
    assert f"token id {VOCAB} at position 1 is outside the vocabulary" in message
    assert "max_new_tokens is 3" in assert_refused(server, forced_payload([1, 2], max_new_tokens=3), FIELD)
    assert_refused(server, forced_payload([]), FIELD)


def test_client_logit_processor_is_a_400(server):
    code = json.dumps({"callable": "80049500"})  # never deserialized: refused before the scheduler
    payload = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "custom_logit_processor": code}
    assert "--enable-custom-logit-processor" in assert_refused(server, payload, "custom_logit_processor")


# ---------------------------------------------------------------------- replay = unforced, cache-wise


def unforced_conversation(server, run: str, salt: str) -> list[TraceCall]:
    """Four greedy turns: a 2400-token message, an append, a section deleted from the middle
    (1,400 tokens kept in front, so scr finds the session and moves the ~800 after the cut), an
    append. Each prompt is the previous prompt + its answer + new ids."""
    calls, context = [], []
    for turn in range(4):
        if turn == 0:
            prompt = prompt_ids(40, 2400)
        elif turn == 2:
            prompt = context[:1400] + context[1600:] + prompt_ids(40 + turn, 30)
        else:
            prompt = context + prompt_ids(40 + turn, 30)
        answer = server.generate(prompt, DECODE, rid=f"{run}.conv.{turn}", extra_key=salt)
        calls.append(TraceCall("conv", turn, prompt, list(answer["output_ids"]), salt, kind="unforced",
                               meta={"cached_tokens": answer["meta_info"]["cached_tokens"]}))
        context = prompt + list(answer["output_ids"])
    return calls


def events_by_turn(server, run: str, turns: int) -> list[dict]:
    rids = [f"{run}.conv.{t}" for t in range(turns)]
    found = wait_for_events(server.events_path, rids)
    assert set(rids) <= set(found), sorted(found)
    return [found[rid] for rid in rids]


def replay_equals_unforced(server, name: str, moves: bool = False) -> None:
    server.flush_cache()
    calls = unforced_conversation(server, f"{name}u", "salt-unforced")
    trace = [TraceCall(c.conversation, c.turn, c.prompt_ids, c.completion_ids, "salt-forced") for c in calls]
    write_trace(trace, server.tmp / f"{name}.trace.jsonl")
    server.flush_cache()
    out = server.tmp / f"{name}-replay"
    result = run_replay(server.url, server.tmp / f"{name}.trace.jsonl", out, run=f"{name}f", progress=None)
    assert result["sent"] == 4  # every answer equalled the trace (a Mismatch would have raised)
    client = [json.loads(line) for line in (out / "client.jsonl").read_text().splitlines()]
    assert [r["cached_tokens"] for r in client] == [c.meta["cached_tokens"] for c in calls]
    unforced, replayed = events_by_turn(server, f"{name}u", 4), events_by_turn(server, f"{name}f", 4)
    for before, after in zip(unforced, replayed):
        assert {k: before[k] for k in EVENT_FIELDS} == {k: after[k] for k in EVENT_FIELDS}, (before, after)
        assert (before["cache_salt"], after["cache_salt"]) == ("salt-unforced", "salt-forced")
    assert all(e["prefix_reused"] > 0 for e in replayed[1:])  # every later turn reused a prefix
    assert (sum(e["moved"] for e in replayed) > 0) == moves  # scr relocated rows in the edited turn
    rows = rows_from_events([RequestEvent.from_dict(e) for e in replayed], 1.0)
    assert check_client(rows, client) == []  # eval.report ingest --client joins these records


def test_replay_caches_like_the_unforced_run(server):
    replay_equals_unforced(server, "radix")


def test_replay_caches_like_the_unforced_run_under_policy(policy_server):
    replay_equals_unforced(policy_server, "pol", moves=policy_server.policy == "scr")


def test_empty_completion_reads_the_prompt(server, tmp_path):
    prompt = prompt_ids(77, 100)
    write_trace([TraceCall("e", 0, prompt, [], None), TraceCall("e", 1, prompt + [12, 13], [14], None)],
                tmp_path / "trace.jsonl")
    run_replay(server.url, tmp_path / "trace.jsonl", tmp_path / "out", run="empty", progress=None)
    client = [json.loads(line) for line in (tmp_path / "out" / "client.jsonl").read_text().splitlines()]
    assert [r["usage"]["completion_tokens"] for r in client] == [0, 1]
    assert client[1]["cached_tokens"] > 0  # the prompt-only call was cached
