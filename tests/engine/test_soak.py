"""``python -m eval.soak`` against each policy's server on the tiny model (CPU): a time-bounded
multi-tenant load with aborts, malformed requests and fresh-salt replays, then every check of the
soak (alive, no fatal log line, SGLang's strict idle leak check, event identity, isolation, scr's
sessions per salt, exact's cached = cold bit for bit, 4xx for malformed, no 5xx).

Malformed set ``safe`` for now: SGLang 0.5.16 passes token ids outside the vocabulary (and
negative ids) to the model, which stops the scheduler; the input validation that rejects them is
being added to the overlay, after which this test can send ``all``.

Report and per-request rows: ``.artifacts/soak/<policy>/``.
"""

from __future__ import annotations

import pytest

from eval.soak import format_table, run_soak
from eval.soak.conversation import ConversationConfig
from tests.conftest import ARTIFACTS
from tests.engine.conftest import STRICT_ENV, start_server

pytestmark = pytest.mark.engine

COMMON = ["--max-total-tokens", "12288", "--max-running-requests", "4"]
POLICY_ARGS = {
    "radix": ["--cache-policy", "radix", "--chunked-prefill-size", "256"],
    "exact": ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=128",
              "--cache-policy-set", "retain_every=512"],
    "scr": ["--cache-policy", "scr", "--chunked-prefill-size", "256",
            "--cache-policy-set", "side_sessions=16", "--cache-policy-set", "side_tokens=4096"],
}
# 50 load requests or 75 s of load, whichever comes first (requests in flight at the deadline
# still finish); prompts up to 1,800 tokens (scr still gets >= 1,024-token common prefixes). With
# start-up (~30 s) and the sequential checks (~30 s) a policy takes at most ~2.5 minutes on an
# idle 2-core machine; on a busy one the time bound keeps the load phase short, with fewer requests.
# malformed_share 0.15 (default 0.07) so the four safe kinds are all sent even in a short run.
SOAK = dict(requests=50, minutes=1.25, concurrency=3, tenants=3, malformed="safe", malformed_share=0.15,
            exact_sample=3, final_probes=2, max_new_tokens=8, idle_s=5.0,
            conversation=ConversationConfig(max_prompt=1800))


@pytest.mark.parametrize("policy", list(POLICY_ARGS))
def test_soak(tiny_model_dir, tmp_path, policy):
    events = tmp_path / "events.jsonl"
    server = start_server(tiny_model_dir, tmp_path, policy,
                          [*COMMON, *POLICY_ARGS[policy], "--cache-events", str(events)], env=STRICT_ENV)
    try:
        report = run_soak(server.url, ARTIFACTS / "soak" / policy, events=events, log=server.log_path,
                          policy=policy, seed=11, **SOAK)
    finally:
        server.stop()
    table = format_table(report)
    print(table)
    assert report["passed"], table
    counts, measured = report["counts"], report["measured"]
    # Quotas put one of each kind among the first requests, however slow the machine is.
    assert counts["ok"] >= 5 and counts["aborted"] >= 1 and counts["malformed"] >= 1, table
    assert counts["probes"] >= 1 and counts["turns_completions"] >= 1, table
    assert measured["prefix_reused"] > 0, measured  # the conversations do hit the cache
    if policy != "scr":
        assert measured["moved"] == 0
