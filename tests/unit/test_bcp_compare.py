"""compare: refuses runs that differ in more than the policy; builds the §5.9 table on synthetic runs."""
# Spec: docs/eval.md

from __future__ import annotations

import json


from eval.bcp import compare
from eval.bcp.execute import execute
from eval.bcp.judging import judge_run
from eval.bcp.scoring import score
from policy.events import RequestEvent
from tests.unit.test_bcp_journal import QUERIES, setup, two_turn_script


class FakeJudge:
    def __init__(self, verdicts):
        self.verdicts = verdicts

    def grade(self, query, response):
        verdict = self.verdicts[query.query_id]
        if verdict is None:
            return {"correct": False, "parse_error": True, "error": "no 'correct:' verdict", "raw": "garbage"}
        return {"correct": verdict, "parse_error": False, "confidence": 80.0}

    def describe(self):
        return {"model": "fake-judge"}


def make_run(tmp_path, name, policy, verdicts, reused, kind="real", temperature=None, render=...):
    run_setup = setup(tmp_path / name, _endpoint())
    run_setup.policy = policy
    run_setup.manifest = {**run_setup.manifest, "policy": policy, "server": {"kind": kind, "args": {"model_path": "m"}},
                          "model": {"served": "m"}, "retrieval": {"backend": "bm25s"},
                          "agent": {"config": run_setup.config.to_dict(), "fingerprint": run_setup.config.fingerprint(),
                                    "chat_template_kwargs": run_setup.config.chat_template_kwargs}}
    if temperature is not None:
        run_setup.manifest["agent"]["config"]["temperature"] = temperature
    if render is not ...:  # None: a manifest from before `render` was recorded, rendered preserve
        run_setup.manifest["agent"]["config"]["preserve_thinking"] = True
        run_setup.manifest["agent"]["chat_template_kwargs"] = {**run_setup.config.chat_template_kwargs,
                                                               "preserve_thinking": True}
        if render is not None:
            run_setup.manifest["render"] = render
    records = execute(run_setup)
    run_dir = run_setup.run_dir
    usage = {json.loads(l)["rid"]: json.loads(l)["usage"] for l in (run_dir / "client_requests.jsonl").read_text().splitlines()}
    with open(run_dir / "events.jsonl", "w") as f:
        for record in records:
            for turn, rid in enumerate(record["rids"]):
                prompt = usage[rid]["prompt_tokens"]
                r = min(prompt, reused * turn)
                event = RequestEvent(rid=rid, policy=policy, prompt_tokens=prompt, prefix_reused=r, moved=0, read=prompt - r,
                                     decode_tokens=7, cache_salt=None, plan_resume=r, finish_reason="stop",
                                     queued_ts=0.0, finished_ts=1.0)
                f.write(json.dumps(event.to_dict()) + "\n")
    by_id = {q.query_id: q for q in QUERIES}
    judge_run(run_dir, FakeJudge(verdicts), by_id)
    score(run_dir, by_id)
    return run_dir


def _endpoint():
    from tests.unit.test_bcp_agent import FakeEndpoint

    return FakeEndpoint(two_turn_script(len(QUERIES)))


def test_compare_builds_the_table_and_plots(tmp_path):
    radix = make_run(tmp_path, "a", "radix", {"1": True, "2": True, "3": False, "4": False}, reused=50)
    exact = make_run(tmp_path, "b", "exact", {"1": True, "2": False, "3": True, "4": False}, reused=100)
    out = tmp_path / "cmp"
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={exact}", "--out", str(out), "--resamples", "200"]) == 0
    table = json.loads((out / "table.json").read_text())
    assert table["arms"] == ["radix", "exact"] and table["not_a_result"] == {}
    rows = {(r["group"], r["row"]): r["values"] for r in table["rows"]}
    groups = {r["group"] for r in table["rows"]}
    assert groups == {"setup", "accuracy", "BCP secondary", "agent behaviour", "tokens per question", "by class",
                      "relocation", "compute", "latency", "checks"}
    assert rows[("accuracy", "accuracy [Wilson 95%]")][0].startswith("50.0% [")
    assert rows[("accuracy", "b / c / discordance")] == ["—", "1 / 1 / 0.500"]
    assert rows[("checks", "accounting and join checks")] == ["pass", "pass"]
    # exact reused more: fewer PFLOPs, ratio < 1
    ratio = float(rows[("compute", "ratio vs radix [paired bootstrap 95%]")][1].split()[0])
    assert 0 < ratio < 1
    stats = json.loads((out / "stats.json").read_text())
    per_q = stats["per_question"]
    assert per_q["radix"]["1"]["requests"] == 2 and per_q["radix"]["1"]["D"] == 14
    assert per_q["radix"]["1"]["R"] == 50 and per_q["exact"]["1"]["R"] == 100
    md = (out / "table.md").read_text()
    assert "| accuracy | accuracy [Wilson 95%] |" in md and "60.2" in md  # paper column
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "accuracy_ci.png", "forwarded_cdf.png", "pflops_paired.png", "provenance_stack.png"]


def test_compare_refuses_runs_that_differ_in_more_than_the_policy(tmp_path, capsys):
    radix = make_run(tmp_path, "a", "radix", dict.fromkeys("1234", True), reused=50)
    other = make_run(tmp_path, "b", "exact", dict.fromkeys("1234", True), reused=50, temperature=0.0)
    out = tmp_path / "cmp"
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={other}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "agent_config differs" in err and "temperature" in err
    assert not (out / "table.md").exists()
    # ... unless that difference is named, and then it is printed with the table.
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={other}", "--out", str(out), "--ignore", "agent_config",
                         "--resamples", "100"]) == 0
    assert "agent_config differs" in (out / "table.md").read_text()
    same = make_run(tmp_path, "c", "radix", dict.fromkeys("1234", True), reused=50)
    assert compare.main(["--run", f"radix={radix}", "--run", f"again={same}", "--out", str(tmp_path / "x")]) == 2
    assert "share a policy" in capsys.readouterr().err


def test_judge_failures_and_stub_runs_are_stamped_not_a_result(tmp_path):
    radix = make_run(tmp_path, "a", "radix", {"1": None, "2": True, "3": None, "4": False}, reused=50, kind="stub")
    exact = make_run(tmp_path, "b", "exact", {"1": None, "2": True, "3": True, "4": False}, reused=50, kind="stub")
    summary = json.loads((radix / "summary.json").read_text())
    assert summary["judge_parse_errors"] == 2 and summary["correct"] == 1
    assert any("judge failure" in r for r in summary["not_a_result"])
    judgment = json.loads((radix / "judge" / "1.json").read_text())
    assert judgment["parse_error"] is True and judgment["correct"] is False and judgment["judged"] is True
    out = tmp_path / "cmp"
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={exact}", "--out", str(out), "--resamples", "100"]) == 0
    md = (out / "table.md").read_text()
    assert md.startswith("# NOT A RESULT") and "judge failure" in md and "server kind 'stub'" in md
    assert "NOT A RESULT" in (out / "table.csv").read_text()


def test_compare_with_an_aa_run_reports_the_noise_floor(tmp_path):
    radix = make_run(tmp_path, "a", "radix", {"1": True, "2": True, "3": False, "4": False}, reused=50)
    again = make_run(tmp_path, "a2", "radix", {"1": True, "2": False, "3": False, "4": False}, reused=50)
    exact = make_run(tmp_path, "b", "exact", {"1": True, "2": True, "3": True, "4": False}, reused=50)
    out = tmp_path / "cmp"
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={exact}", "--aa", str(again), "--out", str(out), "--resamples", "100"]) == 0
    rows = {(r["group"], r["row"]): r["values"] for r in json.loads((out / "table.json").read_text())["rows"]}
    assert rows[("accuracy", "A/A discordance (noise floor: radix twice)")] == ["0.250 (b 1, c 0)", "0.250 here"]
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={exact}", "--aa", str(exact), "--out", str(out)]) == 2


def test_compare_refuses_runs_rendered_differently_unless_allowed(tmp_path, capsys):
    """A run without `render` whose kwargs say preserve_thinking false counts as default; one that
    says true (or records render preserve) as preserve; the two are not paired unless
    --allow-render-mismatch, and then the table says so."""
    radix = make_run(tmp_path, "a", "radix", dict.fromkeys("1234", True), reused=50)
    kept = make_run(tmp_path, "b", "exact", dict.fromkeys("1234", True), reused=50, render="preserve")
    old_kept = make_run(tmp_path, "c", "scr", dict.fromkeys("1234", True), reused=50, render=None)
    out = tmp_path / "cmp"
    for other in (kept, old_kept):
        assert compare.main(["--run", f"radix={radix}", "--run", f"exact={other}", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "runs rendered differently" in err and "--allow-render-mismatch" in err
        assert f"radix ({radix}) rendered 'default'" in err and f"exact ({other}) rendered 'preserve'" in err
        assert "agent_config" not in err  # preserve_thinking is compared as the rendering only
    assert not (out / "table.md").exists()
    assert compare.main(["--run", f"radix={radix}", "--run", f"exact={kept}", "--out", str(out),
                         "--allow-render-mismatch", "--resamples", "100"]) == 0
    md = (out / "table.md").read_text()
    assert "render differs, let through" in md and "True/False (default)" in md and "True/True (preserve)" in md
    # two preserve runs, one from before `render` was recorded, pair without the flag
    assert compare.main(["--run", f"exact={kept}", "--run", f"scr={old_kept}", "--out", str(tmp_path / "p"),
                         "--resamples", "100"]) == 0
