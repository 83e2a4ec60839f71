"""BrowseComp-Plus pipeline end to end on CPU: fixture corpus, the tiny model behind the patched
server (one server per policy), the agent in both modes, the judge on the same tiny server, the
scores and the side-by-side comparison.

The tiny model's replies are noise, so no question is answered and the judge's replies never
parse: what is tested is that every artefact is produced and consistent, and that judge failures
are recorded as such (counted wrong, the run stamped NOT A RESULT), not that anything is right.
"""

from __future__ import annotations

import json

import pytest

from eval import http
from eval.bcp import compare, fixtures, run
from eval.server import ServerProcess
from tests.engine.conftest import STATE_POOL_ARGS, STRICT_ENV, TEST_SERVER_ARGS

pytestmark = pytest.mark.engine

POLICIES = ["radix", "exact", "scr"]
# Prompts are ~1-2k tokens: large prefill chunks keep the CPU forwards few.
POLICY_ARGS = {
    "radix": ["--chunked-prefill-size", "256", "--max-running-requests", "4"],
    "exact": ["--cache-policy-set", "piece_tokens=256", "--cache-policy-set", "retain_every=512"],
    "scr": ["--chunked-prefill-size", "256", "--max-running-requests", "4", "--max-total-tokens", "12288",
            "--cache-policy-set", "side_sessions=16", "--cache-policy-set", "side_tokens=4096"],
}
QUESTIONS = 2
COMMON = ["--set", "max_tokens=12", "--set", "max_steps=2", "--set", "temperature=0", "--judge-max-tokens", "16"]
PLAIN = ["--set", "mode=plain", "--set", "finish_policy=text", *COMMON]
CLM = ["--set", "mode=clm", "--set", "finish_policy=submit", "--set", "context_budget_tokens=4000",
       "--set", "context_budget_reserve_tokens=200", "--set", "finalize_nudge_turns=1", *COMMON]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bcp")
    dataset = fixtures.write_fixture(tmp / "data", num_queries=3, num_docs=30, seed=1)
    out = {}
    for policy in POLICIES:
        events = tmp / f"{policy}-events.jsonl"
        args = [*TEST_SERVER_ARGS, *STATE_POOL_ARGS, *POLICY_ARGS[policy], "--cache-policy", policy,
                "--cache-events", str(events)]
        server = ServerProcess(model_path=str(tiny_model_dir), log_path=tmp / f"{policy}.log", extra_args=args,
                               env=STRICT_ENV)
        with server, pytest.MonkeyPatch.context() as env:
            env.setenv(http.ADMIN_KEY_ENV, server.admin_key)  # /server_info is an admin route
            common = ["--dataset", str(dataset), "--server", server.url, "--policy", policy, "--events", str(events),
                      "--index", str(tmp / "index"), "--limit", str(QUESTIONS), "--no-progress",
                      "--not-a-result", "tiny test model", "--server-command", " ".join(args),
                      "--server-log", str(server.log_path)]
            # plain agent, judged inline by the same tiny server
            plain = tmp / "runs" / f"plain-{policy}"
            assert run.main(["run", *common, "--out", str(plain), *PLAIN, "--judge-server", server.url]) == 0
            # CLM-style agent, judged afterwards with the subcommand
            clm = tmp / "runs" / f"clm-{policy}"
            assert run.main(["run", *common, "--out", str(clm), *CLM]) == 0
            assert run.main(["judge", "--run", str(clm), "--judge-server", server.url, "--judge-max-tokens", "16"]) == 0
            # a second invocation resumes: nothing is left to do, nothing is sent
            rows = (plain / "client_requests.jsonl").read_text()
            assert run.main(["run", *common, "--out", str(plain), *PLAIN]) == 0
            assert (plain / "client_requests.jsonl").read_text() == rows
        assert server.fatal_lines() == [], server.log_tail()
        out[policy] = {"plain": plain, "clm": clm, "events": events}
    return tmp, out


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("mode", ["plain", "clm"])
def test_run_artifacts_are_complete_and_consistent(runs, mode):
    _, out = runs
    for policy in POLICIES:
        run_dir = out[policy][mode]
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["policy"] == policy
        assert manifest["model"]["path"] and manifest["server"]["args"]["model_path"] == manifest["model"]["path"]
        assert manifest["server"]["sglang_version"] == "0.5.16"
        assert not {"api_key", "admin_api_key"} & set(manifest["server"]["args"])  # never recorded
        assert manifest["agent"]["config"]["mode"] == mode and manifest["agent"]["config"]["max_tokens"] == 12
        assert manifest["dataset"]["fingerprint"] and manifest["dataset"]["question_ids"] == ["1", "2"]
        assert manifest["run"]["git"]["commit"] and manifest["retrieval"]["backend"] == "bm25s"
        assert manifest["not_a_result"] == "tiny test model"
        # the server's start-up record, checked against --policy; snippets cut by the tiny model's tokenizer
        assert manifest["startup"]["policy"] == policy
        assert manifest["retrieval"]["snippet_unit"] == f"tokens:{manifest['model']['path']}"
        # run files in the BCP format
        records = {r["query_id"]: r for r in (json.loads(p.read_text()) for p in (run_dir / "questions").glob("*.json"))}
        assert sorted(records) == ["1", "2"]
        for record in records.values():
            assert set(record) >= {"query_id", "tool_call_counts", "status", "retrieved_docids", "result"}
            assert record["result"][-1]["type"] == "output_text" and isinstance(record["result"][-1]["output"], str)
            assert record["rids"] and all(rid.startswith(f"{run_dir.name}.{record['query_id']}.") for rid in record["rids"])
            # The noise may contain a (broken) <tool_call>: then the agent goes on, else it ends.
            if mode == "plain":
                # a reply without a tool call is the (nonsense) final answer
                assert record["status"] in ("completed", "max_steps")
                assert len(record["rids"]) == (1 if record["status"] == "completed" else 2)
            else:
                # nothing submits: reminders (or a tool call's error), then the step cap;
                # the first prompt is already past 25 % of the budget
                assert record["status"] == "max_steps" and len(record["rids"]) == 2
                assert record["agent_stats"]["nudges"] >= 1
        # journal: one done line per question
        done = [e for e in read_jsonl(run_dir / "journal.jsonl") if e["event"] == "done"]
        assert sorted(e["qid"] for e in done) == ["1", "2"]
        # events of exactly this run's requests, agreeing with the client's usage
        events = {e["rid"]: e for e in read_jsonl(run_dir / "events.jsonl")}
        rids = [rid for r in records.values() for rid in r["rids"]]
        assert sorted(events) == sorted(rids)
        assert {e["policy"] for e in events.values()} == {policy}
        clients = {c["rid"]: c for c in read_jsonl(run_dir / "client_requests.jsonl")}
        assert sorted(clients) == sorted(rids)
        for rid in rids:
            assert clients[rid]["usage"]["prompt_tokens"] == events[rid]["prompt_tokens"]
            assert clients[rid]["usage"]["completion_tokens"] == events[rid]["decode_tokens"]
        # the judge: completed questions judged by the tiny model, whose output is not a judgment
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["correct"] == 0 and summary["metrics"]["accuracy"] == 0
        for qid, record in records.items():
            judgment = json.loads((run_dir / "judge" / f"{qid}.json").read_text())
            assert judgment["correct"] is False
            if record["status"] == "completed":
                assert judgment["judged"] and judgment["parse_error"] and judgment["error"]
            else:
                assert not judgment["judged"] and "without judging" in judgment["reason"]
        assert "tiny test model" in summary["not_a_result"]
        completed = sum(r["status"] == "completed" for r in records.values())
        assert summary["judge_parse_errors"] == summary["judged"] == completed
        if completed:
            assert any("judge failure" in r for r in summary["not_a_result"])
        assert "The server is fired up" in (run_dir / "server.log").read_text()
        per_question = (run_dir / "per_question.csv").read_text().splitlines()
        assert len(per_question) == 1 + QUESTIONS
        assert (run_dir / "evaluation_summary.json").exists()


@pytest.mark.parametrize("mode", ["plain", "clm"])
def test_compare_table_over_the_policies(runs, mode):
    tmp, out = runs
    target = tmp / f"compare-{mode}"
    specs = [arg for policy in POLICIES for arg in ("--run", f"{policy}={out[policy][mode]}")]
    assert compare.main([*specs, "--out", str(target), "--resamples", "200",
                         "--model-config", str(_tiny_config())]) == 0
    table = json.loads((target / "table.json").read_text())
    assert table["arms"] == POLICIES
    assert table["checks"] == {p: [] for p in POLICIES}  # accounting identities and joins hold
    assert set(table["not_a_result"]) == set(POLICIES)
    md = (target / "table.md").read_text()
    assert md.startswith("# NOT A RESULT") and "tiny test model" in md
    rows = {(r["group"], r["row"]): r["values"] for r in table["rows"]}
    assert rows[("accuracy", "accuracy [Wilson 95%]")][0].startswith("0.0% [")
    stats = json.loads((target / "stats.json").read_text())
    for policy in POLICIES:
        for qid, q in stats["per_question"][policy].items():
            record = json.loads((out[policy][mode] / "questions" / f"{qid}.json").read_text())
            assert q["requests"] == len(record["rids"])
            assert q["P"] == record["tokens"]["prompt"] and q["D"] == record["tokens"]["completion"]
            assert q["R"] + q["M"] + q["F"] == q["P"] and q["pflops"] > 0
    assert len(list((target / "plots").glob("*.png"))) == 4


def test_compare_refuses_plain_against_clm(runs, capsys):
    tmp, out = runs
    assert compare.main(["--run", f"radix={out['radix']['plain']}", "--run", f"exact={out['exact']['clm']}",
                         "--out", str(tmp / "refused")]) == 2
    assert "agent_config differs" in capsys.readouterr().err


def _tiny_config():
    from tests.conftest import ARTIFACTS
    from eval.tiny_model import cached_build

    return cached_build(ARTIFACTS) / "config.json"
