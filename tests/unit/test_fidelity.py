"""eval.fidelity: metrics against values computed by hand, scenario files, salts, and the CLI end to
end against a fake ``/generate`` server on 127.0.0.1 (canned answers, optional events file)."""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eval.fidelity import metrics, run_fidelity
from eval.fidelity.__main__ import main
from eval.fidelity.run import UsageError, check_loopback, read_events
from eval.fidelity.scenarios import (DEFAULT_ARMS, Arm, ScenarioError, arm_salt, change_kind, cold_salt,
                                     default_scenarios, parse_spec, prompt_ids, salt_problem)
from scr.knobs import parse_request_knobs

ROOT = Path(__file__).resolve().parents[2]
LN2 = math.log(2)

# ---------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("scr, cold, expected", [
    pytest.param([1, 2, 3], [1, 2, 3], None, id="identical"),
    pytest.param([1, 2, 3], [1, 5, 3], 1, id="second-differs"),
    pytest.param([4, 2], [5, 2], 0, id="first-differs"),
    pytest.param([1, 2], [1, 2, 3], 2, id="shorter-ends"),
    pytest.param([], [], None, id="empty"),
])
def test_first_divergence(scr, cold, expected):
    assert metrics.first_divergence(scr, cold) == expected


@pytest.mark.parametrize("scr, cold, tokens, expected", [
    pytest.param([1, 2, 3, 4], [1, 2, 3, 4], 4, (4, 1.0), id="all"),
    pytest.param([1, 2, 9, 4], [1, 2, 3, 4], 4, (2, 0.5), id="later-equal-tokens-do-not-count"),
    pytest.param([7, 2, 3, 4], [1, 2, 3, 4], 4, (0, 0.0), id="first-differs"),
    pytest.param([1, 2, 3, 9], [1, 2, 3, 4], 3, (3, 1.0), id="only-first-n"),
    pytest.param([1, 2], [1, 2, 3, 4], 4, (2, 0.5), id="short-answer"),
])
def test_agreement(scr, cold, tokens, expected):
    assert metrics.agreement(scr, cold, tokens) == expected


@pytest.mark.parametrize("scr, cold, upto, expected", [
    pytest.param([-1.0, -2.0, -3.0], [-1.5, -2.0, -1.0], 2, 0.5, id="before-divergence-only"),
    pytest.param([-1.0, -2.0, -3.0], [-1.5, -2.0, -1.0], 3, 2.0, id="all"),
    pytest.param([-1.0], [-1.0], 0, None, id="first-differs"),
])
def test_max_abs_dlogprob(scr, cold, upto, expected):
    assert metrics.max_abs_dlogprob(scr, cold, upto) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("cold, scr, kl, missing", [
    # Same distribution: 0.
    pytest.param([(-1.0, 5), (-2.0, 6)], [(-1.0, 5), (-2.0, 6)], 0.0, 0, id="identical"),
    # Renormalisation: only ratios matter, so a shift of every scr logprob changes nothing.
    pytest.param([(-1.0, 5), (-2.0, 6)], [(-3.0, 5), (-4.0, 6)], 0.0, 0, id="shifted"),
    # p = (2/3, 1/3), q = (1/3, 2/3): 2/3 ln 2 + 1/3 ln(1/2) = ln2 / 3.
    pytest.param([(math.log(.5), 1), (math.log(.25), 2)], [(math.log(.25), 1), (math.log(.5), 2)],
                 LN2 / 3, 0, id="swapped"),
    # Token 2 not in scr's top-K: bounded by scr's smallest listed logprob (log .3).
    # p = (.75, .25), q = (.5, .3)/.8 = (.625, .375): .75 ln(.75/.625) + .25 ln(.25/.375) = 0.0353749.
    pytest.param([(math.log(.6), 1), (math.log(.2), 2)], [(math.log(.5), 1), (math.log(.3), 3)],
                 0.0353749, 1, id="missing-token-bounded"),
    # scr's extra tokens outside the cold set do not count.
    pytest.param([(-1.0, 5)], [(-0.1, 9), (-1.0, 5)], 0.0, 0, id="single-token-set"),
])
def test_kl_topk(cold, scr, kl, missing):
    result = metrics.kl_topk(cold, scr)
    assert result.kl == pytest.approx(kl, abs=1e-7)
    assert result.missing == missing and result.overlap == len(cold) - missing


def test_kl_topk_needs_both_lists():
    with pytest.raises(ValueError, match="cold"):
        metrics.kl_topk([], [(-1.0, 1)])
    with pytest.raises(ValueError, match="scr"):
        metrics.kl_topk([(-1.0, 1)], [])


def test_compare_outputs():
    cold = {"output_ids": [1, 2, 3], "logprobs": [-1.0, -1.0, -1.0], "top": [[(-1.0, 1), (-2.0, 7)]]}
    scr = {"output_ids": [1, 2, 9], "logprobs": [-1.0, -1.25, -0.5], "top": [[(-1.0, 1), (-1.5, 7)]]}
    got = metrics.compare_outputs(scr, cold, 3)
    # p = softmax(-1, -2), q = softmax(-1, -1.5): 0.7311 ln(0.7311/0.6225) + 0.2689 ln(0.2689/0.3775).
    assert got == {"agree_tokens": 2, "greedy_agreement": pytest.approx(2 / 3), "first_divergence": 2,
                   "max_abs_dlogprob": pytest.approx(0.25), "kl_first": pytest.approx(0.0263446, abs=1e-7),
                   "kl_missing": 0, "topk_overlap": 2}


def _row(arm, moved, prompt, agreement, divergence, dlp, kl, knobs=None):
    return {"arm": arm, "moved": moved, "moved_share": None if moved is None else moved / prompt,
            "prompt_tokens": prompt, "greedy_agreement": agreement, "first_divergence": divergence,
            "max_abs_dlogprob": dlp, "kl_first": kl, "knobs": knobs or {}}


def test_summarise_by_hand():
    rows = [
        _row("fork", 100, 1000, 1.0, None, 0.0, 0.0),
        _row("fork", 0, 500, 0.5, 4, 0.25, 0.5),
        _row("none", 300, 600, 0.0, 0, None, 2.0, {"ssm_mode": "none"}),
    ]
    summary = metrics.summarise(rows)
    assert list(summary) == ["fork", "none"]
    assert summary["fork"] == {"knobs": "none (server settings)", "requests": 2, "relocated": 1,
                               "mean_moved_share": pytest.approx((0.1 + 0.0) / 2), "greedy_agreement": 0.75,
                               "identical": 1, "mean_kl": 0.25, "max_kl": 0.5, "max_abs_dlogprob": 0.25}
    assert summary["none"] == {"knobs": "ssm_mode=none", "requests": 1, "relocated": 1, "mean_moved_share": 0.5,
                               "greedy_agreement": 0.0, "identical": 0, "mean_kl": 2.0, "max_kl": 2.0,
                               "max_abs_dlogprob": None}


def test_summary_without_events_is_unknown():
    summary = metrics.summarise([_row("fork", None, 1000, 1.0, None, 0.0, 0.0)])
    assert summary["fork"]["relocated"] is None and summary["fork"]["mean_moved_share"] is None


def test_markdown_says_what_the_numbers_mean():
    rows = [{**_row("fork", None, 1000, 1.0, None, 0.0, 0.0), "scenario": "s", "turn": 2, "rid": "r.2",
             "blocks": None, "kl_missing": 0}]
    text = metrics.markdown(metrics.summarise(rows), rows, tokens=8, top=20)
    assert metrics.NOTE in text and "tiny random model" in text and "not the real model's quality" in text
    lines = text.splitlines()
    arm_line = next(line for line in lines if line.startswith("| fork |"))
    assert arm_line == ("| fork | none (server settings) | 1 | unknown | unknown | 100.0% | 1 | 0 | 0 | 0 |")
    row_line = next(line for line in lines if line.startswith("| s |"))
    assert row_line == "| s | 2 | fork | r.2 | 1000 | unknown | unknown | unknown | 100.0% | none | 0 | 0 | 0 |"


@pytest.mark.parametrize("value, kind, text", [
    (None, "share", "unknown"), (None, "g", "-"), (0.256, "share", "25.6%"), (3, "count", "3"),
    (0.000123456, "g", "0.0001235"), ("x", "s", "x"),
])
def test_fmt(value, kind, text):
    assert metrics.fmt(value, kind) == text


# ---------------------------------------------------------------------------------- scenarios and salts


def test_default_scenarios_are_deterministic_and_in_vocab():
    first, again = default_scenarios(), default_scenarios()
    assert first == again
    assert [s.name for s in first] == ["mid", "two-cuts", "early-cut"]
    assert [[len(t) for t in s.turns] for s in first] == [[2400, 2240, 2180], [2400, 2240], [3000, 2740]]
    mid = first[0].turns
    # The same conversation as tests/engine/test_scr_server.py conversation(11), turn 2.
    assert mid[1] == tuple(mid[0][:1400] + mid[0][1600:] + tuple(prompt_ids(12, 40)))
    assert all(10 <= t < 400 for s in first for turn in s.turns for t in turn)
    assert all(s.arms == DEFAULT_ARMS for s in first)
    # Every edit keeps the first 1024 tokens, so the session matches (docs/scr.md §4.3).
    assert all(turn[:1024] == s.turns[0][:1024] for s in first for turn in s.turns)


def test_generated_scenario_by_hand():
    spec = {"arms": [{"name": "a", "salt": "kvreuse:knobs:maxblocks=2"}],
            "scenarios": [{"name": "g", "seed": 1, "first": 10, "edits": [
                {"delete": [[2, 4], [6, 7]], "append": 3}, {"append": 2}]}]}
    (scenario,) = parse_spec(spec, "spec")
    t1 = tuple(prompt_ids(1, 10))
    t2 = t1[:2] + t1[4:6] + t1[7:] + tuple(prompt_ids(2, 3))
    assert scenario.turns == (t1, t2, t2 + tuple(prompt_ids(3, 2)))
    assert scenario.arms == (Arm("a", "kvreuse:knobs:maxblocks=2"),) and scenario.arms[0].knobs == {"max_blocks": 2}
    assert [change_kind(scenario.turns[i - 1], scenario.turns[i]) for i in (1, 2)] == ["edited", "append"]


def test_explicit_turns_and_per_scenario_arms():
    spec = {"scenarios": [{"name": "x", "turns": [[1, 2, 3], [1, 3, 4]], "arms": [{"name": "plain", "salt": "t"}]}]}
    (scenario,) = parse_spec(spec, "spec")
    assert scenario.turns == ((1, 2, 3), (1, 3, 4)) and scenario.arms == (Arm("plain", "t"),)


@pytest.mark.parametrize("spec, message", [
    pytest.param([], "top level: expected an object", id="not-an-object"),
    pytest.param({"scenarios": [], "x": 1}, "unknown keys ['x']", id="unknown-top-key"),
    pytest.param({"scenarios": []}, "scenarios: expected a non-empty list", id="no-scenarios"),
    pytest.param({"scenarios": [{"turns": [[1], [2]]}]}, "scenarios[0]: missing 'name'", id="no-name"),
    pytest.param({"scenarios": [{"name": "a b", "turns": [[1], [2]]}]}, "scenarios[0].name", id="bad-name"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1], [2]]}, {"name": "a", "turns": [[1], [2]]}]},
                 "scenarios[1].name: 'a' repeats", id="repeated-name"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1]]}]}, "at least two prompts", id="one-turn"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1], [2, -1]]}]}, "scenarios[0].turns[1][1]",
                 id="negative-token"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1], [True]]}]}, "turns[1][0]", id="bool-token"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1], []]}]}, "turns[1]: expected a non-empty", id="empty"),
    pytest.param({"scenarios": [{"name": "a"}]}, "needs 'turns'", id="no-content"),
    pytest.param({"scenarios": [{"name": "a", "turns": [[1], [2]], "seed": 1}]}, "not both", id="both-forms"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "edits": [{"append": 1}]}]}, "missing 'first'",
                 id="no-first"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10, "edits": []}]}, "edits: expected",
                 id="no-edits"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10, "edits": [{"delete": [[5, 11]]}]}]},
                 "edits[0].delete[0]: [5, 11): expected start < end <= 10", id="span-past-end"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10, "edits": [{"delete": [[5, 5]]}]}]},
                 "start < end", id="empty-span"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10,
                                 "edits": [{"delete": [[4, 6], [5, 8]]}]}]}, "overlaps", id="overlap"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10, "edits": [{}]}]},
                 "deletes nothing and appends nothing", id="no-op-edit"),
    pytest.param({"scenarios": [{"name": "a", "seed": 1, "first": 10, "edits": [{"delete": [[0, 10]]}]}]},
                 "empty prompt", id="deletes-everything"),
    pytest.param({"scenarios": [{"name": "a", "seed": "1", "first": 10, "edits": [{"append": 1}]}]},
                 "scenarios[0].seed", id="string-seed"),
    pytest.param({"arms": [], "scenarios": [{"name": "a", "turns": [[1], [2]]}]}, "arms: expected a non-empty",
                 id="no-arms"),
    pytest.param({"arms": [{"name": "a"}, {"name": "a"}], "scenarios": [{"name": "a", "turns": [[1], [2]]}]},
                 "arms[1].name: 'a' repeats", id="repeated-arm"),
    pytest.param({"arms": [{"name": "off", "salt": "kvreuse:off"}], "scenarios": [{"name": "a", "turns": [[1], [2]]}]},
                 "arms[0].salt: 'kvreuse:off': only 'kvreuse:knobs:...'", id="kvreuse-off"),
    pytest.param({"arms": [{"name": "x", "salt": "kvreuse:knobs:ssm=nonee"}],
                  "scenarios": [{"name": "a", "turns": [[1], [2]]}]}, "the server would ignore 'ssm=nonee'",
                 id="misspelt-knob"),
    pytest.param({"arms": [{"name": "x", "salt": 3}], "scenarios": [{"name": "a", "turns": [[1], [2]]}]},
                 "arms[0].salt: 3: expected a string", id="salt-not-string"),
])
def test_bad_specs(spec, message):
    with pytest.raises(ScenarioError) as info:
        parse_spec(spec, "f.json")
    text = str(info.value)
    assert text.startswith("f.json: ") and message in text and "\n" not in text


@pytest.mark.parametrize("arm, tag, salt", [
    pytest.param(DEFAULT_ARMS[0], "r.s.fork", "fidelity.r.s.fork", id="no-knobs"),
    pytest.param(DEFAULT_ARMS[1], "r.s.none", "kvreuse:knobs:ssm=none,fidelity=r.s.none", id="ssm-none"),
    pytest.param(DEFAULT_ARMS[2], "r.s.nr", "kvreuse:knobs:rerot=0,fidelity=r.s.nr", id="no-rerotate"),
    pytest.param(Arm("e", "kvreuse:knobs:"), "t", "kvreuse:knobs:fidelity=t", id="empty-knob-list"),
    pytest.param(Arm("c", "kvreuse:knobs:ssm=none,"), "t", "kvreuse:knobs:ssm=none,fidelity=t", id="trailing-comma"),
    pytest.param(Arm("p", "tenant"), "t", "tenant.fidelity.t", id="plain-namespace"),
])
def test_arm_salt_keeps_the_knobs_and_adds_a_namespace(arm, tag, salt):
    assert arm_salt(arm, tag) == salt
    # What the server reads: the same overrides as the bare prefix, the whole salt as namespace.
    knobs = parse_request_knobs(salt)
    assert knobs.overrides == arm.knobs and knobs.namespace == salt and not knobs.off
    assert [why for _, why in knobs.ignored] == (["unknown knob"] if salt.startswith("kvreuse:") else [])


def test_default_arm_knobs():
    assert [a.knobs for a in DEFAULT_ARMS] == [{}, {"ssm_mode": "none"}, {"no_rerotate": True}]


def test_salts_are_unique_per_run_scenario_arm_and_cold_turn():
    salts = {arm_salt(arm, f"{run}.{scenario}.{arm.name}") for run in ("r1", "r2") for scenario in ("a", "b")
             for arm in DEFAULT_ARMS}
    colds = {cold_salt(run, scenario, turn) for run in ("r1", "r2") for scenario in ("a", "b") for turn in (2, 3)}
    assert len(salts) == 12 and len(colds) == 8 and not salts & colds
    assert not any(s.startswith("kvreuse:") for s in colds)
    with pytest.raises(ValueError):
        arm_salt(DEFAULT_ARMS[1], "a,b")


@pytest.mark.parametrize("salt, ok", [
    ("", True), ("tenant", True), ("kvreuse:knobs:ssm=none,rerot=0", True), ("kvreuse:knobs:maxblocks=3", True),
    ("kvreuse:off", False), ("kvreuse:other", False), ("kvreuse:knobs:pin=1", False), ("kvreuse:knobs:pin=0", False),
    ("kvreuse:knobs:zz=1", False), ("kvreuse:knobs:maxblocks=3tenant", False),
])
def test_salt_problem(salt, ok):
    assert (salt_problem(salt) is None) is ok


@pytest.mark.parametrize("url, ok", [
    ("http://127.0.0.1:30000", True), ("http://127.8.9.10:1/", True), ("http://localhost:8000", True),
    ("http://LOCALHOST:8000", True), ("http://[::1]:8000", True), ("https://127.0.0.1", True),
    ("http://10.0.0.1:30000", False), ("http://0.0.0.0:30000", False), ("http://example.com", False),
    ("http://[::ffff:127.0.0.1]:1", False), ("http://128.0.0.1:1", False), ("ftp://127.0.0.1", False),
    ("127.0.0.1:30000", False), ("http://", False),
])
def test_check_loopback(url, ok):
    if ok:
        assert check_loopback(url) == url.rstrip("/")
    else:
        with pytest.raises(UsageError):
            check_loopback(url)


def test_read_events_skips_a_half_written_last_line_only(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"rid": "a", "moved": 1}\n\n{"rid": "b", "mo')
    assert read_events(path) == {"a": {"rid": "a", "moved": 1}}
    path.write_text('{"rid": "a"\n{"rid": "b"}\n')
    with pytest.raises(ValueError, match=":1: not JSON"):
        read_events(path)
    assert read_events(tmp_path / "missing.jsonl") == {}


# ---------------------------------------------------------------------------------- fake server


class FakeServer:
    """Canned ``/generate`` answers keyed by the arm in the rid (``fid.<run>.<scenario>.<arm>.<turn>``).

    Cold reads (salt ``fidelity-cold.*``) and every arm's answers share the ids ``base + i``; on a
    measured turn ``none`` diverges at position 2 with a flatter first-token distribution and
    ``norerot`` at position 0 with a shifted top-K set. Each position's top-K has logprob ``-1 - j``
    for token ``chosen + j`` (the chosen token first).
    """

    def __init__(self, events: Path | None = None, cold_cached: int = 0, fail_rid: str | None = None,
                 policy: str = "scr", still_arm: str | None = None):
        self.events, self.cold_cached, self.fail_rid, self.policy = events, cold_cached, fail_rid, policy
        self.still_arm = still_arm  # this arm's events say nothing moved
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    def answer(self, payload: dict) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(payload)
        rid, salt, prompt = payload["rid"], payload["extra_key"], payload["input_ids"]
        if self.fail_rid and self.fail_rid in rid:
            return 500, {"error": "boom"}
        n, k = payload["sampling_params"]["max_new_tokens"], payload["top_logprobs_num"]
        cold = salt.startswith("fidelity-cold.")
        _, _, _, arm, turn = rid.split(".")
        measured = not cold and int(turn) > 1
        ids = [sum(prompt) % 300 + 10 + i for i in range(n)]
        chosen_lp = [-1.0] * n
        first_top = [(-1.0 - j, ids[0] + j) for j in range(k)]
        if measured and arm == "none":
            ids[2] += 1
            chosen_lp[1] = -1.25
            first_top = [(-1.0 - 0.5 * j, ids[0] + j) for j in range(k)]
        elif measured and arm == "norerot":
            ids[0] += 1
            first_top = [(-1.0 - j, ids[0] + j) for j in range(k)]
        tops = [first_top] + [[(-1.0 - j, ids[i] + j) for j in range(k)] for i in range(1, n)]
        cached = self.cold_cached if cold else (len(prompt) // 2 if measured else 0)
        meta = {"cached_tokens": cached, "prompt_tokens": len(prompt),
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(chosen_lp, ids)],
                "output_top_logprobs": [[[lp, t, None] for lp, t in top] for top in tops]}
        if self.events is not None:
            moved = len(prompt) // 4 if measured and arm != self.still_arm else 0
            reused = len(prompt) // 2 if measured else 0
            event = {"rid": rid, "policy": self.policy, "prompt_tokens": len(prompt), "prefix_reused": reused,
                     "moved": moved, "read": len(prompt) - reused - moved, "decode_tokens": n, "cache_salt": salt,
                     "plan_resume": None, "finish_reason": "length", "queued_ts": 0.0, "finished_ts": 1.0,
                     "snapshots": [], "forwards_off_plan": 0, "blocks": 1 if moved else 0, "schema": 1}
            with self.lock, open(self.events, "a") as f:
                f.write(json.dumps(event) + "\n")
        return 200, {"text": "", "output_ids": ids, "meta_info": meta}


def start_fake(**kwargs) -> tuple[FakeServer, str, ThreadingHTTPServer]:
    """A ``FakeServer`` answering on 127.0.0.1 (``/model_info``, ``/generate``) from a thread."""
    state = FakeServer(**kwargs)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/model_info":
                self._send(200, {"model_path": "fake"})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/generate":
                self._send(*state.answer(payload))
            else:
                self._send(404, {"error": "not found"})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return state, f"http://127.0.0.1:{httpd.server_address[1]}", httpd


@pytest.fixture
def fake():
    servers = []

    def start(**kwargs) -> tuple[FakeServer, str]:
        state, url, httpd = start_fake(**kwargs)
        servers.append(httpd)
        return state, url

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


SPEC = {"arms": [{"name": "fork", "salt": ""}, {"name": "none", "salt": "kvreuse:knobs:ssm=none"},
                 {"name": "norerot", "salt": "kvreuse:knobs:rerot=0"}],
        "scenarios": [{"name": "s1", "seed": 3, "first": 40, "edits": [{"delete": [[10, 20]], "append": 4}]}]}


def _spec_file(tmp_path: Path, spec=SPEC) -> Path:
    path = tmp_path / "scenarios.json"
    path.write_text(json.dumps(spec))
    return path


def _rows(out: Path) -> dict[str, dict]:
    return {row["arm"]: row for row in map(json.loads, (out / "fidelity.jsonl").read_text().splitlines())}


def test_cli_end_to_end_with_events(fake, tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    state, url = fake(events=events)
    out = tmp_path / "out"
    code = main(["--server", url, "--out", str(out), "--scenarios", str(_spec_file(tmp_path)),
                 "--events", str(events), "--tokens", "4", "--top", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for name in ("fidelity.jsonl", "fidelity.csv", "table.md", "kl_vs_moved.png", "summary.json"):
        assert (out / name).stat().st_size > 0
    assert (out / "kl_vs_moved.png").read_bytes()[:4] == b"\x89PNG"
    assert metrics.NOTE in captured.out and captured.out.startswith((out / "table.md").read_text())
    assert "[1/1] s1" in captured.err and "CHECK FAILED" not in captured.err

    rows = _rows(out)
    # Turn 2 = 40 - 10 deleted + 4 appended = 34 tokens; the fake moves 34 // 4 = 8 rows in 1 block.
    for row in rows.values():
        assert row["prompt_tokens"] == 34 and row["moved"] == 8 and row["blocks"] == 1 and row["relocated"] is True
        assert row["moved_share"] == pytest.approx(8 / 34) and row["prefix_reused"] == 17 and row["policy"] == "scr"
        assert row["cold_cached_tokens"] == 0 and row["scr_cached_tokens"] == 17 and row["checks_failed"] == []
        assert row["change"] == "edited" and row["turn"] == 2 and row["tokens"] == 4 and row["top"] == 2
    fork, none, norerot = rows["fork"], rows["none"], rows["norerot"]
    assert (fork["agree_tokens"], fork["greedy_agreement"], fork["first_divergence"]) == (4, 1.0, None)
    assert fork["max_abs_dlogprob"] == 0.0 and fork["kl_first"] == 0.0 and fork["kl_missing"] == 0
    assert (none["agree_tokens"], none["greedy_agreement"], none["first_divergence"]) == (2, 0.5, 2)
    # Position 1: -1.25 vs -1.0. First token: softmax(-1, -2) vs softmax(-1, -1.5) (test_compare_outputs).
    assert none["max_abs_dlogprob"] == pytest.approx(0.25) and none["kl_first"] == pytest.approx(0.0263446, abs=1e-7)
    assert none["ssm_mode"] == "none" and none["rerotate"] is None and none["knobs"] == {"ssm_mode": "none"}
    # First token differs; cold top-2 = {b, b+1}, scr top-2 = {b+1, b+2} with logprobs (-1, -2): b is
    # bounded by -2, so q = softmax(-2, -1) over (b, b+1) against p = softmax(-1, -2):
    # KL = (p0 - p1) * ln(p0 / p1) = (0.731059 - 0.268941) * 1.
    assert (norerot["agree_tokens"], norerot["first_divergence"], norerot["max_abs_dlogprob"]) == (0, 0, None)
    assert norerot["kl_first"] == pytest.approx(0.462117, abs=1e-6) and norerot["kl_missing"] == 1
    assert norerot["rerotate"] is False and norerot["ssm_mode"] is None

    # What was sent: the arms' conversations first, then one cold read per measured turn.
    sent = state.requests
    assert [p["rid"].split(".")[3:] for p in sent] == [["fork", "1"], ["fork", "2"], ["none", "1"], ["none", "2"],
                                                        ["norerot", "1"], ["norerot", "2"], ["cold", "2"]]
    for payload in sent:
        assert payload["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}
        assert payload["return_logprob"] is True and payload["top_logprobs_num"] == 2
    salts = [p["extra_key"] for p in sent]
    assert salts[0] == salts[1] and salts[2] == salts[3] and len(set(salts)) == 4
    assert salts[2].startswith("kvreuse:knobs:ssm=none,fidelity=") and salts[6].startswith("fidelity-cold.")
    assert sent[1]["input_ids"] == sent[6]["input_ids"] == sent[3]["input_ids"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["checks_failed"] == [] and summary["requests"] == 3 and summary["note"] == metrics.NOTE
    assert summary["arms"]["none"]["max_kl"] == pytest.approx(0.0263446, abs=1e-7)
    assert summary["arms"]["fork"]["identical"] == 1 and summary["arms"]["fork"]["relocated"] == 1
    csv_lines = (out / "fidelity.csv").read_text().splitlines()
    assert csv_lines[0].startswith("run,scenario,arm,turn") and len(csv_lines) == 4


def test_without_events_moved_is_unknown(fake, tmp_path):
    _, url = fake()
    summary = run_fidelity(url, tmp_path / "out", parse_spec(SPEC, "spec"), tokens=4, top=2, progress=None)
    assert summary["checks_failed"] == [] and summary["events"] is None
    assert all(row["moved"] is None and row["moved_share"] is None and row["relocated"] is None
               for row in summary["rows"])
    assert summary["arms"]["fork"]["mean_moved_share"] is None and "| unknown |" in summary["markdown"]
    assert (tmp_path / "out" / "kl_vs_moved.png").exists()


def test_run_fidelity_default_scenarios_in_process(fake, tmp_path):
    state, url = fake()
    summary = run_fidelity(url, tmp_path / "out", tokens=3, top=4, run_id="r1", progress=None)
    # 3 scenarios x 3 arms, measured turns 2 + 1 + 1; cold reads: 4.
    assert summary["requests"] == 12 and list(summary["arms"]) == ["fork", "none", "norerot"]
    assert summary["scenarios"] == ["mid", "two-cuts", "early-cut"] and summary["run"] == "r1"
    assert len(state.requests) == (3 + 2 + 2) * 3 + 4
    assert {row["rid"] for row in summary["rows"]} >= {"fid.r1.mid.fork.2", "fid.r1.mid.fork.3"}
    assert all(row["cold_rid"].startswith("fid.r1.") and ".cold." in row["cold_rid"] for row in summary["rows"])


def test_cold_read_that_reused_tokens_fails_with_exit_1(fake, tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    _, url = fake(events=events, cold_cached=5)
    out = tmp_path / "out"
    code = main(["--server", url, "--out", str(out), "--scenarios", str(_spec_file(tmp_path)),
                 "--events", str(events), "--tokens", "4", "--top", "2"])
    err = capsys.readouterr().err
    assert code == 1
    # The cold read is shared by the three arms: reported once.
    assert err.count("CHECK FAILED") == 1 and "cold read reused 5 cached tokens (must be 0)" in err
    assert all(row["checks_failed"] for row in _rows(out).values())


@pytest.mark.parametrize("kwargs, message", [
    pytest.param({"policy": "radix"}, "served by policy 'radix', not scr", id="not-scr"),
    pytest.param({"events": None}, "no event in the --events file", id="no-events-written"),
])
def test_event_problems_fail_with_exit_1(fake, tmp_path, capsys, kwargs, message):
    events = tmp_path / "events.jsonl"
    _, url = fake(**{"events": events, **kwargs})
    summary = run_fidelity(url, tmp_path / "out", parse_spec(SPEC, "spec"), events, tokens=4, top=2,
                           progress=None, events_timeout=0.2)
    assert any(message in failure for failure in summary["checks_failed"])


def test_an_arm_that_relocates_nothing_is_a_warning_not_a_failure(fake, tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    _, url = fake(events=events, still_arm="none")
    code = main(["--server", url, "--out", str(tmp_path / "out"), "--scenarios", str(_spec_file(tmp_path)),
                 "--events", str(events), "--tokens", "4", "--top", "2"])
    err = capsys.readouterr().err
    assert code == 0 and "warning: arm none: no request relocated anything" in err
    assert _rows(tmp_path / "out")["none"]["relocated"] is False


def test_run_fidelity_checks_arms_built_in_code(tmp_path):
    (scenario,) = parse_spec(SPEC, "spec")
    bad = dataclasses.replace(scenario, arms=(Arm("off", "kvreuse:off"),))
    with pytest.raises(UsageError, match="scenario s1, arm off: 'kvreuse:off'"):
        run_fidelity("http://127.0.0.1:1", tmp_path / "out", [bad], progress=None)
    with pytest.raises(UsageError, match="only a loopback server"):
        run_fidelity("http://192.168.0.1:1", tmp_path / "out", [scenario], progress=None)


def test_server_error_mid_run_exits_1(fake, tmp_path, capsys):
    _, url = fake(fail_rid=".none.2")
    code = main(["--server", url, "--out", str(tmp_path / "out"), "--scenarios", str(_spec_file(tmp_path))])
    err = capsys.readouterr().err
    assert code == 1 and "server error" in err and ".none.2" in err and len(err.strip().splitlines()) == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--server", "http://10.1.2.3:30000"], "only a loopback server", id="not-loopback"),
    pytest.param(["--server", "http://example.com:30000"], "only a loopback server", id="hostname"),
    pytest.param(["--server", "CLOSED"], "cannot reach the server", id="unreachable"),
    pytest.param(["--server", "http://127.0.0.1:1", "--scenarios", "MISSING"], "cannot read", id="missing-file"),
    pytest.param(["--server", "http://127.0.0.1:1", "--scenarios", "BADJSON"], "not JSON", id="malformed-json"),
    pytest.param(["--server", "http://127.0.0.1:1", "--scenarios", "BADSCHEMA"], "scenarios[0]: missing 'name'",
                 id="bad-schema"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, argv, message):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "schema.json").write_text(json.dumps({"scenarios": [{"turns": [[1], [2]]}]}))
    replace = {"CLOSED": f"http://127.0.0.1:{_closed_port()}", "MISSING": str(tmp_path / "nope.json"),
               "BADJSON": str(tmp_path / "bad.json"), "BADSCHEMA": str(tmp_path / "schema.json")}
    argv = [replace.get(a, a) for a in argv]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m eval.fidelity: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("flags", [["--tokens", "0"], ["--top", "x"], ["--bogus"], []])
def test_bad_flags_exit_2(tmp_path, flags):
    base = ["--server", "http://127.0.0.1:1", "--out", str(tmp_path)] if flags else ["--out", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        main([*base, *flags])
    assert info.value.code == 2


def test_module_entry_point_exit_code(tmp_path):
    """``python -m eval.fidelity`` itself: an unreachable server is one line and status 2."""
    result = subprocess.run([sys.executable, "-m", "eval.fidelity", "--server", f"http://127.0.0.1:{_closed_port()}",
                             "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "cannot reach the server" in result.stderr
