"""The unified extend attention (``extend_attention_fwd_unified``), what SGLang's Triton backend runs
for every extend under ``--enable-deterministic-inference`` (the ``matched`` profile on CUDA).

Findings pinned here: a query row's bits do not depend on where its sequence's cached prefix ends
(any split, for the tiles of every GPU family the kernel knows: the key loop is anchored at key 0),
on the other sequences of the call, or on which pool slots hold its KV. The default two-stage
kernel (``extend_attention_fwd``, without the flag) is split-invariant only at multiples of its key
block (BLOCK_N: 64 on Hopper, 128 on Ampere at head dim <= 128).
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import attention_inputs, bit_equal, extend_attention, extend_pieces
from tests.kernels.conftest import DTYPES, NEIGHBOURS, TINY, close_to, dtype_id

TOKENS = 160
POOL = 1024
SLOTS = list(range(100, 100 + TOKENS))
# (BLOCK_M, BLOCK_N) that _get_block_sizes_for_extend_attention picks: CPU and older GPUs, and
# Hopper at head dim 256 (Qwen3.6); Hopper at head dim <= 128; Ampere (sm80) at head dim <= 128.
TILES = {"64x64": (64, 64), "hopper-128x64": (128, 64), "ampere-128x128": (128, 128)}
NEIGHBOURS_SHAPE = ((5, 0), (70, 40), (33, 64), (1, 10), (64, 0), (9, 130), (100, 3), (17, 17))  # (extend, prefix)


def _inputs(dtype):
    return attention_inputs(TINY, TOKENS, dtype, "cpu", torch.Generator().manual_seed(0), pool_slots=POOL)


@pytest.fixture(scope="module")
def whole(sgl):
    return {dtype: extend_pieces(sgl.extend_attention, _inputs(dtype)[0], SLOTS, (), *_inputs(dtype)[1:])
            for dtype in DTYPES}


@pytest.fixture
def tiles(sgl, monkeypatch, request):
    """Make the kernel's wrapper pick the tiles ``request.param`` names (as on that GPU)."""
    block_m, block_n = TILES[request.param]
    module = sgl.extend_attention
    original = module._get_block_sizes_for_extend_attention

    def sizes(lq, lv):
        dmodel, dpe, dv, _, _, warps = original(lq, lv)
        return dmodel, dpe, dv, block_m, block_n, warps

    monkeypatch.setattr(module, "_get_block_sizes_for_extend_attention", sizes)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_kernel_computes_causal_attention(whole, dtype):
    q, k_pool, v_pool = (x.float() for x in _inputs(dtype))
    ratio = TINY.attn_q_heads // TINY.attn_kv_heads
    keys, values = (pool[SLOTS].repeat_interleave(ratio, 1) for pool in (k_pool, v_pool))
    scores = torch.einsum("thd,shd->hts", q, keys) * TINY.attn_head_dim ** -0.5
    scores = scores.masked_fill(torch.ones(TOKENS, TOKENS, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hts,shd->thd", scores.softmax(-1), values)
    assert close_to(ref, whole[dtype], dtype)


@pytest.mark.parametrize("tiles", list(TILES), indirect=True)
@pytest.mark.parametrize("cuts", [(64,), (128,), (64, 128), (37,), (100,), (1,)], ids=lambda c: "+".join(map(str, c)))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_any_split_is_bit_identical(sgl, whole, dtype, cuts, tiles):
    """Each later forward reads the earlier tokens' KV as its cached prefix (``prefix_lens``)."""
    q, k_pool, v_pool = _inputs(dtype)
    expected = whole[dtype] if tiles == "64x64" else extend_pieces(sgl.extend_attention, q, SLOTS, (), k_pool, v_pool)
    assert bit_equal(extend_pieces(sgl.extend_attention, q, SLOTS, cuts, k_pool, v_pool), expected)


@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rows_are_bit_identical_beside_other_sequences(sgl, whole, dtype, neighbours):
    """The sequence's tail, resumed at 64 over its cached prefix, in the middle of ``neighbours``
    other sequences, some with cached prefixes of their own."""
    q, k_pool, v_pool = _inputs(dtype)
    generator = torch.Generator().manual_seed(1)
    others, base = [], 300
    for extend, prefix in NEIGHBOURS_SHAPE[:neighbours]:
        rows = torch.randn(extend, TINY.attn_q_heads, TINY.attn_head_dim, generator=generator).to(dtype)
        others.append((rows, list(range(base, base + prefix)), list(range(base + prefix, base + prefix + extend))))
        base += prefix + extend
    at = neighbours // 2
    batch = [*others[:at], (q[64:], SLOTS[:64], SLOTS[64:]), *others[at:]]
    assert bit_equal(extend_attention(sgl.extend_attention, batch, k_pool, v_pool)[at], whole[dtype][64:])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_rows_do_not_depend_on_which_slots_hold_the_kv(sgl, whole, dtype):
    """A warm read finds its prefix's KV in the slots an earlier request wrote, not a cold read's."""
    q, k_pool, v_pool = _inputs(dtype)
    moved = list(range(POOL - 1, POOL - 1 - TOKENS, -1))
    k_moved, v_moved = k_pool.clone(), v_pool.clone()
    k_moved[moved], v_moved[moved] = k_pool[SLOTS], v_pool[SLOTS]
    assert bit_equal(extend_pieces(sgl.extend_attention, q, moved, (64,), k_moved, v_moved), whole[dtype])


def two_stage(sgl, q, slots, cut, k_pool, v_pool):
    """The tail from ``cut`` through the default kernel (``extend_attention_fwd``): the prefix's
    keys in one stage, the extend's own keys in a second, merged by their softmax statistics."""
    rest = slots[cut:]
    out = torch.empty_like(q[cut:])
    sgl.extend_attention.extend_attention_fwd(
        q[cut:].contiguous(), k_pool[rest], v_pool[rest], out, k_pool, v_pool,
        torch.tensor([0, len(rest)], dtype=torch.int32), torch.tensor([0, cut], dtype=torch.int32),
        torch.tensor(slots[:cut], dtype=torch.int64), None, True, None, len(rest), 1.0, 1.0,
        sm_scale=q.shape[-1] ** -0.5)
    return out


@pytest.mark.parametrize("cut, identical", [(64, True), (128, True), (37, False), (100, False), (1, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_default_two_stage_kernel_is_split_invariant_only_at_its_key_block(sgl, dtype, cut, identical):
    """A finding: without ``--enable-deterministic-inference`` the Triton backend's extend walks a
    row's cached-prefix keys and then its own forward's keys, each in blocks of BLOCK_N from where
    that part starts. A resume at a multiple of BLOCK_N (64 here and on Hopper) leaves the blocks
    where a cold read has them; anywhere else they move, and the row's bits with them."""
    q, k_pool, v_pool = _inputs(dtype)
    cold = two_stage(sgl, q, SLOTS, 0, k_pool, v_pool)
    warm = two_stage(sgl, q, SLOTS, cut, k_pool, v_pool)
    assert close_to(cold[cut:], warm, dtype)
    assert bit_equal(warm, cold[cut:]) == identical
