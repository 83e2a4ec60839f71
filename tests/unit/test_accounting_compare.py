"""eval/accounting/compare.py: the per-run metrics, the baseline choice and the provenance plot's
data, each against a count made here from the rows."""

from __future__ import annotations

import csv
import json

import pytest

from eval.accounting import compare

FIELDS = ("rid", "conversation", "class", "prompt_tokens", "prefix_reused", "moved", "read", "decode", "blocks",
          "pflops", "pflops_naive", "pflops_attn_approx")


def rows(moved_per_row, cls="edited"):
    return [{"rid": f"r.q{i}.0", "conversation": f"q{i % 2}", "class": cls if i % 2 else "append",
             "prompt_tokens": 100, "prefix_reused": 50, "moved": moved, "read": 50 - moved, "decode": 5,
             "blocks": 1 if moved else 0, "pflops": 1.0 + i, "pflops_naive": 2.0 + i, "pflops_attn_approx": 1.5 + i}
            for i, moved in enumerate(moved_per_row)]


def test_metrics_count_requests_with_relocation_and_blocks():
    data = rows([0, 10, 0, 30, 1])  # one row moved a single token
    out = compare.metrics(data, {})
    assert out["requests_with_relocation"] == len([r for r in data if r["moved"]])
    assert out["blocks"] == sum(r["blocks"] for r in data)
    assert out["requests"] == len(data) and out["checks"] == "pass"
    edited = [r for r in data if r["class"] == "edited"]
    assert out["edited_requests"] == len(edited)
    prompt = sum(r["prompt_tokens"] for r in edited)
    shares = (("prefix_reused", "edited_prefix_share"), ("moved", "edited_moved_share"), ("read", "edited_read_share"))
    for key, share in shares:
        assert out[share] == pytest.approx(sum(r[key] for r in edited) / prompt)


def write_run(path, data):
    path.mkdir()
    with open(path / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(data)
    (path / "summary.json").write_text(json.dumps({"checks_failed": []}))
    return path


@pytest.mark.parametrize("names, expected", [(("scr", "radix"), "radix"), (("scr", "exact"), "scr")],
                         ids=["radix-when-present", "else-the-first-run"])
def test_the_baseline_is_radix_when_present_else_the_first_run(tmp_path, names, expected, monkeypatch):
    monkeypatch.setattr(compare, "plot_provenance", lambda runs, path: None)
    monkeypatch.setattr(compare, "plot_read_cdf", lambda runs, path: None)
    dirs = {name: write_run(tmp_path / name, rows([0, 10 * i, 20])) for i, name in enumerate(names)}
    result = compare.compare(dirs, tmp_path / "out")
    assert result["baseline"] == expected
    assert result["table"][expected]["pflops_per_request_ratio"] == 1.0


@pytest.mark.filterwarnings("ignore:No artists with labels")  # the bars are not drawn here
def test_the_provenance_plot_stacks_percent_shares_of_all_and_of_edited_rows(tmp_path, monkeypatch):
    drawn = {}

    def stacked_bars(ax, labels, stacks, width):
        drawn["labels"], drawn["stacks"] = labels, {name: values for name, values, _ in stacks}

    monkeypatch.setattr(compare.plots, "stacked_bars", stacked_bars)
    monkeypatch.setattr(compare.plots, "save", lambda fig, path: compare.plots.pyplot().close(fig))
    data = rows([0, 10, 0, 30, 5])
    compare.plot_provenance({"scr": data}, tmp_path / "p.png")
    edited = [r for r in data if r["class"] == "edited"]
    for index, subset in enumerate((data, edited)):
        prompt = sum(r["prompt_tokens"] for r in subset)
        for key in ("prefix_reused", "moved", "read"):
            expected = 100 * sum(r[key] for r in subset) / prompt
            assert drawn["stacks"][key.replace("_", "-")][index] == pytest.approx(expected)
    assert drawn["labels"] == ["scr\nall", "scr\nedited"]
