"""The pure-torch CPU kernels (patches/cpu/kernels.py) against independent references.

References: a token-by-token loop written here from the recurrence, transformers' own torch
implementations of Qwen3.5's GDN pieces, and ``F.conv1d``. Tolerances are for fp32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from patches.cpu import kernels

H, HV, K, V = 2, 4, 16, 16
ATOL = 2e-5


def gdn_inputs(seq_len: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, seq_len, H, K, generator=gen)
    k = torch.randn(1, seq_len, H, K, generator=gen)
    v = torch.randn(1, seq_len, HV, V, generator=gen)
    # Long memory (decay close to 1) so chunk-boundary mistakes cannot hide.
    g = -torch.rand(1, seq_len, HV, generator=gen) * 0.05
    beta = torch.rand(1, seq_len, HV, generator=gen)
    return q, k, v, g, beta


def recurrence(q, k, v, g, beta, state):
    """The gated delta rule one token at a time (state ``[HV, K, V]``), fp32, l2-normalised q/k."""
    q = F.normalize(q[0].repeat_interleave(HV // H, dim=1), dim=-1, eps=0)
    k = F.normalize(k[0].repeat_interleave(HV // H, dim=1), dim=-1, eps=0)
    outs = []
    for t in range(q.shape[0]):
        state = state * g[0, t].exp()[:, None, None]
        u = beta[0, t][:, None] * (v[0, t] - torch.einsum("hkv,hk->hv", state, k[t]))
        state = state + k[t][:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, q[t] * K**-0.5))
    return torch.stack(outs), state


def run_prefill(q, k, v, g, beta, pool, slot, bounds):
    """Call the CPU chunk kernel for one sequence split into forwards at ``bounds``."""
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        o, _, h = kernels.chunk_gated_delta_rule(
            q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end], beta[:, start:end],
            initial_state=pool, initial_state_indices=torch.tensor([slot]),
            cu_seqlens=torch.tensor([0, end - start]), use_qk_l2norm_in_kernel=True,
        )
        assert h is None
        outs.append(o[0])
    return torch.cat(outs)


@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 150])
def test_chunked_prefill_matches_token_recurrence(seq_len):
    q, k, v, g, beta = gdn_inputs(seq_len)
    start = torch.randn(HV, K, V, generator=torch.Generator().manual_seed(9)) * 0.1
    pool = torch.zeros(3, HV, V, K)
    pool[1] = start.transpose(-1, -2)
    out = run_prefill(q, k, v, g, beta, pool, 1, [0, seq_len])
    ref_out, ref_state = recurrence(q, k, v, g, beta, start)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(pool[1].transpose(-1, -2), ref_state, atol=ATOL, rtol=1e-4)
    assert pool[0].abs().sum() == 0 and pool[2].abs().sum() == 0  # other slots untouched


def test_chunked_prefill_matches_transformers_reference():
    q, k, v, g, beta = gdn_inputs(130, seed=3)
    pool = torch.zeros(2, HV, V, K)
    out = run_prefill(q, k, v, g, beta, pool, 1, [0, 130])
    expand = lambda t: t.repeat_interleave(HV // H, dim=2)  # noqa: E731
    ref_out, ref_state = hf.torch_chunk_gated_delta_rule(
        expand(q), expand(k), v, g, beta, chunk_size=64, initial_state=None,
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, ref_out[0], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(pool[1].transpose(-1, -2), ref_state[0], atol=ATOL, rtol=1e-4)


def test_split_on_the_64_grid_is_bitwise_identical_to_one_forward():
    q, k, v, g, beta = gdn_inputs(200, seed=5)
    one_pool, split_pool = torch.zeros(2, HV, V, K), torch.zeros(2, HV, V, K)
    one = run_prefill(q, k, v, g, beta, one_pool, 1, [0, 200])
    split = run_prefill(q, k, v, g, beta, split_pool, 1, [0, 64, 192, 200])
    assert torch.equal(one, split)
    assert torch.equal(one_pool, split_pool)


def test_split_off_the_grid_is_close_but_computed_differently():
    q, k, v, g, beta = gdn_inputs(200, seed=5)
    one_pool, split_pool = torch.zeros(2, HV, V, K), torch.zeros(2, HV, V, K)
    one = run_prefill(q, k, v, g, beta, one_pool, 1, [0, 200])
    split = run_prefill(q, k, v, g, beta, split_pool, 1, [0, 50, 200])
    torch.testing.assert_close(one, split, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(one_pool, split_pool, atol=ATOL, rtol=1e-4)


def test_varlen_batch_equals_sequences_run_alone():
    q, k, v, g, beta = gdn_inputs(100, seed=7)
    pool = torch.zeros(4, HV, V, K)
    batched, _, _ = kernels.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, initial_state_indices=torch.tensor([3, 1]),
        cu_seqlens=torch.tensor([0, 70, 100]), use_qk_l2norm_in_kernel=True,
    )
    alone_pool = torch.zeros(4, HV, V, K)
    first = run_prefill(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], alone_pool, 3, [0, 70])
    second = run_prefill(q[:, 70:], k[:, 70:], v[:, 70:], g[:, 70:], beta[:, 70:], alone_pool, 1, [0, 30])
    assert torch.equal(batched[0], torch.cat([first, second]))
    assert torch.equal(pool, alone_pool)


def test_decode_continues_a_prefill_like_the_recurrence():
    q, k, v, g, beta = gdn_inputs(70, seed=11)
    gen = torch.Generator().manual_seed(12)
    a = torch.randn(70, HV, generator=gen)
    b = torch.randn(70, HV, generator=gen)
    A_log = torch.rand(HV, generator=gen).log()
    dt_bias = torch.randn(HV, generator=gen)
    g_all, beta_all = kernels.fused_gdn_gating(A_log, a, b, dt_bias)
    pool = torch.zeros(2, HV, V, K)
    prefill = run_prefill(q[:, :66], k[:, :66], v[:, :66], g_all[:, :66], beta_all[:, :66], pool, 1, [0, 66])
    steps = []
    for t in range(66, 70):
        o = kernels.fused_sigmoid_gating_delta_rule_update(
            A_log=A_log, a=a[t:t + 1], dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=q[:, t:t + 1], k=k[:, t:t + 1], v=v[:, t:t + 1], b=b[t:t + 1],
            initial_state_source=pool, initial_state_indices=torch.tensor([1]),
            cu_seqlens=torch.tensor([0, 1]), use_qk_l2norm_in_kernel=True,
        )
        steps.append(o[0])
    ref_out, ref_state = recurrence(q, k, v, g_all, torch.sigmoid(b).unsqueeze(0), torch.zeros(HV, K, V))
    torch.testing.assert_close(torch.cat([prefill, *steps]), ref_out, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(pool[1].transpose(-1, -2), ref_state, atol=ATOL, rtol=1e-4)


def decode_step(gates, q, k, v, a, b, pool, slots):
    A_log, dt_bias = gates
    return kernels.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q, k=k, v=v, b=b,
        initial_state_source=pool, initial_state_indices=torch.tensor(slots),
        cu_seqlens=torch.arange(len(slots) + 1), use_qk_l2norm_in_kernel=True,
    )


@pytest.mark.parametrize("batch", [2, 4, 9])
def test_a_decode_row_has_the_same_bits_in_any_batch(batch):
    """``exact``'s promise on CPU: a sequence decoded beside others gets the bits it gets alone,
    output and state. Computed over the whole batch, torch's elementwise softplus/sigmoid round a
    row differently when it falls in the SIMD body rather than the scalar tail."""
    gen = torch.Generator().manual_seed(40 + batch)
    gates = (torch.rand(HV, generator=gen).log(), torch.randn(HV, generator=gen))
    for _ in range(16):
        q, k = (torch.randn(1, batch, H, K, generator=gen) for _ in range(2))
        v = torch.randn(1, batch, HV, V, generator=gen)
        a, b = (torch.randn(batch, HV, generator=gen) * 4 for _ in range(2))
        start = torch.randn(batch, HV, V, K, generator=gen)
        pool = start.clone()
        together = decode_step(gates, q, k, v, a, b, pool, list(range(batch)))
        for row in range(batch):
            alone_pool = start.clone()
            alone = decode_step(gates, q[:, row:row + 1], k[:, row:row + 1], v[:, row:row + 1],
                                a[row:row + 1], b[row:row + 1], alone_pool, [row])
            assert torch.equal(together[0, row], alone[0, 0]), row
            assert torch.equal(pool[row], alone_pool[row]), row


def test_gating_formula():
    A_log = torch.tensor([0.0, -1.0])
    a = torch.tensor([[0.5, 30.0]])
    b = torch.tensor([[0.0, 2.0]])
    dt_bias = torch.tensor([0.1, 0.0])
    g, beta = kernels.fused_gdn_gating(A_log, a, b, dt_bias)
    expected_g = torch.tensor([[[-F.softplus(torch.tensor(0.6)).item(), -torch.exp(torch.tensor(-1.0)).item() * 30.0]]])
    torch.testing.assert_close(g, expected_g)
    torch.testing.assert_close(beta, torch.sigmoid(b).unsqueeze(0))
    assert g.shape == (1, 1, 2) and g.dtype == torch.float32


def conv_reference(x, weight, bias, history):
    window = torch.cat([history, x], dim=-1)
    return F.silu(F.conv1d(window.unsqueeze(0), weight.unsqueeze(1), bias, groups=x.shape[0])[0])


def test_causal_conv_varlen_with_initial_states():
    gen = torch.Generator().manual_seed(21)
    dim, width = 8, 4
    x = torch.randn(dim, 13, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.randn(5, dim, width - 1, generator=gen)
    before = states.clone()
    out = kernels.causal_conv1d_fn(
        x, weight, bias, conv_states=states, query_start_loc=torch.tensor([0, 2, 13]),
        seq_lens_cpu=[2, 11], cache_indices=torch.tensor([4, 0]),
        has_initial_state=torch.tensor([True, False]), activation="silu",
    )
    torch.testing.assert_close(out[:, :2], conv_reference(x[:, :2], weight, bias, before[4]))
    torch.testing.assert_close(out[:, 2:], conv_reference(x[:, 2:], weight, bias, torch.zeros(dim, width - 1)))
    # A 2-token sequence keeps one old column and its two inputs.
    torch.testing.assert_close(states[4], torch.cat([before[4][:, -1:], x[:, :2]], dim=-1))
    torch.testing.assert_close(states[0], x[:, 10:13])
    assert torch.equal(states[1:4], before[1:4])


def test_causal_conv_decode_continues_prefill():
    gen = torch.Generator().manual_seed(22)
    dim, width = 6, 4
    x = torch.randn(dim, 10, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.zeros(2, dim, width - 1)
    full = kernels.causal_conv1d_fn(
        x, weight, bias, conv_states=torch.zeros(2, dim, width - 1), query_start_loc=torch.tensor([0, 10]),
        seq_lens_cpu=[10], cache_indices=torch.tensor([1]), has_initial_state=torch.tensor([False]),
    )
    kernels.causal_conv1d_fn(
        x[:, :7], weight, bias, conv_states=states, query_start_loc=torch.tensor([0, 7]),
        seq_lens_cpu=[7], cache_indices=torch.tensor([1]), has_initial_state=torch.tensor([False]),
    )
    for t in range(7, 10):
        y = kernels.causal_conv1d_update(x[:, t].unsqueeze(0), states, weight, bias, "silu",
                                         conv_state_indices=torch.tensor([1]))
        torch.testing.assert_close(y[0], full[:, t])


def test_gated_rmsnorm_matches_transformers():
    gen = torch.Generator().manual_seed(31)
    x, z = torch.randn(5, 3, 16, generator=gen), torch.randn(5, 3, 16, generator=gen)
    ref = hf.Qwen3_5RMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(16, generator=gen))

    class Module:
        weight, bias, eps, group_size, norm_before_gate, activation = ref.weight, None, 1e-6, None, True, "swish"

    torch.testing.assert_close(kernels.rms_norm_gated(Module, x, z), ref(x, z))


def test_split_of_contiguous_projection_layout():
    qkvz = torch.arange(2 * (2 * 2 * 3 + 2 * 4 * 2)).float().view(2, -1)  # H=2,K=3; HV=4,V=2
    ba = torch.arange(2 * 8).float().view(2, 8)
    mixed_qkv, z, b, a = kernels.fused_qkvzba_split_reshape_cat_contiguous(qkvz, ba, 2, 4, 3, 2)
    assert torch.equal(mixed_qkv, qkvz[:, :20])
    assert torch.equal(z, qkvz[:, 20:].view(2, 4, 2))
    assert torch.equal(b, ba[:, :4]) and torch.equal(a, ba[:, 4:])


def test_sigmoid_gate_in_place_with_strided_gate():
    gen = torch.Generator().manual_seed(41)
    attn = torch.randn(3, 8, generator=gen)
    packed = torch.randn(3, 2, 8, generator=gen)
    gate = packed[:, :, 4:]  # strided 3-D view [T, heads, dim]
    expected = attn * torch.sigmoid(gate.reshape(3, 8))
    result = kernels.fused_sigmoid_mul(attn, gate, inplace=True)
    assert result is attn
    torch.testing.assert_close(attn, expected)


def test_gpu_only_arguments_are_refused():
    with pytest.raises(NotImplementedError, match="intermediate_conv_window"):
        kernels.causal_conv1d_update(torch.zeros(1, 4), torch.zeros(1, 4, 3), torch.zeros(4, 4),
                                     intermediate_conv_window=torch.zeros(1))
