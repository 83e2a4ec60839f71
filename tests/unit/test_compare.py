"""``python -m eval.report compare`` on three synthetic runs (radix, exact, scr) with known totals."""

from __future__ import annotations

import csv
import json
import struct

import pytest

from eval import report
from eval.accounting.flops import QWEN36_27B, n_body
from tests.unit.synthetic_runs import simulate

BODY = n_body(QWEN36_27B)
POLICIES = ("radix", "exact", "scr")


@pytest.fixture
def runs(tmp_path):
    dirs, truths = {}, {}
    for policy in POLICIES:
        run = simulate(policy, seed=5)
        paths = run.write(tmp_path / policy / "in")
        dirs[policy] = tmp_path / policy / "report"
        rows, failures = report.ingest(None, dirs[policy], log_path=paths["log"], client_path=paths["client"])
        assert failures == []
        truths[policy] = run.truth
    return dirs, truths


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def test_compare_table_and_plots(runs, tmp_path, capsys):
    dirs, truths = runs
    out = tmp_path / "compare"
    argv = ["compare", *(f"--run={p}={dirs[p]}" for p in POLICIES), "--out", str(out)]
    assert report.main(argv) == 0
    table = json.loads((out / "table.json").read_text())
    assert table["baseline"] == "radix"
    for policy in POLICIES:
        truth, values = truths[policy], table["table"][policy]
        prompt = sum(t.prompt for t in truth)
        edited = [t for t in truth if t.klass == "edited"]
        edited_prompt = sum(t.prompt for t in edited)
        pflops = 2 * BODY * sum(t.read + t.decode for t in truth) / 1e15
        assert values["requests"] == len(truth) and values["conversations"] == 4
        assert values["prompt_tokens"] == prompt and values["edited_requests"] == len(edited)
        assert values["prefix_share"] == pytest.approx(sum(t.reused for t in truth) / prompt)
        assert values["moved_share"] == pytest.approx(sum(t.moved for t in truth) / prompt)
        assert values["read_share"] == pytest.approx(sum(t.read for t in truth) / prompt)
        assert values["edited_read_share"] == pytest.approx(sum(t.read for t in edited) / edited_prompt)
        assert values["pflops_per_request"] == pytest.approx(pflops / len(truth))
        assert values["pflops_per_conversation"] == pytest.approx(pflops / 4)
        assert values["checks"] == "pass"
        radix_pflops = 2 * BODY * sum(t.read + t.decode for t in truths["radix"]) / 1e15
        assert values["pflops_per_conversation_ratio"] == pytest.approx(pflops / radix_pflops)
    assert table["table"]["radix"]["pflops_per_request_ratio"] == 1.0
    assert table["table"]["radix"]["moved_share"] == 0 and table["table"]["scr"]["edited_moved_share"] > 0
    assert table["table"]["scr"]["pflops_per_conversation_ratio"] < 1.0  # relocation saves reads here
    markdown = (out / "table.md").read_text().splitlines()
    assert markdown[0] == "| metric | radix | exact | scr |"
    assert any(line.startswith("| read share of prompt, edited |") for line in markdown)
    assert any(line.startswith("| PFLOPs per conversation with attention (approx.) |") for line in markdown)
    assert "|   ratio to radix | 1.000 |" in "\n".join(markdown)
    with open(out / "table.csv", newline="") as f:
        rows = {row[0]: row[1:] for row in csv.reader(f)}
    assert rows["metric"] == list(POLICIES) and float(rows["pflops_per_request_ratio"][0]) == 1.0
    for name in ("provenance_stack.png", "read_cdf.png"):
        width, height = png_size(out / name)
        assert width >= 400 and height >= 300
    assert "| metric | radix | exact | scr |" in capsys.readouterr().out


def test_compare_baseline_option_and_bad_input(runs, tmp_path, capsys):
    dirs, _ = runs
    out = tmp_path / "c"
    assert report.main(["compare", "--run", f"exact={dirs['exact']}", "--run", f"scr={dirs['scr']}",
                        "--out", str(out), "--baseline", "scr"]) == 0
    assert json.loads((out / "table.json").read_text())["table"]["scr"]["pflops_per_request_ratio"] == 1.0
    assert report.main(["compare", "--run", f"exact={dirs['exact']}", "--out", str(out), "--baseline", "radix"]) == 2
    assert "baseline 'radix' is not one of the runs" in capsys.readouterr().err
    assert report.main(["compare", "--run", f"a={dirs['exact']}", "--run", f"a={dirs['scr']}", "--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line per usage error, no traceback
    assert report.main(["compare", "--run", f"a={tmp_path / 'missing'}", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"python -m eval.report: error: --run a={tmp_path / 'missing'}: no such directory\n"


def test_compare_exits_1_when_a_run_failed_its_checks(runs, tmp_path, capsys):
    dirs, _ = runs
    summary = json.loads((dirs["exact"] / "summary.json").read_text())
    summary["checks_failed"] = ["I1 x: broken"]
    (dirs["exact"] / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "c"
    assert report.main(["compare", *(f"--run={p}={dirs[p]}" for p in POLICIES), "--out", str(out)]) == 1
    assert "CHECK FAILED [exact] I1 x: broken" in capsys.readouterr().err
    assert "| checks | pass | FAILED (1) | pass |" in (out / "table.md").read_text()
