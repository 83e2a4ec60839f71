"""The rotary kernels SCR re-rotates against (``eval/gpu_check/rotary_kernels.py``), which also place
every full-attention key the cache holds: ``fused_qk_gemma_rmsnorm_rope_gate`` (Qwen3.5/3.6's gated
attention on CUDA: per-head (1 + w) RMSNorm of q and k, NeoX RoPE on the first rotary dims, the gate
split off) and ``triton_mrope_fused`` (``MRotaryEmbedding.forward_triton``; three equal position
streams for text).

Findings pinned here: a token's q, k and gate depend only on its own row and position, not on the
other tokens of the call (so not on where a forward starts either). Both kernels work one token per
program; the RMSNorm's sum runs over one head.
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, NEIGHBOURS, close_to, dtype_id
from tests.reference.hybrid_reference import inv_freq_fp64, rope

HQ, HKV, HEAD, ROTARY = 2, 1, 32, 8  # partial rotary, as Qwen3.6's 64 of 256
THETA, MAX_POSITION = 10_000.0, 512
MROPE_SECTION = [2, 1, 1]  # interleaved, rotary / 2 pairs
TOKENS = 24
POSITION0 = 100
BATCHES = [(n + 1, n // 2) for n in NEIGHBOURS]  # (tokens in the call, where the token sits)
# The fused kernel rounds the normalised q and k to bf16 (fp16 for fp16 input) before rotating, for
# any input: it has no fp32 mode, so it is tested at the dtype it serves.
FUSED_DTYPES = (torch.bfloat16,)


def _table():
    angle = torch.arange(MAX_POSITION, dtype=torch.float32)[:, None] * inv_freq_fp64(ROTARY, THETA).float()[None]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)  # [positions, rotary]: cos | sin, fp32 (CUDA's table)


def _rows(dtype):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(TOKENS, HQ * 2 * HEAD, generator=generator).to(dtype),  # q and gate, interleaved per head
            torch.randn(TOKENS, HKV * HEAD, generator=generator).to(dtype),
            (torch.randn(HEAD, generator=generator) * 0.1).to(dtype),
            (torch.randn(HEAD, generator=generator) * 0.1).to(dtype))


def fused(sgl, q_gate, k, q_weight, k_weight, positions):
    return sgl.qk_norm_rope.fused_qk_gemma_rmsnorm_rope_gate(
        q_gate.contiguous(), k.contiguous(), q_weight, k_weight, _table(), positions.contiguous(), 1e-6, HQ, HKV,
        HEAD, ROTARY, has_gate=True)


def mrope(sgl, q, k, positions):
    q, k = q.clone(), k.clone()  # rotated in place
    sgl.mrope.triton_mrope_fused(q, k, _table().to(q.dtype), positions.view(1, -1).expand(3, -1).contiguous(),
                                 MROPE_SECTION, HEAD, ROTARY, True, False, True,
                                 torch.zeros(ROTARY // 2, dtype=torch.long))
    return q, k


def _calls(n_tokens, at):
    """The token ``at`` of a call of ``n_tokens`` is token 5 of the reference call, with 5's position;
    the others are other tokens (other rows, other positions)."""
    order = [(5 + i - at) % TOKENS for i in range(n_tokens)]
    assert order[at] == 5
    return torch.tensor(order)


@pytest.mark.parametrize("dtype", FUSED_DTYPES, ids=dtype_id)
def test_the_fused_kernel_norms_rotates_and_splits_the_gate(sgl, dtype):
    q_gate, k, q_weight, k_weight = _rows(dtype)
    positions = torch.arange(POSITION0, POSITION0 + TOKENS)
    q_out, k_out, gate = fused(sgl, q_gate, k, q_weight, k_weight, positions)
    heads = q_gate.float().view(TOKENS, HQ, 2, HEAD)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w.float())

    inv_freq = inv_freq_fp64(ROTARY, THETA).float()
    ref_q = rope(norm(heads[:, :, 0], q_weight), positions, inv_freq, ROTARY)
    ref_k = rope(norm(k.float().view(TOKENS, HKV, HEAD), k_weight), positions, inv_freq, ROTARY)
    assert close_to(ref_q, q_out, dtype) and close_to(ref_k, k_out, dtype)
    assert bit_equal(gate, q_gate.view(TOKENS, HQ, 2, HEAD)[:, :, 1])


@pytest.mark.parametrize("n_tokens, at", BATCHES)
@pytest.mark.parametrize("dtype", FUSED_DTYPES, ids=dtype_id)
def test_a_token_of_the_fused_kernel_does_not_depend_on_the_call(sgl, dtype, n_tokens, at):
    q_gate, k, q_weight, k_weight = _rows(dtype)
    positions = torch.arange(POSITION0, POSITION0 + TOKENS)
    alone = fused(sgl, q_gate[5:6], k[5:6], q_weight, k_weight, positions[5:6])
    order = _calls(n_tokens, at)
    batch = fused(sgl, q_gate[order], k[order], q_weight, k_weight, positions[order])
    assert all(bit_equal(b[at:at + 1], a) for a, b in zip(alone, batch))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_mrope_rotates_text_positions_as_plain_rope(sgl, dtype):
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(TOKENS, HQ * HEAD, generator=generator).to(dtype)
    k = torch.randn(TOKENS, HKV * HEAD, generator=generator).to(dtype)
    positions = torch.arange(POSITION0, POSITION0 + TOKENS)
    _, k_out = mrope(sgl, q, k, positions)
    ref = rope(k.float().view(TOKENS, HKV, HEAD), positions, inv_freq_fp64(ROTARY, THETA).float(), ROTARY)
    assert close_to(ref, k_out, dtype)


@pytest.mark.parametrize("n_tokens, at", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_token_of_mrope_does_not_depend_on_the_call(sgl, dtype, n_tokens, at):
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(TOKENS, HQ * HEAD, generator=generator).to(dtype)
    k = torch.randn(TOKENS, HKV * HEAD, generator=generator).to(dtype)
    positions = torch.arange(POSITION0, POSITION0 + TOKENS)
    alone = mrope(sgl, q[5:6], k[5:6], positions[5:6])
    order = _calls(n_tokens, at)
    batch = mrope(sgl, q[order], k[order], positions[order])
    assert all(bit_equal(b[at:at + 1], a) for a, b in zip(alone, batch))
