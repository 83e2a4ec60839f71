from __future__ import annotations

import pytest

from eval.server import ServerProcess

# Small pools for every test server (policies that size the state pool themselves omit the second part).
TEST_SERVER_ARGS = ["--max-total-tokens", "4096"]
STATE_POOL_ARGS = ["--max-mamba-cache-size", "32"]
# radix: 32-token prefill chunks, so a 100-token prompt leaves recurrent-state checkpoints at
# 32, 64 and 96 (no_buffer saves one at every forward end).
RADIX_ARGS = ["--chunked-prefill-size", "32", "--max-running-requests", "4"]
# SGLang's own idle memory-leak check stays on and strict (it raises in the scheduler).
STRICT_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}


def start_server(model_dir, tmp_dir, name, extra_args=(), stock=False, state_pool=True, env=None,
                 graceful_stop=False) -> ServerProcess:
    """A test server; stopped by killing its process group (SGLang's graceful shutdown costs ~7 s
    per server on CPU; ``test_validation_server`` keeps it, where a hung shutdown is the bug).

    A test that starts its own server comes before the first test of its module that uses the
    module's shared server: an idle SGLang scheduler busy-polls a core, so a second server beside
    it on this 2-core box runs 3-4x slower (test_exact_server's own-server tests took 100-160 s
    each after the shared server had started, 30-45 s before it)."""
    return ServerProcess(
        model_path=str(model_dir),
        log_path=tmp_dir / f"{name}.log",
        extra_args=[*TEST_SERVER_ARGS, *(STATE_POOL_ARGS if state_pool else []), *extra_args],
        stock=stock,
        env={**STRICT_ENV, **(env or {})},
        graceful_stop=graceful_stop,
    ).start()


@pytest.fixture(scope="module")
def radix_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("radix")
    server = start_server(
        tiny_model_dir, tmp, "radix",
        [*RADIX_ARGS, "--cache-policy", "radix", "--cache-events", str(tmp / "events.jsonl")],
    )
    server.events_path = tmp / "events.jsonl"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


@pytest.fixture(scope="session")
def reference(tiny_model_dir):
    """The independent transformers-based reference of the tiny model (``tests/reference``)."""
    from tests.reference.hybrid_reference import Reference

    return Reference(tiny_model_dir)


REFERENCE_TOL = 1e-4  # max |Δ logprob| against the reference (fp32 on CPU; measured ~1e-6), as the scr tests


def assert_equals_reference(reference, prompt, record, label: str = "") -> float:
    """A served answer (``output_record``) against the reference's plain read of ``prompt``
    teacher-forced with the served ids: the greedy ids must be the reference's argmax and every
    logprob within ``REFERENCE_TOL``. Returns the distance."""
    from tests.reference.scr_reference import cold, distance

    expected = cold(reference, prompt, record["output_ids"])
    delta, ids_equal = distance(record["logprobs"], record["output_ids"], expected)
    assert ids_equal, f"{label}: greedy ids {record['output_ids']} != reference {expected.argmax}"
    assert delta < REFERENCE_TOL, f"{label}: max |Δ logprob| {delta:.3g} >= {REFERENCE_TOL}"
    return delta
