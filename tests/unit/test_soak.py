"""``eval.soak``: conversation edits, malformed kinds and checks table by table, then the CLI end to
end against a fake server on 127.0.0.1 (``/generate``, ``/v1/completions``, ``/abort_request``,
``/flush_cache``, ``/v1/models``, ``/v1/loads``; an events file and a log), with its exit codes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eval.soak import checks, malformed
from eval.soak.__main__ import main
from eval.soak.conversation import (
    EDIT_KINDS, Conversation, ConversationConfig, apply_edit, common_prefix, first_prompt, fit, random_ids,
)
from eval.soak.run import format_table, run_soak
from scr.authors_log import format_line

ROOT = Path(__file__).resolve().parents[2]
CFG = ConversationConfig()

# ------------------------------------------------------------------------------ conversations


@pytest.mark.parametrize("kind, length, answer, check", [
    ("repeat", 1500, 8, lambda old, new, ans: new == old),
    ("append", 1500, 8, lambda old, new, ans: new[:len(old) + len(ans)] == old + ans and len(new) > len(old) + 8),
    ("delete_middle", 1500, 8, lambda old, new, ans: common_prefix(old, new) >= 1024 and (old + ans)[-16:] in
     [new[i:i + 16] for i in range(len(new) - 15)]),
    ("replace_tail", 1500, 8, lambda old, new, ans: 1024 <= common_prefix(old, new) < len(old)),
    # short prompts (below keep): the edit still keeps a leading part
    ("delete_middle", 400, 0, lambda old, new, ans: common_prefix(old, new) >= 100),
    ("replace_tail", 400, 0, lambda old, new, ans: common_prefix(old, new) >= 200),
    # at the cap: append cuts from keep on to stay under max_prompt
    ("append", 2500, 8, lambda old, new, ans: len(new) <= 2500 and new[:1024] == old[:1024]),
])
def test_edit_kinds(kind, length, answer, check):
    rng = random.Random(7)
    old = random_ids(rng, length)
    ans = [450 + i for i in range(answer)]
    new = apply_edit(kind, old, ans, rng, CFG)
    assert check(old, new, ans), (kind, len(old), len(new), common_prefix(old, new))


def test_unknown_edit_kind():
    with pytest.raises(ValueError, match="unknown edit kind"):
        apply_edit("rotate", [1, 2, 3], [], random.Random(0), CFG)


def test_conversations_keep_1024_leading_tokens_and_stay_in_range():
    long_kept = long_total = 0
    kinds = set()
    for index in range(60):
        conv = Conversation.start(seed=3, index=index, tenant=index % 4, cfg=CFG)
        assert CFG.min_turns <= conv.turns <= CFG.max_turns
        first = None
        answer = None
        while not conv.done:
            kind, prompt = conv.next_prompt(answer)
            kinds.add(kind)
            assert CFG.min_prompt <= len(prompt) <= CFG.max_prompt or kind != "first"
            assert len(prompt) <= CFG.max_prompt
            if first is None:
                first = prompt
                assert all(10 <= t < 400 for t in prompt)
            elif len(first) > CFG.keep + 32:
                long_total += 1
                long_kept += prompt[:CFG.keep] == first[:CFG.keep]
            answer = [400 + conv.turn]  # the model may answer outside the prompt id range
    assert kinds == {"first", *EDIT_KINDS}
    assert long_total > 100 and long_kept == long_total  # every turn of a long conversation keeps 1024


def test_conversations_are_deterministic_per_seed_and_index():
    a = Conversation.start(1, 5, 1, CFG)
    b = Conversation.start(1, 5, 1, CFG)
    c = Conversation.start(2, 5, 1, CFG)
    assert [a.next_prompt([]) for _ in range(3)] == [b.next_prompt([]) for _ in range(3)]
    assert a.prompt != c.next_prompt([])[1]


def test_most_first_prompts_are_long():
    rng = random.Random(0)
    lengths = [len(first_prompt(rng, CFG)) for _ in range(400)]
    long = sum(n >= CFG.keep + 64 for n in lengths)
    assert 0.7 < long / 400 < 0.9 and min(lengths) >= 300 and max(lengths) <= 2500


def test_fit_cuts_after_keep():
    rng = random.Random(1)
    prompt = list(range(3000))
    cut = fit(prompt, CFG, rng)
    assert len(cut) == 2500 and cut[:1024] == prompt[:1024] and cut[-10:] == prompt[-10:]
    assert fit(prompt[:100], CFG, rng) == prompt[:100]


@pytest.mark.parametrize("kwargs, message", [
    ({"max_prompt": 1000}, "must exceed keep"),
    ({"min_prompt": 0}, "min_prompt"),
    ({"short_share": 2}, "short_share"),
    ({"weights": (1, 1)}, "weights"),
    ({"low": 5, "high": 5}, "low"),
])
def test_bad_conversation_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConversationConfig(**kwargs)


# ------------------------------------------------------------------------------ malformed kinds


def test_malformed_sets():
    ctx = malformed.MalformedContext(context_len=100)
    assert malformed.kinds("none", ctx) == []
    assert malformed.kinds("safe", ctx) == ["empty_ids", "max_new_tokens_negative", "temperature_negative",
                                            "prompt_too_long"]
    assert set(malformed.kinds("all", ctx)) >= {"id_over_vocab", "id_negative", "extra_key_wrong_type"}
    assert "prompt_too_long" not in malformed.kinds("safe", malformed.MalformedContext(None))
    with pytest.raises(ValueError, match="one of none, safe, all"):
        malformed.kinds("some", ctx)


@pytest.mark.parametrize("kind, path, check", [
    ("empty_ids", "/generate", lambda b: b["input_ids"] == []),
    ("max_new_tokens_negative", "/generate", lambda b: b["sampling_params"]["max_new_tokens"] == -1),
    ("temperature_negative", "/generate", lambda b: b["sampling_params"]["temperature"] < 0),
    ("prompt_too_long", "/generate", lambda b: len(b["input_ids"]) == 116),
    ("id_over_vocab", "/generate", lambda b: max(b["input_ids"]) >= 10**9),
    ("id_negative", "/generate", lambda b: min(b["input_ids"]) == -1),
    ("id_not_int", "/generate", lambda b: "x" in b["input_ids"]),
    ("top_p_zero", "/generate", lambda b: b["sampling_params"]["top_p"] == 0),
    ("max_new_tokens_not_int", "/generate", lambda b: b["sampling_params"]["max_new_tokens"] == "ten"),
    ("extra_key_wrong_type", "/generate", lambda b: b["extra_key"] == 12345),
    ("cache_salt_wrong_type", "/v1/completions", lambda b: isinstance(b["cache_salt"], dict)),
    ("body_not_json", "/generate", lambda b: isinstance(b, bytes)),
])
def test_malformed_builders(kind, path, check):
    got_path, body = malformed.build(kind, random.Random(0), "r.bad.1", [11, 12, 13, 14],
                                     malformed.MalformedContext(context_len=100))
    assert got_path == path and check(body)
    if not isinstance(body, bytes):
        assert body["rid"] == "r.bad.1"


# ------------------------------------------------------------------------------ checks


def event(rid, prompt=100, reused=0, moved=0, read=None, salt="s", policy="radix", finish="length"):
    return {"rid": rid, "policy": policy, "prompt_tokens": prompt, "prefix_reused": reused, "moved": moved,
            "read": prompt - reused - moved if read is None else read, "cache_salt": salt, "finish_reason": finish}


@pytest.mark.parametrize("events, expected, policy, offenders", [
    ({"a": event("a", 100, 40)}, ["a"], "radix", 0),
    ({"a": event("a", 100, 40, read=50)}, ["a"], "radix", 1),  # 40 + 0 + 50 != 100
    ({"a": event("a", 100, 120, read=-20)}, ["a"], "radix", 1),  # identity holds, a part < 0
    ({"a": event("a", 100, 20, 30)}, ["a"], "scr", 0),
    ({"a": event("a", 100, 20, 30)}, ["a"], "exact", 1),  # moved under exact
    ({"a": event("a")}, ["a", "b"], "radix", 1),  # b answered, no event
    ({"a": {"rid": "a", "prompt_tokens": 3}}, [], None, 1),
])
def test_check_event_identity(events, expected, policy, offenders):
    check = checks.check_event_identity(events, expected, policy)
    assert check.count == offenders and check.status == (checks.FAIL if offenders else checks.PASS)


def test_parse_and_scope_events():
    text = json.dumps(event("run.c1.1")) + "\n" + json.dumps(event("other.c1.1")) + "\n" + '{"rid": "run.c'
    assert list(checks.run_events(checks.parse_events(text), "run.")) == ["run.c1.1"]
    with pytest.raises(ValueError, match="line 1"):
        checks.parse_events("{nope\n" + json.dumps(event("a")) + "\n")


def probe(rid, status=200, cached=0):
    return {"rid": rid, "status": status, "cached_tokens": cached, "source_rid": "run.c1.2"}


@pytest.mark.parametrize("probes, events, salts, offenders", [
    ([probe("p1")], {"p1": event("p1", salt="fresh")}, {"p1": "fresh"}, 0),
    ([probe("p1", cached=64)], {"p1": event("p1")}, {}, 1),
    ([probe("p1")], {"p1": event("p1", reused=64)}, {}, 1),
    ([probe("p1")], {"p1": event("p1", reused=0, moved=10, policy="scr")}, {}, 1),
    ([probe("p1")], {}, {}, 1),  # no event for the probe
    ([probe("p1")], None, {}, 0),  # no events file: the response alone
    ([probe("p1", status=500)], None, {}, 1),
    ([probe("p1")], {"p1": event("p1", salt="x"), "t": event("t", salt="other")}, {"t": "tenant"}, 1),
    ([], {}, {}, 1),  # nothing probed is a failure
])
def test_check_isolation(probes, events, salts, offenders):
    assert checks.check_isolation(probes, events, salts).count == offenders


def trace(rid, sid):
    return "[2026-01-01 00:00:00 TP0] " + format_line("trace_req", rid=rid, sid=sid, slot=0, n_new=1200, n_old=0,
                                                      nsess=1, tag="x")


def splice(rid, sid):
    return "[2026-01-01 00:00:00 TP0] " + format_line(
        "splice_ok", rid=rid, sid=sid, slot=0, stop=1100, relocated=300, extend=16, live=1400, spliced=1,
        spliced_tokens=300, block=1, num_blocks=1)


SALTS = {"r.c1.1": "A", "r.c1.2": "A", "r.c2.1": "B", "r.c2.2": "B"}


@pytest.mark.parametrize("lines, offenders", [
    ([trace("r.c1.1", "s1"), trace("r.c2.1", "s2"), trace("r.c1.2", "s1"), splice("r.c1.2", "s1")], 0),
    # a splice from a session created under salt B
    ([trace("r.c1.1", "s1"), trace("r.c2.1", "s2"), trace("r.c1.2", "s1"), splice("r.c1.2", "s2")], 1),
    # one session served two salts (and the splice came from it)
    ([trace("r.c1.1", "s1"), trace("r.c2.2", "s1"), splice("r.c2.2", "s1")], 2),
    # a splice from a session no request of this run created
    ([trace("r.c1.2", "s9"), splice("r.c1.2", "s7")], 1),
    # other clients' splices are not judged
    ([trace("x.1", "s5"), splice("x.1", "s5"), "unrelated line", "[kvreuse] something else"], 0),
])
def test_check_scr_sessions(lines, offenders):
    check = checks.check_scr_sessions(lines, SALTS)
    assert check.count == offenders, check.offenders


def test_scr_session_lines_parses_prefixed_lines():
    traces, splices = checks.scr_session_lines([trace("r.c1.1", "s000001"), splice("r.c1.2", "s000001")])
    assert traces == [("r.c1.1", "s000001")] and splices == [("r.c1.2", "s000001")]


def answer(ids, lps, cached, status=200):
    return {"status": status, "output_ids": ids, "logprobs": lps, "cached_tokens": cached}


@pytest.mark.parametrize("warm, cold, offenders", [
    (answer([1, 2], [-0.5, -0.25], 64), answer([1, 2], [-0.5, -0.25], 0), 0),
    (answer([1, 3], [-0.5, -0.25], 64), answer([1, 2], [-0.5, -0.25], 0), 1),
    (answer([1, 2], [-0.5, -0.25000001], 64), answer([1, 2], [-0.5, -0.25], 0), 1),  # bit for bit
    (answer([1, 2], [-0.5, -0.25], 0), answer([1, 2], [-0.5, -0.25], 0), 1),  # the warm one missed
    (answer([1, 2], [-0.5, -0.25], 64), answer([1, 2], [-0.5, -0.25], 8), 1),  # the cold one hit
    (answer([1, 2], [-0.5, -0.25], 64, status=500), answer([1, 2], [-0.5, -0.25], 0), 1),
])
def test_check_exact_pairs(warm, cold, offenders):
    check = checks.check_exact_pairs([{"source_rid": "r.c1.1", "warm": warm, "cold": cold}], wanted=1)
    assert check.count == offenders, check.offenders


def test_check_exact_pairs_wants_k():
    assert checks.check_exact_pairs([], wanted=2).status == checks.FAIL


def test_first_difference():
    assert checks.first_difference([1, 2], [1, 2]) is None
    assert checks.first_difference([1, 2], [1, 3]) == 1
    assert checks.first_difference([1, 2], [1, 2, 3]) == 2


@pytest.mark.parametrize("statuses, offenders", [
    ([400, 422, 413], 0), ([400, 500], 1), ([200], 1), ([None], 1), ([], 0),
])
def test_check_malformed(statuses, offenders):
    records = [{"rid": f"b{i}", "malformed": "empty_ids", "status": s} for i, s in enumerate(statuses)]
    check = checks.check_malformed(records)
    assert check.count == offenders
    assert check.status == (checks.SKIPPED if not statuses else checks.FAIL if offenders else checks.PASS)


@pytest.mark.parametrize("record, bad", [
    ({"status": 200, "finish_reason": "length"}, False),
    ({"status": 200, "finish_reason": "abort"}, True),  # not aborted by the soak
    ({"status": 200, "finish_reason": "length", "error": "answer without output_ids"}, True),
    ({"status": 400}, True),
    ({"status": 503}, True),
    ({"status": None, "error": "connection error"}, True),
    ({"status": None, "abort": "disconnect"}, False),
    ({"status": 200, "finish_reason": "abort", "abort": "abort_request"}, False),
    ({"status": 500, "abort": "timeout"}, True),
    ({"status": 200, "abort": "abort_request", "abort_status": 200}, False),
    ({"status": 200, "abort": "abort_request", "abort_status": 500}, True),
])
def test_check_wellformed(record, bad):
    assert checks.check_wellformed([{"rid": "r", **record}]).count == int(bad)


def test_fatal_and_leak_lines():
    lines = ["ok", "Traceback (most recent call last):", "x Scheduler hit an exception: y",
             "token_to_kv_pool memory leak detected! available=3"]
    assert checks.check_fatal_lines(lines).count == 3
    assert checks.check_idle_leak(2, 1.0, lines).count == 1
    assert checks.check_idle_leak(None, 1.0, ["fine"]).count == 1
    assert checks.check_idle_leak(1, 1.0, None).status == checks.PASS


# ------------------------------------------------------------------------------ fake server

VOCAB = 512
CONTEXT = 8192


class FakeServer:
    """A tiny stand-in for SGLang: a per-salt prefix cache (64-token grain), deterministic answers,
    the 4xx validation of the malformed kinds, aborts, an events file and a log.

    Knobs: ``leak`` (one cache for all salts), ``five_hundred`` (that malformed kind gets a 500),
    ``warm_differs`` (a cache hit changes the first logprob), ``leak_marker`` (``/flush_cache``
    logs SGLang's leak line), ``scr_cross`` (scr log: turn 2 of every conversation splices from
    another tenant's session), ``policy``, ``token_s`` (seconds per generated token: a slow or a
    fast machine)."""

    def __init__(self, tmp: Path, policy="radix", leak=False, five_hundred=None, warm_differs=False,
                 leak_marker=False, scr_cross=False, token_s=0.003):
        self.token_s = token_s
        self.events, self.log = tmp / "events.jsonl", tmp / "server.log"
        self.log.write_text("The server is fired up and ready to roll!\n")
        self.policy, self.leak, self.five_hundred = policy, leak, five_hundred
        self.warm_differs, self.leak_marker, self.scr_cross = warm_differs, leak_marker, scr_cross
        self.lock = threading.Lock()
        self.seen: dict[str, list[list[int]]] = {}
        self.aborted: set[str] = set()
        self.inflight = 0
        self.sessions: dict[tuple, str] = {}
        self.paths: list[str] = []

    def write_log(self, line: str) -> None:
        with self.lock, open(self.log, "a") as f:
            f.write(line + "\n")

    def validate(self, body) -> str | None:
        if not isinstance(body, dict):
            return "not a JSON object"
        ids = body.get("input_ids", body.get("prompt"))
        if not isinstance(ids, list) or not ids:
            return "input_ids cannot be empty"
        if any(not isinstance(t, int) or isinstance(t, bool) for t in ids):
            return "ids must be ints"
        if any(t < 0 or t >= VOCAB for t in ids):
            return "token id outside the vocabulary"
        if len(ids) >= CONTEXT:
            return "longer than the context"
        for key in ("extra_key", "cache_salt"):
            if body.get(key) is not None and not isinstance(body[key], str):
                return f"{key} must be a string"
        params = body.get("sampling_params") or {"max_new_tokens": body.get("max_tokens", 16),
                                                 "temperature": body.get("temperature", 1.0)}
        n = params.get("max_new_tokens", 16)
        if not isinstance(n, int) or n < 0:
            return "max_new_tokens"
        if params.get("temperature", 1.0) < 0:
            return "temperature"
        if not 0 < params.get("top_p", 1.0) <= 1:
            return "top_p"
        return None

    def cached(self, salt, prompt) -> int:
        key = "*" if self.leak else salt
        with self.lock:
            seen = self.seen.setdefault(key, [])
            best = max((common_prefix(p, prompt) for p in seen), default=0)
            seen.append(list(prompt))
        return min(best // 64 * 64, (len(prompt) - 1) // 64 * 64)

    def scr_lines(self, rid: str, salt: str) -> None:
        parts = rid.split(".")
        if self.policy != "scr" or len(parts) != 3 or not parts[1].startswith("c"):
            return
        key = (salt, parts[1])
        with self.lock:
            sid = self.sessions.setdefault(key, f"s{len(self.sessions):06d}")
            others = [s for (k, _), s in self.sessions.items() if k != salt]
        self.write_log(trace(rid, sid))
        if parts[2] == "2":
            self.write_log(splice(rid, others[0] if self.scr_cross and others else sid))

    def generate(self, handler, body: dict, completions: bool) -> None:
        problem = self.validate(body)
        if problem is not None:
            rid = str(body.get("rid", "")) if isinstance(body, dict) else ""
            status = 500 if self.five_hundred and rid.endswith(self.five_hundred) else 400
            return handler.send(status, {"error": {"message": problem}})
        rid = body["rid"]
        salt = body.get("cache_salt") if completions else body.get("extra_key")
        prompt = body["prompt"] if completions else body["input_ids"]
        n = body["max_tokens"] if completions else body["sampling_params"]["max_new_tokens"]
        cached = self.cached(salt, prompt)
        self.scr_lines(rid, salt)
        ids = [(sum(prompt) + i) % 300 + 10 for i in range(n)]
        lps = [-0.5 - i / 64 for i in range(n)]
        if self.warm_differs and cached:
            lps[0] += 2 ** -20
        finish = "length"
        with self.lock:
            self.inflight += 1
        try:
            if body.get("stream"):
                handler.start_stream()
                for i in range(n):
                    handler.chunk({"output_ids": ids[: i + 1]})
                    time.sleep(self.token_s)
            else:
                for _ in range(n):
                    if rid in self.aborted:
                        finish = "abort"
                        break
                    time.sleep(self.token_s)
                meta = {"cached_tokens": cached, "prompt_tokens": len(prompt),
                        "finish_reason": {"type": finish},
                        "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}
                if completions:
                    handler.send(200, {"choices": [{"text": "x", "finish_reason": finish}],
                                       "usage": {"prompt_tokens": len(prompt)}})
                else:
                    handler.send(200, {"text": "x", "output_ids": ids, "meta_info": meta})
        except (BrokenPipeError, ConnectionResetError):
            finish = "abort"
        finally:
            with self.lock:
                self.inflight -= 1
        e = event(rid, len(prompt), cached, salt=salt, policy=self.policy, finish=finish)
        e.update({"decode_tokens": n, "schema": 1})
        with self.lock, open(self.events, "a") as f:
            f.write(json.dumps(e) + "\n")


def start_fake(tmp: Path, **kwargs):
    state = FakeServer(tmp, **kwargs)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, status: int, body) -> None:
            data = (json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def chunk(self, body) -> None:
            self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
            self.wfile.flush()

        def do_GET(self):
            state.paths.append(self.path)
            if self.path == "/v1/models":
                self.send(200, {"data": [{"id": "fake", "max_model_len": CONTEXT}]})
            elif self.path.startswith("/v1/loads"):
                self.send(200, {"loads": [{"num_running_reqs": state.inflight, "num_waiting_reqs": 0}]})
            else:
                self.send(404, {"error": "not found"})

        def do_POST(self):
            state.paths.append(self.path)
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                return self.send(400, {"error": "bad json"})
            if self.path in ("/generate", "/v1/completions"):
                state.generate(self, body, self.path == "/v1/completions")
            elif self.path == "/abort_request":
                state.aborted.add(body["rid"])
                self.send(200, "")
            elif self.path == "/flush_cache":
                if state.leak_marker:
                    state.write_log("[2026] token_to_kv_pool memory leak detected! available_size=1")
                self.send(200, "Cache flushed.")
            else:
                self.send(404, {"error": "not found"})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return state, f"http://127.0.0.1:{httpd.server_address[1]}", httpd


@pytest.fixture
def fake(tmp_path):
    servers = []

    def start(**kwargs):
        state, url, httpd = start_fake(tmp_path, **kwargs)
        servers.append(httpd)
        return state, url

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


QUICK = ["--requests", "60", "--concurrency", "3", "--idle-seconds", "0.05", "--max-new-tokens", "4",
         "--fuzz-cases", "0", "--regex-bomb-tokens", "0", "--no-namespaces", "--no-routes", "--no-bounds"]
# The request-safety phases need the patched server's schema and engine (eval/soak/safety.py; their
# checks are tested below on recorded data, and end to end in tests/engine/test_soak.py).
SAFETY_OFF = {"fuzz_cases": 0, "regex_bomb_tokens": 0, "namespaces": False, "routes": False, "bounds": False}


def cli(state, url, out, *extra):
    return main(["--server", url, "--out", str(out), "--events", str(state.events), "--log", str(state.log),
                 *QUICK, *extra])


def test_cli_end_to_end_passes(fake, tmp_path, capsys):
    state, url = fake()
    code = cli(state, url, tmp_path / "out", "--seed", "5")
    printed = capsys.readouterr()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert code == 0, printed.out
    assert report["passed"] and report["policy"] == "radix"  # from the events
    counts = report["counts"]
    assert counts["sent"] >= 60 and counts["malformed"] >= 1 and counts["malformed"] == counts["malformed_4xx"]
    assert counts["probes"] >= 1 and counts["5xx"] == 0 and counts["turns"] > 20
    statuses = {name: c["status"] for name, c in report["checks"].items()}
    assert statuses == {"alive": "pass", "log_fatal": "pass", "idle_leak": "pass", "event_identity": "pass",
                        "isolation": "pass", "scr_sessions": "skipped", "exact_equality": "skipped",
                        "malformed_4xx": "pass", "wellformed_ok": "pass", "routes": "skipped", "schema_fuzz": "skipped",
                        "regex_bomb": "skipped", "namespaces": "skipped", "bounds": "skipped"}
    assert "/flush_cache" in state.paths
    rows = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == counts["sent"] and all(r["rid"].startswith(report["run"] + ".") for r in rows)
    tenants = {r["salt"] for r in rows if r["kind"] == "turn"}
    assert len(tenants) >= 2
    assert "PASS" in printed.out and "malformed_4xx" in printed.out


def test_aborts_and_completions_are_sent(fake, tmp_path):
    state, url = fake()
    report = run_soak(url, tmp_path / "out", **SAFETY_OFF, requests=120, concurrency=3, idle_s=0.0, max_new_tokens=4,
                      abort_share=0.3, openai_share=0.5, events=state.events, log=state.log, progress=None)
    counts = report["counts"]
    assert report["passed"], format_table(report)
    assert set(counts["aborted_by_mode"]) == {"disconnect", "abort_request", "timeout"}
    assert counts["turns_completions"] > 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    completion_salts = {r["salt"] for r in rows if r["endpoint"] == "completions"}
    assert completion_salts and all(s.startswith(f"soak-{report['run']}-t") for s in completion_salts)


def test_exact_sample_passes_and_catches_a_changed_logprob(fake, tmp_path, capsys):
    state, url = fake(policy="exact")
    assert cli(state, url, tmp_path / "ok", "--policy", "exact", "--exact-sample", "3") == 0
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["checks"]["exact_equality"]["status"] == "pass"
    assert report["checks"]["exact_equality"]["detail"].startswith("3 of 3")
    state, url = fake(policy="exact", warm_differs=True)
    assert cli(state, url, tmp_path / "bad", "--exact-sample", "2") == 1  # policy from the events
    report = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert report["checks"]["exact_equality"]["status"] == "fail"
    assert "logprob 0 differs" in report["checks"]["exact_equality"]["offenders"][0]
    assert "FAIL" in capsys.readouterr().out


def test_scr_sessions_from_the_log(fake, tmp_path):
    state, url = fake(policy="scr")
    assert cli(state, url, tmp_path / "ok") == 0
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["checks"]["scr_sessions"]["status"] == "pass"
    state, url = fake(policy="scr", scr_cross=True)
    assert cli(state, url, tmp_path / "bad", "--tenants", "2") == 1
    report = json.loads((tmp_path / "bad" / "report.json").read_text())
    assert report["checks"]["scr_sessions"]["status"] == "fail"


@pytest.mark.parametrize("knobs, failing", [
    ({"leak": True}, "isolation"),
    ({"leak_marker": True}, "idle_leak"),
    ({"five_hundred": ".bad0001.1"}, "malformed_4xx"),
])
def test_failures_exit_1(fake, tmp_path, capsys, knobs, failing):
    state, url = fake(**knobs)
    assert cli(state, url, tmp_path / "out", "--malformed", "safe") == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["checks"][failing]["status"] == "fail"
    assert not report["passed"]
    out = capsys.readouterr().out
    assert f"{failing}" in out and "FAIL" in out


def test_quotas_put_each_kind_among_the_first_requests(fake, tmp_path):
    state, url = fake()
    report = run_soak(url, tmp_path / "out", **SAFETY_OFF, requests=14, concurrency=2, idle_s=0.0, events=state.events,
                      malformed="safe", progress=None)
    counts = report["counts"]
    assert report["passed"], format_table(report)
    assert counts["malformed"] >= 1 and counts["aborted"] >= 1
    assert counts["probes"] >= 2  # one in the load, one after it
    assert counts["turns_completions"] >= 1


def test_malformed_none_sends_none(fake, tmp_path):
    state, url = fake()
    report = run_soak(url, tmp_path / "out", **SAFETY_OFF, requests=30, concurrency=2, idle_s=0.0, malformed="none",
                      events=state.events, progress=None)
    assert report["counts"]["malformed"] == 0 and report["checks"]["malformed_4xx"]["status"] == "skipped"
    assert report["checks"]["log_fatal"]["status"] == "skipped"  # no --log


def test_time_bound(fake, tmp_path):
    state, url = fake()
    start = time.monotonic()
    report = run_soak(url, tmp_path / "out", **SAFETY_OFF, minutes=0.02, concurrency=2, idle_s=0.0, progress=None)
    assert time.monotonic() - start < 30 and report["load_s"] < 5 and report["passed"]


def test_a_dead_server_fails_with_exit_1(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--server", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "out"), "--requests", "5"]) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["checks"]["alive"]["status"] == "fail"


@pytest.mark.parametrize("argv, message", [
    (["--server", "http://example.com:30000"], "only a loopback server"),
    (["--server", "http://10.1.2.3:30000"], "only a loopback server"),
    (["--server", "ftp://127.0.0.1:1"], "expected http://HOST:PORT"),
    (["--server", "http://127.0.0.1:1", "--log", "/nonexistent/server.log"], "no such file"),
    (["--server", "http://127.0.0.1:1", "--events", "/nonexistent/dir/events.jsonl"], "directory does not exist"),
])
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("flags", [
    ["--requests", "0"], ["--minutes", "0"], ["--minutes", "x"], ["--concurrency", "0"],
    ["--malformed", "some"], ["--policy", "lru"], ["--exact-sample", "-1"], ["--max-latency-ratio", "0.5"],
    ["--max-latency-ratio", "x"],
])
def test_bad_flags_exit_2(tmp_path, flags):
    with pytest.raises(SystemExit) as exc:
        main(["--server", "http://127.0.0.1:1", "--out", str(tmp_path), *flags])
    assert exc.value.code == 2


def test_module_entry_point_exit_code(tmp_path):
    result = subprocess.run([sys.executable, "-m", "eval.soak", "--server", "http://192.0.2.1:1", "--out",
                             str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and "loopback" in result.stderr


# ------------------------------------------------------------------ quotas by count (issue 33)


@pytest.mark.parametrize("requests, concurrency, token_s", [(20, 1, 0.0), (20, 4, 0.03), (41, 3, 0.001), (41, 3, 0.05)])
def test_a_load_bounded_by_count_sends_each_quota_whatever_the_speed(fake, tmp_path, requests, concurrency, token_s):
    """The load's malformed requests follow its step count, not the clock: ceil(share x requests)
    of them however fast or slow the server answers (a busy box once sent one where two were due)."""
    import math

    state, url = fake(token_s=token_s)
    report = run_soak(url, tmp_path / "out", **SAFETY_OFF, requests=requests, concurrency=concurrency, idle_s=0.0,
                      malformed_share=0.15, events=state.events, progress=None)
    counts = report["counts"]
    assert report["passed"], format_table(report)
    assert report["config"]["minutes"] is None  # no time bound at all
    assert counts["malformed"] == math.ceil(0.15 * requests)
    assert list(counts["malformed_by_kind"])[:2] == ["id_over_vocab", "id_negative"]
    rows = (tmp_path / "out" / "requests.jsonl").read_text().splitlines()
    assert len(rows) == counts["sent"]


def test_budget_without_a_deadline_counts_only():
    from eval.soak.run import Budget

    budget = Budget(3, None)
    assert [budget.take() for _ in range(5)] == [True, True, True, False, False]


@pytest.mark.parametrize("value, expected", [("none", None), ("NONE", None), ("1", 1.0), ("3.5", 3.5)])
def test_latency_ratio_flag(value, expected):
    from eval.soak.__main__ import latency_ratio

    assert latency_ratio(value) == expected
