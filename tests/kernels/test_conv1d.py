"""The GDN layers' causal conv1d (``sglang.kernels.ops.mamba.causal_conv1d_triton``): the prefill
``causal_conv1d_fn`` with and without a carried conv state, and the decode ``causal_conv1d_update``.
On CUDA the GDN backend calls the prefill with the channel-last view of its input (a transpose),
which SGLang's wrapper sends to this Triton kernel; the update is this kernel always.

Findings pinned here: any split (the grid is one token) gives the unsplit read's outputs and conv
state bit for bit; so do decode steps after a prefill (the update and the prefill agree); a
sequence's bits do not depend on the other sequences of its call.
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, NEIGHBOURS, close_to, dtype_id

CHANNELS, WIDTH, TOKENS = 64, 4, 100  # Qwen3.6's 4 taps
NEIGHBOUR_TOKENS = (5, 70, 33, 1, 64, 9, 100, 17)


def _weights(dtype):
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(CHANNELS, WIDTH, generator=generator).to(dtype),
            torch.randn(CHANNELS, generator=generator).to(dtype))


def _tokens(n, dtype, seed=0):
    return torch.randn(n, CHANNELS, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _state_pool(slots, dtype):
    """SGLang's conv-state pool: ``[slots, channels, width - 1]``, contiguous along the channels."""
    return torch.zeros(slots, WIDTH - 1, CHANNELS, dtype=dtype).transpose(1, 2)


def prefill(sgl, sequences, pool, slots, carried, dtype):
    """One prefill call over ``sequences`` (``[n, channels]`` each), as the GDN backend makes it:
    the tokens packed, viewed channel-last, each sequence's state in ``pool[slots[i]]``, read first
    when ``carried[i]`` (a resumed read), then overwritten with its last ``width - 1`` inputs."""
    weight, bias = _weights(dtype)
    lengths = [s.shape[0] for s in sequences]
    starts = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = sgl.conv1d.causal_conv1d_fn(torch.cat(sequences).t(), weight, bias, conv_states=pool,
                                      query_start_loc=starts, seq_lens_cpu=lengths,
                                      cache_indices=torch.tensor(slots, dtype=torch.int32),
                                      has_initial_state=torch.tensor(carried), activation="silu")
    return list(out.t().split(lengths))


def update(sgl, tokens, pool, slots, dtype):
    """One decode step: a token per sequence (``[batch, channels]``), states in ``pool[slots]``."""
    weight, bias = _weights(dtype)
    return sgl.conv1d.causal_conv1d_update(tokens, pool, weight, bias, "silu",
                                          conv_state_indices=torch.tensor(slots, dtype=torch.int32))


@pytest.fixture(scope="module")
def whole(sgl):
    """Per dtype: one unsplit prefill's outputs and final conv state."""
    result = {}
    for dtype in DTYPES:
        pool = _state_pool(1, dtype)
        out = prefill(sgl, [_tokens(TOKENS, dtype)], pool, [0], [False], dtype)[0]
        result[dtype] = (out, pool[0].clone())
    return result


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_kernel_computes_the_causal_convolution(whole, dtype):
    x = _tokens(TOKENS, dtype).float()
    weight, bias = (w.float() for w in _weights(dtype))
    padded = torch.nn.functional.pad(x.t()[None], (WIDTH - 1, 0))
    ref = torch.nn.functional.silu(torch.nn.functional.conv1d(padded, weight[:, None], bias, groups=CHANNELS)[0].t())
    assert close_to(ref, whole[dtype][0], dtype)
    assert bit_equal(whole[dtype][1], x[-(WIDTH - 1):].t().to(dtype))  # the state: the last 3 inputs


@pytest.mark.parametrize("cut", [64, 37, 1, 99])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_any_split_with_the_carried_state_is_bit_identical(sgl, whole, dtype, cut):
    """The first forward starts without a state, the second carries it: outputs and final state are
    the unsplit read's at any cut (each output reads its own 4 inputs, in a fixed order)."""
    x = _tokens(TOKENS, dtype)
    pool = _state_pool(1, dtype)
    first = prefill(sgl, [x[:cut]], pool, [0], [False], dtype)[0]
    second = prefill(sgl, [x[cut:]], pool, [0], [True], dtype)[0]
    assert bit_equal(torch.cat([first, second]), whole[dtype][0])
    assert bit_equal(pool[0], whole[dtype][1])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_decode_updates_after_a_prefill_give_the_prefill_bits(sgl, whole, dtype):
    x = _tokens(TOKENS, dtype)
    pool = _state_pool(1, dtype)
    prefill(sgl, [x[:TOKENS - 6]], pool, [0], [False], dtype)
    steps = [update(sgl, x[i:i + 1], pool, [0], dtype) for i in range(TOKENS - 6, TOKENS)]
    assert bit_equal(torch.cat(steps), whole[dtype][0][TOKENS - 6:])
    assert bit_equal(pool[0], whole[dtype][1])


@pytest.mark.parametrize("neighbours", NEIGHBOURS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_sequence_is_bit_identical_beside_other_sequences(sgl, whole, dtype, neighbours):
    """Prefill: the sequence's resumed second part (from 37, with its carried state) in the middle
    of ``neighbours`` others, some fresh and some carrying a state. Decode: its last token beside
    ``neighbours`` other sequences' tokens."""
    x = _tokens(TOKENS, dtype)
    at = neighbours // 2
    others = [_tokens(n, dtype, seed=10 + i) for i, n in enumerate(NEIGHBOUR_TOKENS[:neighbours])]
    pool = _state_pool(neighbours + 1, dtype)
    pool[:] = torch.randn(pool.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    prefill(sgl, [x[:37]], pool, [at], [False], dtype)
    batch = [*others[:at], x[37:], *others[at:]]
    carried = [i % 2 == 1 for i in range(neighbours + 1)]
    carried[at] = True
    out = prefill(sgl, batch, pool, list(range(neighbours + 1)), carried, dtype)[at]
    assert bit_equal(out, whole[dtype][0][37:]) and bit_equal(pool[at], whole[dtype][1])

    pool = _state_pool(neighbours + 1, dtype)
    prefill(sgl, [x[:TOKENS - 1]], pool, [at], [False], dtype)
    tokens = torch.stack([*(o[0] for o in others[:at]), x[TOKENS - 1], *(o[0] for o in others[at:])])
    assert bit_equal(update(sgl, tokens, pool, list(range(neighbours + 1)), dtype)[at], whole[dtype][0][TOKENS - 1])
    assert bit_equal(pool[at], whole[dtype][1])
