from __future__ import annotations

import pytest

from eval.server import ServerProcess

# Small pools and 32-token prefill chunks: a 100-token prompt leaves recurrent-state
# checkpoints at 32, 64 and 96 (no_buffer saves one at every forward end).
TEST_SERVER_ARGS = [
    "--max-total-tokens", "4096",
    "--max-mamba-cache-size", "16",
    "--chunked-prefill-size", "32",
    "--max-running-requests", "4",
]
# SGLang's own idle memory-leak check stays on and strict (it raises in the scheduler).
STRICT_ENV = {"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}


def start_server(model_dir, tmp_dir, name, extra_args=(), stock=False) -> ServerProcess:
    return ServerProcess(
        model_path=str(model_dir),
        log_path=tmp_dir / f"{name}.log",
        extra_args=[*TEST_SERVER_ARGS, *extra_args],
        stock=stock,
        env=STRICT_ENV,
    ).start()


@pytest.fixture(scope="module")
def radix_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("radix")
    server = start_server(
        tiny_model_dir, tmp, "radix",
        ["--cache-policy", "radix", "--cache-events", str(tmp / "events.jsonl")],
    )
    server.events_path = tmp / "events.jsonl"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
