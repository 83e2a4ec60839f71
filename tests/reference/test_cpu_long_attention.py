"""``patches/cpu/attention.py``: the chunk-only prefill attention equals SGLang's torch-native
extend attention (which computes redundant query rows) on a batch mixing long and short requests;
short requests are computed by SGLang's own function, bit for bit."""

from __future__ import annotations

import pytest
import torch

from patches.cpu import attention

torch_native = pytest.importorskip("sglang.srt.layers.attention.torch_native_backend")


def _batch(lengths, prefixes, heads=4, kv_heads=2, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = sum(lengths) + 16
    k_cache = torch.randn(slots, kv_heads, dim, generator=g)
    v_cache = torch.randn(slots, kv_heads, dim, generator=g)
    req_to_token = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    perm = torch.randperm(slots, generator=g)
    at = 0
    for i, total in enumerate(lengths):
        req_to_token[i, :total] = perm[at:at + total]
        at += total
    chunks = [t - p for t, p in zip(lengths, prefixes)]
    query = torch.randn(sum(chunks), heads, dim, generator=g)
    return query, k_cache, v_cache, req_to_token, torch.arange(len(lengths)), torch.tensor(lengths), \
        torch.tensor(prefixes), torch.tensor(chunks)


def _run(function, batch):
    query, k_cache, v_cache, req_to_token, pool, seq_lens, prefix_lens, extend_lens = batch
    output = torch.full_like(query, float("nan"))
    backend = object.__new__(torch_native.TorchNativeAttnBackend)
    function(backend, query, output, k_cache, v_cache, req_to_token, pool, seq_lens, prefix_lens, extend_lens, None,
             scaling=0.125, enable_gqa=True, causal=True, is_cross_attn=False, sliding_window_size=None)
    return output


def test_long_and_short_requests_match_sglang(monkeypatch):
    monkeypatch.setattr(attention, "LONG_KV", 300)  # small sizes keep the test fast
    stock = torch_native.TorchNativeAttnBackend._run_sdpa_forward_extend
    batch = _batch(lengths=[700, 120, 333, 301], prefixes=[512, 0, 300, 1])
    expected = _run(stock, batch)
    ours = _run(lambda *a, **k: attention.around_forward_extend(stock, *a, **k), batch)
    assert not torch.isnan(ours).any()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    short = slice(700 - 512, 700 - 512 + 120)  # the 120-token request took SGLang's own path
    assert torch.equal(ours[short], expected[short])


def test_all_short_batch_is_sglang_itself(monkeypatch):
    calls = []

    def stock(*args, **kwargs):
        calls.append(args)
        return torch_native.TorchNativeAttnBackend._run_sdpa_forward_extend(*args, **kwargs)

    batch = _batch(lengths=[100, 60], prefixes=[36, 0])
    expected = _run(torch_native.TorchNativeAttnBackend._run_sdpa_forward_extend, batch)
    ours = _run(lambda *a, **k: attention.around_forward_extend(stock, *a, **k), batch)
    assert len(calls) == 1 and torch.equal(ours, expected)
