"""``python -m eval.soak`` against each policy's server on the tiny model (CPU), as
``python -m eval.soak.policies`` runs it: a multi-tenant load of ``REQUESTS`` requests with aborts,
malformed requests and fresh-salt replays, then every check of the soak (alive, no fatal log line,
SGLang's strict idle leak check, event identity, isolation, scr's sessions per salt, exact's cached
= cold bit for bit, 4xx for malformed, no 5xx), and the request-safety phases (200 cases of the
schema fuzz, the regex bomb beside trivial requests, the request limits beside trivial requests,
the namespace pairs; eval/soak/safety.py, eval/soak/bounds.py).

The load is bounded by its request count, never by time: it sends the same quota of each kind on
a fast machine and on a busy one (a time-bounded load once sent one malformed request where two
were due), and the latency ratios are reported, not judged (``max_latency_ratio=None``).

Malformed set ``all``: stock SGLang's own 400s plus every kind only the overlay's validation
rejects (token ids outside the vocabulary, negative ids, absurd logprob fields, over-long keys).

About a minute per policy on the idle 2-core box (start-up, the load, the sequential phases).
Report, per-request rows and server log: ``.artifacts/soak/<policy>/``.
"""

from __future__ import annotations

import math

import pytest

from eval.soak import format_table
from eval.soak.conversation import ConversationConfig
from eval.soak.policies import POLICY_ARGS, soak_policy
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.engine

# Prompts up to 1,800 tokens (scr still gets >= 1,024-token common prefixes); malformed_share 0.15
# (default 0.07): ceil(0.15 x REQUESTS) malformed requests, the first kinds of the set in order.
REQUESTS = 60
MALFORMED_SHARE = 0.15
SOAK = dict(requests=REQUESTS, concurrency=3, tenants=3, malformed="all", malformed_share=MALFORMED_SHARE,
            exact_sample=3, final_probes=2, max_new_tokens=8, idle_s=5.0, fuzz_cases=200, regex_bomb_tokens=64,
            max_latency_ratio=None, conversation=ConversationConfig(max_prompt=1800))


@pytest.mark.parametrize("policy", list(POLICY_ARGS))
def test_soak(tiny_model_dir, policy):
    report = soak_policy(tiny_model_dir, ARTIFACTS / "soak" / policy, policy, seed=11, **SOAK)
    table = format_table(report)
    print(table)
    assert report["passed"], table
    counts, measured = report["counts"], report["measured"]
    # Quotas follow the request count, so these hold however slow the machine is.
    expected_malformed = math.ceil(MALFORMED_SHARE * REQUESTS)
    assert counts["malformed"] == counts["malformed_4xx"] == expected_malformed, table
    assert set(counts["malformed_by_kind"]) == set(report["config"]["malformed_kinds"][:expected_malformed])
    assert counts["ok"] >= 5 and counts["aborted"] >= 1, table
    assert counts["probes"] >= 1 and counts["turns_completions"] >= 1, table
    assert measured["prefix_reused"] > 0, measured  # the conversations do hit the cache
    # the request-safety phases ran (a pass of each is part of report["passed"])
    phases = ("schema_fuzz", "regex_bomb", "namespaces", "bounds")
    assert {report["checks"][name]["status"] for name in phases} == {"pass"}
    print("latency ratios (reported, not judged):", report["checks"]["regex_bomb"]["detail"], "|",
          report["checks"]["bounds"]["detail"])
    assert report["safety"]["fuzz"]["summary"]["cases"] == 200, report["safety"]
    if policy != "scr":
        assert measured["moved"] == 0
