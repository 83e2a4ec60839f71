"""A/A: ``--cache-policy radix`` through the overlay must be inert.

The same request sequence goes to stock SGLang (``python -m sglang.launch_server``, which still
loads the CPU platform support but no policy hooks) and to ``patches.launch_server
--cache-policy radix``; token ids, logprobs and ``cached_tokens`` must be identical.
"""

from __future__ import annotations

import pytest

from eval.server import output_record
from tests.engine.conftest import RADIX_ARGS, start_server
from tests.engine.prompts import prompt_ids

pytestmark = pytest.mark.engine


def run_sequence(server) -> list[dict]:
    base = prompt_ids(seed=11, length=100)
    requests = [
        base,  # miss
        base,  # hit at 96
        base[:70] + prompt_ids(seed=12, length=40),  # branch: hit at 64
        prompt_ids(seed=13, length=45),  # unrelated
        base + prompt_ids(seed=14, length=20),  # extends the first prompt: hit at its end, 100
    ]
    records = [output_record(server.generate(ids, 10)) for ids in requests]
    chat = server.chat([{"role": "user", "content": "Name three prime numbers."}], max_tokens=6,
                       ignore_eos=True, logprobs=True)
    choice = chat["choices"][0]
    records.append({
        "content": choice["message"]["content"],
        "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
        "usage": chat["usage"],
    })
    return records


def test_radix_policy_is_inert(tiny_model_dir, tmp_path):
    with start_server(tiny_model_dir, tmp_path, "stock", RADIX_ARGS, stock=True) as stock:
        expected = run_sequence(stock)
        assert "[cache-policy] overlay installed" in stock.log_text()
        assert "policy=None" in stock.log_text()
        assert "cache policy radix started" not in stock.log_text()
    assert stock.fatal_lines() == []
    with start_server(tiny_model_dir, tmp_path, "radix", [*RADIX_ARGS, "--cache-policy", "radix"]) as patched:
        observed = run_sequence(patched)
        assert "cache policy radix started" in patched.log_text()
    assert patched.fatal_lines() == []
    assert [r.get("cached_tokens") for r in expected[:5]] == [0, 96, 64, 0, 100]
    assert observed == expected
