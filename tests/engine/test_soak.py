"""``python -m eval.soak`` against each policy's server on the tiny model (CPU), as
``python -m eval.soak.policies`` runs it: a time-bounded multi-tenant load with aborts, malformed
requests and fresh-salt replays, then every check of the soak (alive, no fatal log line, SGLang's
strict idle leak check, event identity, isolation, scr's sessions per salt, exact's cached = cold
bit for bit, 4xx for malformed, no 5xx), and the request-safety phases (200 cases of the schema
fuzz, the regex bomb beside trivial requests, the namespace pairs; eval/soak/safety.py).

Malformed set ``all``: stock SGLang's own 400s plus every kind only the overlay's validation
rejects (token ids outside the vocabulary, negative ids, absurd logprob fields, over-long keys).

About a minute per policy: 24 s of load (requests in flight at the deadline still finish), then
start-up and the sequential checks. Report, per-request rows and server log: ``.artifacts/soak/<policy>/``.
"""

from __future__ import annotations

import pytest

from eval.soak import format_table
from eval.soak.conversation import ConversationConfig
from eval.soak.policies import POLICY_ARGS, soak_policy
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.engine

# Prompts up to 1,800 tokens (scr still gets >= 1,024-token common prefixes); malformed_share 0.15
# (default 0.07) so that many kinds are sent even when a busy machine serves few requests.
SOAK = dict(minutes=0.4, concurrency=3, tenants=3, malformed="all", malformed_share=0.15,
            exact_sample=3, final_probes=2, max_new_tokens=8, idle_s=5.0, fuzz_cases=200, regex_bomb_tokens=64,
            conversation=ConversationConfig(max_prompt=1800))


@pytest.mark.parametrize("policy", list(POLICY_ARGS))
def test_soak(tiny_model_dir, policy):
    report = soak_policy(tiny_model_dir, ARTIFACTS / "soak" / policy, policy, seed=11, **SOAK)
    table = format_table(report)
    print(table)
    assert report["passed"], table
    counts, measured = report["counts"], report["measured"]
    # Quotas put one of each kind among the first requests, however slow the machine is.
    assert counts["ok"] >= 5 and counts["aborted"] >= 1 and counts["malformed"] >= 2, table
    assert {"id_over_vocab", "id_negative"} <= set(counts["malformed_by_kind"]), counts["malformed_by_kind"]
    assert counts["probes"] >= 1 and counts["turns_completions"] >= 1, table
    assert measured["prefix_reused"] > 0, measured  # the conversations do hit the cache
    # the request-safety phases ran (a pass of each is part of report["passed"])
    assert {report["checks"][name]["status"] for name in ("schema_fuzz", "regex_bomb", "namespaces")} == {"pass"}
    assert report["safety"]["fuzz"]["summary"]["cases"] == 200, report["safety"]
    if policy != "scr":
        assert measured["moved"] == 0
