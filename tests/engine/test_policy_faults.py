"""A failing policy hook ends that request, never the server: ``radix`` and ``exact``.

(``scr``'s steps: ``tests/engine/test_scr_faults.py``.) Each server runs with named fault points
(``policy/faults.py``) that raise for the rids of one test only. After each failure the server
must answer the next request, the failed request's event must say why (``fallback``), the answer
must equal the independent reference (``tests/reference``), and for ``exact`` the cold one, bit for
bit (a failed plan becomes a cold read).
"""

from __future__ import annotations

import pytest

from eval.server import output_record, wait_for_events
from tests.engine.conftest import RADIX_ARGS, assert_equals_reference, start_server
from tests.engine.prompts import prompt_ids
from tests.engine.test_exact_server import exact_args

pytestmark = pytest.mark.engine

FAULTS = {
    "radix": "radix.plan~f-plan@1,radix.release~f-release@1",
    "exact": "exact.plan~f-plan@1,exact.piece~f-piece@1,exact.release~f-release@1",
}


def policy_args(policy, tmp):
    if policy == "exact":
        return exact_args(tmp)
    return [*RADIX_ARGS, "--cache-policy", "radix", "--cache-events", str(tmp / "events.jsonl")]


@pytest.fixture(scope="module", params=["radix", "exact"])
def server(request, tiny_model_dir, tmp_path_factory):
    policy = request.param
    tmp = tmp_path_factory.mktemp(f"faults-{policy}")
    server = start_server(tiny_model_dir, tmp, f"faults-{policy}", policy_args(policy, tmp),
                          env={"CACHE_POLICY_FAULTS": FAULTS[policy]})
    server.events_path, server.policy = tmp / "events.jsonl", policy
    yield server
    server.stop()
    fatal = [line for line in server.fatal_lines() if "Traceback" not in line]  # contained ones log theirs
    assert fatal == [] and "Scheduler hit an exception" not in server.log_text(), server.log_tail()


@pytest.mark.parametrize("step", ["plan", "piece", "release"])
def test_a_failing_hook_ends_one_request_not_the_server(server, reference, step):
    if step == "piece" and server.policy != "exact":
        pytest.skip("only exact keeps snapshots per piece")
    prompt = prompt_ids(500 + len(step), 300)
    server.flush_cache()
    server.generate(prompt, 6, rid=f"warm-{step}")  # something to reuse
    record = output_record(server.generate(prompt, 6, rid=f"f-{step}.1"))
    event = wait_for_events(server.events_path, [f"f-{step}.1"])[f"f-{step}.1"]
    assert event["fallback"] and event["fallback"].startswith(step), event
    assert f"fallback rid=f-{step}.1 step={step}" in server.log_text()
    assert_equals_reference(reference, prompt, record, f"{server.policy} after a failing {step}")
    if server.policy == "exact":
        server.flush_cache()
        cold = output_record(server.generate(prompt, 6, rid=f"cold-{step}"))
        assert (record["output_ids"], record["logprobs"]) == (cold["output_ids"], cold["logprobs"])
        if step == "plan":
            assert event["prefix_reused"] == 0  # planned as a cold read
    assert len(output_record(server.generate(prompt_ids(9, 64), 4, rid=f"after-{step}"))["output_ids"]) == 4
