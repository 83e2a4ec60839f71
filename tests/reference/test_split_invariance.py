"""Split invariance of the CPU engine's prefill, op by op (docs/exact.md §5.10).

``exact``'s ``cut=kept`` resumes a read at any kept multiple of 64 and ends forwards at other points
than the cold read did, so a row must get the same bits whatever forward read it: a forward may start
and end at any multiple of 64 from position 0, and the last one of a prompt ends at the prompt end,
after the prompt end's keep point floored to the grid (the same last forward cold and warm). Each
test reads the same rows through the forwards of several such splits and asserts bit-identity with
the reference split. The GDN chunk kernel's own grid test is in ``test_cpu_kernels.py``; the whole
model is checked by ``tests/engine/test_exact_kept.py``.

What failed before the fix: SGLang's torch-native extend attention (its SDPA call's blocking depends
on the query length), see ``patches/cpu/attention.py``. What holds only with care, and is pinned here:
fp32 ``F.linear`` (MKL takes another path for 1-3, 5-7 and 9-11 rows, never a forward on the grid),
elementwise ops (torch's SIMD body and scalar tail round transcendental functions differently; on
the grid every forward's size is a multiple of the vector width).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from patches.cpu import attention, kernels

torch_native = pytest.importorskip("sglang.srt.layers.attention.torch_native_backend")

TOTAL = 300  # the prompt; its last forward is [256, 300) in every split
REFERENCE = [0, 256, TOTAL]
SPLITS = [[0, 64, 256, TOTAL], [0, 128, 192, 256, TOTAL], [0, 192, 256, TOTAL], [0, 64, 128, 192, 256, TOTAL]]
HIDDEN, INTERMEDIATE, HEAD_DIM, HEADS, KV_HEADS = 64, 128, 32, 4, 2
GDN_HEADS, GDN_V_HEADS, GDN_DIM = 2, 4, 16


def forwards(bounds):
    return list(zip(bounds[:-1], bounds[1:]))


def read(op, inputs, bounds) -> torch.Tensor:
    """``op`` applied to each forward's rows of ``inputs`` (tensors with rows first), concatenated."""
    return torch.cat([op(*(t[start:end] for t in inputs)) for start, end in forwards(bounds)])


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _gemma_rmsnorm(x, weight):
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    return GemmaRMSNorm.forward_native(SimpleNamespace(weight=weight, variance_epsilon=1e-6), x)


def _silu_and_mul(x):
    from sglang.srt.layers.activation import SiluAndMul

    return SiluAndMul.forward_native(None, x)


def _gating(a, b):
    g, beta = kernels.fused_gdn_gating(randn(GDN_V_HEADS, seed=1), a, b, randn(GDN_V_HEADS, seed=2))
    return torch.cat([g[0], beta[0]], dim=-1)


def _gated_norm(x, z):
    module = SimpleNamespace(activation="silu", norm_before_gate=True, group_size=None, eps=1e-6,
                             weight=randn(GDN_DIM, seed=3), bias=None)
    return kernels.rms_norm_gated(module, x, z)


# (name, op, shapes of its row-first inputs): the row-wise ops of a Qwen3.5 prefill forward on CPU, at
# the tiny model's sizes (hidden 64, MLP 128, attention heads 4 x 32 with a gate, GDN 2/4 heads of 16).
LINEARS = [("qkvz", HIDDEN, 192), ("ba", HIDDEN, 8), ("gdn_out", HIDDEN, HIDDEN), ("qkv_gate", HIDDEN, 384),
           ("o_proj", 128, HIDDEN), ("gate_up", HIDDEN, 2 * INTERMEDIATE), ("down", INTERMEDIATE, HIDDEN),
           ("lm_head", HIDDEN, 512)]
ROW_OPS = [
    *[(f"linear_{name}", (lambda k, n: lambda x: F.linear(x, randn(n, k, seed=n + k)))(k, n), [(k,)])
      for name, k, n in LINEARS],
    ("gemma_rmsnorm_hidden", lambda x: _gemma_rmsnorm(x, randn(HIDDEN, seed=4)), [(HIDDEN,)]),
    ("gemma_rmsnorm_heads", lambda x: _gemma_rmsnorm(x.reshape(-1, HEAD_DIM), randn(HEAD_DIM, seed=5)),
     [(HEADS, HEAD_DIM)]),
    ("silu_and_mul", _silu_and_mul, [(2 * INTERMEDIATE,)]),
    ("gdn_gating", _gating, [(GDN_V_HEADS,), (GDN_V_HEADS,)]),
    ("gated_rmsnorm", _gated_norm, [(GDN_V_HEADS, GDN_DIM), (GDN_V_HEADS, GDN_DIM)]),
    ("sigmoid_gate", lambda o, g: kernels.fused_sigmoid_mul(o, g), [(HEADS * HEAD_DIM,), (HEADS, HEAD_DIM)]),
]


@pytest.mark.parametrize("name, op, shapes", ROW_OPS, ids=[op[0] for op in ROW_OPS])
def test_a_row_wise_op_gives_a_row_the_same_bits_in_any_forward_on_the_grid(name, op, shapes):
    inputs = [randn(TOTAL, *shape, seed=10 + i) for i, shape in enumerate(shapes)]
    expected = read(op, inputs, REFERENCE)
    for bounds in SPLITS:
        assert torch.equal(read(op, inputs, bounds), expected), (name, bounds)


def test_causal_conv_with_a_carried_state_gives_the_same_bits_in_any_split():
    dim, width = 2 * GDN_HEADS * GDN_DIM + GDN_V_HEADS * GDN_DIM, 4
    x, weight = randn(dim, TOTAL, seed=20), randn(dim, width, seed=21)

    def conv(bounds):
        states = torch.zeros(2, dim, width - 1)
        out = torch.cat([kernels.causal_conv1d_fn(
            x[:, start:end].contiguous(), weight, None, states, torch.tensor([0, end - start]), [end - start],
            cache_indices=torch.tensor([1]), has_initial_state=torch.tensor([start > 0]))
            for start, end in forwards(bounds)], dim=1)
        return out, states

    expected = conv(REFERENCE)
    for bounds in SPLITS + [[0, 37, 100, TOTAL]]:  # per token: off the grid too
        out, states = conv(bounds)
        assert torch.equal(out, expected[0]) and torch.equal(states, expected[1]), bounds


def _kv(total, seed):
    slots = total + 8
    k_cache, v_cache = randn(slots, KV_HEADS, HEAD_DIM, seed=seed), randn(slots, KV_HEADS, HEAD_DIM, seed=seed + 1)
    tokens = torch.randperm(slots, generator=torch.Generator().manual_seed(seed + 2))[:total]
    return k_cache, v_cache, tokens


def test_tiled_attention_gives_a_row_the_same_bits_whatever_forward_reads_it():
    total = 700  # more than one key block of torch's CPU flash attention (512)
    query = randn(total, HEADS, HEAD_DIM, seed=30)
    k_cache, v_cache, tokens = _kv(total, seed=31)

    def attend(bounds):
        return torch.cat([attention.tiled_attention(query[start:end], k_cache, v_cache, tokens[:end], 0.125, True)
                          for start, end in forwards(bounds)])

    expected = attend([0, total])
    for bounds in ([0, 128, 192, total], [0, 640, total], [0, 64, 256, 512, total], [0, 1, 37, 100, 101, total]):
        assert torch.equal(attend(bounds), expected), bounds
    torch.testing.assert_close(expected, attention.chunk_attention(query, k_cache, v_cache, tokens, 0.125, True),
                               rtol=1e-5, atol=1e-5)


def test_tiled_extend_equals_sglang_and_a_request_has_the_same_bits_alone_or_in_a_batch(monkeypatch):
    """With ``tile_every_prefill`` every request of an extend batch goes through ``tiled_attention``:
    close to SGLang's function, and a request's rows are the same alone and beside others."""
    monkeypatch.setitem(attention._TILED, "on", True)
    lengths, prefixes = [300, 130, 64, 200], [192, 0, 0, 64]
    k_cache, v_cache, slots = _kv(sum(lengths), seed=40)
    table = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    for i, row in enumerate(slots.split(lengths)):
        table[i, :lengths[i]] = row
    chunks = [t - p for t, p in zip(lengths, prefixes)]
    query = randn(sum(chunks), HEADS, HEAD_DIM, seed=43)
    backend = object.__new__(torch_native.TorchNativeAttnBackend)
    stock = torch_native.TorchNativeAttnBackend._run_sdpa_forward_extend

    def extend(function, which):
        rows = torch.cat([torch.arange(sum(chunks[:i]), sum(chunks[:i + 1])) for i in which])
        output = torch.full((len(rows), HEADS, HEAD_DIM), float("nan"))
        pick = lambda values: torch.tensor([values[i] for i in which])  # noqa: E731
        function(backend, query[rows], output, k_cache, v_cache, table, torch.tensor(which), pick(lengths),
                 pick(prefixes), pick(chunks), None, scaling=0.125, enable_gqa=True, causal=True, is_cross_attn=False,
                 sliding_window_size=None)
        return output

    ours = lambda *a, **k: attention.around_forward_extend(stock, *a, **k)  # noqa: E731
    batch = extend(ours, [0, 1, 2, 3])
    torch.testing.assert_close(batch, extend(stock, [0, 1, 2, 3]), rtol=1e-5, atol=1e-5)
    first = attention.tiled_attention(query[:chunks[0]], k_cache, v_cache, table[0, :lengths[0]], 0.125, True)
    assert torch.equal(batch[:chunks[0]], first)  # routed through the tiles
    assert torch.equal(extend(ours, [0]), first)
    assert torch.equal(extend(ours, [3, 1]), torch.cat([batch[sum(chunks[:3]):], batch[chunks[0]:sum(chunks[:2])]]))
