"""The decode attention (``decode_attention_fwd``; grouped-query here, as Qwen3.6's 24/4 heads), with
the split count the Triton backend gives it under ``--enable-deterministic-inference``: each
sequence's keys split into ``ceil(len / 256)`` parts (``SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE``),
whatever else is in the batch.

Findings pinned here: with that split count a sequence's step does not depend on the other
sequences of the batch or on which slots hold its KV; another split count (what the default mode
derives from the batch's size and the GPU's SM count) gives other bits.
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, NEIGHBOURS, close_to, dtype_id

HQ, HKV, D = 4, 1, 32
SPLIT_TILE = 256  # SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE's default
MAX_CONTEXT = 1024
MAX_SPLITS = -(-MAX_CONTEXT // SPLIT_TILE)
LENGTH = 600  # three splits: the backend's count for 600 keys
POOL = 2048
SLOTS = list(range(10, 10 + LENGTH))
NEIGHBOUR_LENGTHS = (5, 70, 300, 1, 64, 9, 100, 257)


def _pool(dtype):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(POOL, HKV, D, generator=generator).to(dtype),
            torch.randn(POOL, HKV, D, generator=generator).to(dtype))


def _queries(n, dtype, seed=1):
    return torch.randn(n, HQ, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


def decode(sgl, q, slots_per_sequence, k_pool, v_pool, splits=None):
    """One decode step for ``q [batch, Hq, D]``, sequence i attending to the KV in
    ``slots_per_sequence[i]``; ``splits`` defaults to the deterministic mode's count."""
    lengths = torch.tensor([len(s) for s in slots_per_sequence])
    if splits is None:
        splits = ((lengths + SPLIT_TILE - 1) // SPLIT_TILE).tolist()
    batch = q.shape[0]
    out = torch.empty_like(q)
    sgl.decode_attention.decode_attention_fwd(
        q, k_pool, v_pool, out, torch.tensor([0, *lengths.cumsum(0).tolist()], dtype=torch.int32),
        torch.tensor([slot for s in slots_per_sequence for slot in s], dtype=torch.int64),
        torch.empty(batch, HQ, MAX_SPLITS, D, dtype=torch.float32),
        torch.empty(batch, HQ, MAX_SPLITS, dtype=torch.float32),
        torch.tensor(splits, dtype=torch.int32), MAX_SPLITS, D ** -0.5, 1.0, 1.0)
    return out


@pytest.fixture(scope="module")
def alone(sgl):
    return {dtype: decode(sgl, _queries(1, dtype), [SLOTS], *_pool(dtype)) for dtype in DTYPES}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_kernel_computes_attention(alone, dtype):
    q = _queries(1, dtype).float()[0]
    k_pool, v_pool = (p.float() for p in _pool(dtype))
    keys, values = (p[SLOTS].repeat_interleave(HQ // HKV, 1) for p in (k_pool, v_pool))
    ref = torch.einsum("hs,shd->hd", (torch.einsum("hd,shd->hs", q, keys) * D ** -0.5).softmax(-1), values)
    assert close_to(ref, alone[dtype][0], dtype)


@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_step_is_bit_identical_beside_other_sequences(sgl, alone, dtype, neighbours):
    at = neighbours // 2
    others, base = [], 700
    for length in NEIGHBOUR_LENGTHS[:neighbours]:
        others.append(list(range(base, base + length)))
        base += length
    their_queries = _queries(neighbours, dtype, seed=2)
    q = torch.cat([their_queries[:at], _queries(1, dtype), their_queries[at:]])
    out = decode(sgl, q, [*others[:at], SLOTS, *others[at:]], *_pool(dtype))
    assert bit_equal(out[at:at + 1], alone[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_step_does_not_depend_on_which_slots_hold_the_kv(sgl, alone, dtype):
    k_pool, v_pool = _pool(dtype)
    moved = list(range(POOL - 1, POOL - 1 - LENGTH, -1))
    k_pool[moved], v_pool[moved] = k_pool[SLOTS].clone(), v_pool[SLOTS].clone()
    assert bit_equal(decode(sgl, _queries(1, dtype), [moved], k_pool, v_pool), alone[dtype])


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_another_split_count_changes_bits(sgl, alone, dtype, splits):
    """A finding: the split count decides where each partial softmax starts. Without the flag the
    backend derives it from the batch (``get_num_kv_splits_triton``: batch size, heads, SM count), so
    a sequence's step would depend on its neighbours; the fixed tile makes it the sequence's own."""
    out = decode(sgl, _queries(1, dtype), [SLOTS], *_pool(dtype), splits=[splits])
    assert close_to(alone[dtype], out, dtype)
    assert not bit_equal(out, alone[dtype])
