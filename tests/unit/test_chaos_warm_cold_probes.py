"""eval/chaos/probes.py: exact's warm-against-cold probes, with a stand-in HTTP client.

``compare`` reports a difference in ids or in logprobs (bit for bit) and nothing for identical
answers; ``probe_exact`` asks, for each of the last calls, the server that served it (``via``;
the first server when it is not known) for a warm read (no namespace) and a cold one (a fresh
``extra_key``), and returns one result per probe."""

from __future__ import annotations

from eval.chaos import probes
from eval.chaos.trace import chaos_trace


def answer(ids, logprobs, cached):
    return {"output_ids": ids, "meta_info": {"output_token_logprobs": [[lp, i, None] for lp, i in zip(logprobs, ids)],
                                             "cached_tokens": cached, "prompt_tokens": 100}}


def test_compare_reports_ids_and_logprobs_that_differ_and_nothing_else():
    same = {"output_ids": [1, 2], "logprobs": [-0.5, -0.25]}
    assert probes.compare(same, dict(same)) == []
    assert probes.compare(same, {**same, "output_ids": [1, 3]}) == ["ids [1, 2] != [1, 3]"]
    assert probes.compare(same, {**same, "logprobs": [-0.5, -0.2500001]}) == ["logprobs differ at [1]"]


def test_each_probe_asks_the_server_that_served_the_call(monkeypatch):
    asked = []

    def post_json(url, payload, timeout):
        asked.append((url, payload["rid"], payload.get("extra_key")))
        cold = payload.get("extra_key") is not None
        return answer([5, 6], [-1.0, -2.0 if not cold else -2.5], 0 if cold else 64)

    monkeypatch.setattr(probes.http, "post_json", post_json)
    calls = chaos_trace(2, 1)
    urls = {"w0": "http://w0", "w1": "http://w1"}
    results = probes.probe_exact(urls, calls, "run", via={calls[1].rid("run"): "w1"}, probes=2)
    assert [(r["rid"], r["server"], r["warm_cached"], r["cold_cached"]) for r in results] == [
        (calls[0].rid("run"), "w0", 64, 0), (calls[1].rid("run"), "w1", 64, 0)]
    assert all(r["problems"] == ["logprobs differ at [1]"] for r in results)
    assert [url for url, _, _ in asked] == ["http://w0/generate"] * 3 + ["http://w1/generate"] * 3
    assert [salt is None for _, _, salt in asked] == [True, True, False] * 2
