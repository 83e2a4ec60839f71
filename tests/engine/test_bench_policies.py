"""``python -m eval.bench_policies`` on a 1-question synthetic CLM set (15 calls, 53k prompt tokens, edits included): the same trace
replayed under radix, exact and scr with forced decoding, every ingest check passing, exact's
reuse equal to ``exact_cache.replay`` on every call, and the table written; then the offline
estimate of every arm (``python -m eval.offline``, no server) against that served run.

Three servers one after another on the long-context tiny model (a few minutes in all), shared by
the module's tests.
"""

from __future__ import annotations

import json

import pytest

from eval import bench_policies
from eval.arms import parse_arms
from eval.traces import read_trace, write_trace
from eval.traces.synth import load_tokenizer, synthesize_small
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "small1.jsonl"
    write_trace(synthesize_small(load_tokenizer("tiny"), 1, seed=0).calls, path)
    return path


CONCURRENCY = 2
OFFLINE_TOLERANCE = 0.005  # half a point of the prompt tokens


@pytest.fixture(scope="module")
def served(small_trace):
    """The benchmark's served run of the small set: (its summary, its folder)."""
    from eval.tiny_model import cached_build

    out = ARTIFACTS / "bench-small"
    summary = bench_policies.bench(small_trace, out, parse_arms(None), concurrency=CONCURRENCY,
                                   model_dir=cached_build(ARTIFACTS, max_positions=131072))
    return summary, out


def test_bench_on_the_small_set(small_trace, served):
    summary, out = served
    calls = read_trace(small_trace)
    results = summary["results"]
    for policy, result in results.items():
        assert result["checks_failed"] == [], (policy, result["checks_failed"][:5])
        assert result["fatal_lines"] == [], (policy, result["fatal_lines"])
        client = [json.loads(line) for line in (out / policy / "client.jsonl").read_text().splitlines()]
        assert len(client) == len(calls)
    assert results["exact"]["exact_prediction"]["calls"] == len(calls)
    assert results["exact"]["exact_prediction"]["share"] == 1.0, results["exact"]["exact_prediction"]["differ"]
    assert summary["edited_calls"] > 0  # the set has context edits
    table = json.loads((out / "compare" / "table.json").read_text())["table"]
    assert table["radix"]["prefix_share"] > 0.3  # the agent's appends hit radix's cache
    assert table["radix"]["moved_share"] == 0 and table["exact"]["moved_share"] == 0
    assert table["scr"]["moved_share"] > 0  # scr relocates rows after the edits
    text = (out / "table.md").read_text()
    assert text.count("|") > 20 and "moved points by cause" in text and "benchmark wall time" in text
    # every call is classed, and scr's moved tokens are all attributed
    assert sum(c["calls"] for c in results["scr"]["causes"].values()) == len(calls)
    from eval.accounting.compare import read_run

    rows, _ = read_run(out / "scr" / "report")
    assert sum(c["moved"] for c in results["scr"]["causes"].values()) == sum(r["moved"] for r in rows) > 0
    assert results["scr"]["relocation_read_bound"]["tokens"] >= 0 and "relocation_read_bound" not in results["radix"]
    for plot in ("provenance_stack.png", "read_cdf.png"):
        assert (out / "compare" / plot).stat().st_size > 0


def test_the_offline_estimate_agrees_with_the_served_run(small_trace, served):
    """Every served arm's prefix / moved / read shares within half a point of ``eval.offline``'s
    estimate, the calls taken in the replay's arrival order at the served concurrency."""
    from eval.offline.run import measure

    summary, out = served
    offline = measure(small_trace, concurrency=CONCURRENCY)["arms"]
    table = json.loads((out / "compare" / "table.json").read_text())["table"]
    for arm in summary["results"]:
        for share in ("prefix", "moved", "read"):
            assert abs(table[arm][f"{share}_share"] - offline[arm][share]) <= OFFLINE_TOLERANCE, (
                arm, share, table[arm][f"{share}_share"], offline[arm][share])
    assert offline["scr"]["moved"] > 0  # the check covers a relocating arm
