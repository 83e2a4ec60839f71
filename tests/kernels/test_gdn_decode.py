"""The GDN decode: ``fused_recurrent_gated_delta_rule_packed_decode`` (what SGLang's GDN backend runs
on CUDA: ``TritonGDNKernel.supports_packed_decode``), ``fused_sigmoid_gating_delta_rule_update``
(the same step from split q/k/v; SGLang's decode when packed decode is off, and its draft
verification), and ``fused_gdn_gating`` (the prefill's gates).

Findings pinned here: a sequence's step does not depend on the other sequences of the batch or on
its state's slot; the recurrent update is split-invariant at every token (several tokens in one call
or one per call); the packed and the unpacked decode kernels are not interchangeable bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, NEIGHBOURS, TINY, close_to, dtype_id
from tests.reference.hybrid_reference import gated_delta_recurrent

HK, HV, DK, DV = TINY.gdn_k_heads, TINY.gdn_v_heads, 32, 32  # the decode kernels take one K block
BATCH = max(NEIGHBOURS) + 1


def _params():
    generator = torch.Generator().manual_seed(3)
    return torch.randn(HV, generator=generator), torch.randn(HV, generator=generator)  # A_log, dt_bias


def _step_inputs(n, dtype, seed=0):
    """One token for each of ``n`` sequences: q, k ``[n, Hk, K]``, v ``[n, Hv, V]``, a, b ``[n, Hv]``."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    return randn(n, HK, DK), randn(n, HK, DK), randn(n, HV, DV), randn(n, HV), randn(n, HV)


def _states(n, seed=7):
    return torch.randn(n, HV, DV, DK, generator=torch.Generator().manual_seed(seed))


def packed_decode(sgl, inputs, pool, slots):
    """The CUDA decode path: q, k, v packed in one row per sequence (the conv's output)."""
    q, k, v, a, b = inputs
    n = q.shape[0]
    mixed = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1).contiguous()
    out = torch.empty(n, 1, HV, DV, dtype=q.dtype)
    A_log, dt_bias = _params()
    sgl.fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=mixed, a=a.contiguous(), b=b.contiguous(), A_log=A_log, dt_bias=dt_bias, scale=DK ** -0.5,
        initial_state=pool, out=out, ssm_state_indices=torch.tensor(slots, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True)
    return out[:, 0]


def gating_update(sgl, inputs, pool, slots, tokens_per_sequence=1):
    """``fused_sigmoid_gating_delta_rule_update`` as ``TritonGDNKernel.decode`` calls it, each
    sequence contributing ``tokens_per_sequence`` consecutive tokens (``cu_seqlens``)."""
    q, k, v, a, b = inputs
    n = q.shape[0]
    A_log, dt_bias = _params()
    out = sgl.sigmoid_gating.fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q[None], k=k[None],
        v=v[None], b=b, initial_state_source=pool, initial_state_indices=torch.tensor(slots, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, n + 1, tokens_per_sequence, dtype=torch.int32))
    return out[0]


def _one(inputs, i):
    return tuple(x[i:i + 1] for x in inputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_packed_decode_computes_one_gated_delta_step(sgl, dtype):
    inputs = _step_inputs(1, dtype)
    pool = _states(1)
    start = pool[0].clone()
    out = packed_decode(sgl, inputs, pool, [0])
    q, k, v, a, b = (x.float() for x in inputs)
    A_log, dt_bias = _params()
    g = -A_log.exp() * torch.nn.functional.softplus(a + dt_bias)
    ratio = HV // HK
    qn, kn = (torch.nn.functional.normalize(x[0], dim=-1).repeat_interleave(ratio, 0) for x in (q, k))
    ref_out, ref_state = gated_delta_recurrent((qn * DK ** -0.5)[None], kn[None], v, g, b.sigmoid(),
                                               start.transpose(1, 2))
    assert close_to(ref_out[0], out[0], dtype) and close_to(ref_state.transpose(1, 2), pool[0], dtype)


@pytest.mark.parametrize("kernel", [packed_decode, gating_update], ids=["packed", "sigmoid_gating"])
@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_step_is_bit_identical_beside_other_sequences_and_in_any_slot(sgl, dtype, neighbours, kernel):
    inputs = _step_inputs(neighbours + 1, dtype)
    at = neighbours // 2
    alone_pool = _states(BATCH)
    alone = kernel(sgl, _one(inputs, at), alone_pool, [at])
    pool = _states(BATCH)
    slots = list(range(BATCH - 1, BATCH - 2 - neighbours, -1))
    pool[slots[at]] = _states(BATCH)[at]  # the same state, in another slot
    batch = kernel(sgl, inputs, pool, slots)
    assert bit_equal(batch[at:at + 1], alone) and bit_equal(pool[slots[at]], alone_pool[at])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_recurrent_update_is_split_invariant_at_every_token(sgl, dtype):
    """Twelve tokens of one sequence in one call, or one call per token: the same bits."""
    tokens = _step_inputs(12, dtype, seed=4)
    one_call_pool = _states(1)
    one_call = gating_update(sgl, tokens, one_call_pool, [0], tokens_per_sequence=12)
    pool = _states(1)
    steps = [gating_update(sgl, _one(tokens, i), pool, [0]) for i in range(12)]
    assert bit_equal(torch.cat(steps), one_call) and bit_equal(pool, one_call_pool)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_packed_and_the_unpacked_decode_differ_in_bits(sgl, dtype):
    """A finding: the two decode kernels round differently (a CUDA server always takes the packed
    one for decode, so this does not reach exactness; a server that switched would)."""
    inputs = _step_inputs(BATCH, dtype)
    packed_pool, gating_pool = _states(BATCH), _states(BATCH)
    packed = packed_decode(sgl, inputs, packed_pool, list(range(BATCH)))
    gated = gating_update(sgl, inputs, gating_pool, list(range(BATCH)))
    assert close_to(gated, packed, dtype)
    assert not bit_equal(packed, gated) and not bit_equal(packed_pool, gating_pool)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_gates_of_a_token_do_not_depend_on_the_batch(sgl, dtype):
    """``fused_gdn_gating``: g and beta per token and head, elementwise (the CPU engine's torch version
    needed rows computed alone for this, ``docs/exact.md`` §5.10)."""
    _, _, _, a, b = _step_inputs(BATCH, dtype, seed=9)
    A_log, dt_bias = _params()
    g, beta = sgl.gdn_gating.fused_gdn_gating(A_log, a, b, dt_bias)
    for i in (0, 4, BATCH - 1):
        g1, beta1 = sgl.gdn_gating.fused_gdn_gating(A_log, a[i:i + 1], b[i:i + 1], dt_bias)
        assert bit_equal(g[:, i:i + 1], g1) and bit_equal(beta[:, i:i + 1], beta1)
    expected = -A_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    assert close_to(expected, g[0], torch.float32)  # the gates are fp32 whatever a and b are
