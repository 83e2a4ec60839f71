"""The GDN chunk prefill (``sglang.kernels.ops.attention.fla.chunk``: ``chunk_gated_delta_rule`` in
bf16, its forward ``chunk_gated_delta_rule_fwd`` in fp32), as SGLang's GDN backend calls it.

Findings pinned here: a sequence read in forwards split on the 64-token grid (from position 0) gives
the unsplit read's outputs and final state bit for bit; a split off the grid (37, 100) does not; a
sequence's bits do not depend on the other sequences of its forward; the kkt-solve kernel's
autotuned K tile changes bits (the tuner picks it once per process, by timing).
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal, difference, gdn_chunk, gdn_chunk_pieces, gdn_inputs, gdn_state_pool
from tests.kernels.conftest import DTYPES, NEIGHBOURS, TINY, close_to, dtype_id
from tests.kernels.interpreted import prefer_configs
from tests.reference.hybrid_reference import gated_delta_recurrent

NEIGHBOUR_TOKENS = (5, 70, 33, 1, 64, 9, 20, 17)  # lengths of the other sequences (any, not on the grid)


def _inputs(dtype, tokens=TINY.tokens, seed=0):
    return gdn_inputs(TINY, tokens, dtype, "cpu", torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def whole(sgl):
    """Per dtype: the inputs of one sequence and its unsplit read (output, final state)."""
    return {dtype: (_inputs(dtype), gdn_chunk_pieces(sgl.chunk, _inputs(dtype), (), TINY)) for dtype in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_kernel_computes_the_gated_delta_rule(whole, dtype):
    """Not a property: the check that the interpreted kernel (and the bf16 shim) compute the model's
    recurrence, so the bit comparisons below compare real results."""
    (q, k, v, g, beta), (out, state) = whole[dtype]
    ratio = TINY.gdn_v_heads // TINY.gdn_k_heads
    qn, kn = (torch.nn.functional.normalize(x[0].float(), dim=-1).repeat_interleave(ratio, 1) for x in (q, k))
    start = torch.zeros(TINY.gdn_v_heads, TINY.gdn_k_dim, TINY.gdn_v_dim)
    ref_out, ref_state = gated_delta_recurrent(qn * TINY.gdn_k_dim ** -0.5, kn, v[0].float(), g[0], beta[0], start)
    assert close_to(ref_out, out[0], dtype) and close_to(ref_state.transpose(1, 2), state, dtype)


@pytest.mark.parametrize("cuts", [(64,), (128,), (64, 128)], ids=lambda c: "+".join(map(str, c)))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_split_on_the_64_token_grid_is_bit_identical(sgl, whole, dtype, cuts):
    inputs, expected = whole[dtype]
    assert difference(expected, gdn_chunk_pieces(sgl.chunk, inputs, cuts, TINY), ("output", "final state")) == ""


@pytest.mark.parametrize("cut", [37, 100])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_split_off_the_grid_changes_bits(sgl, whole, dtype, cut):
    """A finding: the chunk grid restarts at every forward, so a forward that starts off the grid
    groups tokens into other chunks (other arithmetic). Resume points must sit on the grid."""
    inputs, (out, state) = whole[dtype]
    split_out, split_state = gdn_chunk_pieces(sgl.chunk, inputs, (cut,), TINY)
    assert not bit_equal(out, split_out) and not bit_equal(state, split_state)
    assert bit_equal(out[:, :cut], split_out[:, :cut])  # up to the cut it is the same read


@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_sequence_is_bit_identical_beside_other_sequences(sgl, whole, dtype, neighbours):
    """Batch invariance: the sequence's second grid piece (a read resumed at 64 from its kept state)
    in the middle of ``neighbours`` other sequences of other lengths, each with its own state slot,
    gives the unsplit read's tail and final state."""
    inputs, (out, state) = whole[dtype]
    others = [_inputs(dtype, n, seed=10 + i) for i, n in enumerate(NEIGHBOUR_TOKENS[:neighbours])]
    at = neighbours // 2
    pool = gdn_state_pool(TINY, neighbours + 1, "cpu")
    pool[at] = gdn_chunk_pieces(sgl.chunk, tuple(x[:, :64] for x in inputs), (), TINY)[1]
    batch = [*others[:at], tuple(x[:, 64:] for x in inputs), *others[at:]]
    resumed = gdn_chunk(sgl.chunk, batch, pool, list(range(neighbours + 1)))[at]
    assert difference((out[:, 64:], state), (resumed, pool[at]), ("output", "final state")) == ""


def test_the_autotuned_k_tile_changes_bits(sgl, whole):
    """A finding: ``chunk_gated_delta_rule_fwd_kkt_solve_kernel`` is autotuned over BK 32 and 64
    (a split of the K reduction). Its tuning key (H, Hg, K, BC) has no length, so one process uses
    one tile for every read and the split invariance above holds under either; a reference computed
    in another process holds only if that process tuned the same tile (Triton's autotune cache on
    disk makes the first choice stick on a machine)."""
    inputs, expected = whole[torch.float32]
    kernel = sgl.chunk_fwd.chunk_gated_delta_rule_fwd_kkt_solve_kernel
    with prefer_configs(kernel, lambda config: config.kwargs["BK"] == 64) as tuner:
        wide = gdn_chunk_pieces(sgl.chunk, inputs, (), TINY)
        assert tuner.best_config.kwargs["BK"] == 64
        assert difference(wide, gdn_chunk_pieces(sgl.chunk, inputs, (64,), TINY), ("output", "final state")) == ""
    assert not bit_equal(expected[0], wide[0])
