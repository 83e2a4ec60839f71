"""States kept inside a GDN forward without ending it (issue 35, item 5): what SGLang's own tracking
keeps, and what an exact keep would need.

SGLang's prefix caching with ``extra_buffer`` keeps a sequence's GDN state at a chunk boundary
inside an extend without ending the forward: ``MambaAttnBackendBase._track_mamba_state_extend``
(``srt/layers/attention/hybrid_linear_attn_backend.py``) copies ``h[track_ssm_h_src]`` into the
fp32 state pool with ``.to(ssm_states.dtype)``, where ``h`` is the third result of
``chunk_gated_delta_rule`` (the GDN backend's extend) and ``track_ssm_h_src`` indexes the chunk
that starts at the boundary (``_init_track_ssm_indices``, used when the tracked length is not the
forward's end). ``chunk_gated_delta_rule_fwd_h`` allocates ``h`` as ``k.new_empty``: in the
inputs' dtype, bf16 on a served model, while the kernel carries the state in fp32 and writes the
fp32 state at the forward's end into the pool.

Findings pinned here, for bf16 inputs at the interior boundaries 64 and 128 of one forward:
``h``'s state is the ended forward's fp32 state rounded to bf16, so a state kept from ``h`` is not
the state a forward that ended at the boundary keeps, and a read resumed from it continues with
other bits (its final state, and its outputs from the second chunk after the boundary on) than a
read that never stopped, which the ended forward's state continues bit for bit. The same kernel launched with an fp32 ``h`` buffer (its store casts
to the buffer's dtype) writes the ended forward's state bit for bit at every boundary: what an
exact keep inside a forward needs is an fp32 state write at the chosen chunk boundaries, no other
arithmetic. (With fp32 inputs ``h`` is fp32 already and is exact.)
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from patches.kernel_selftest import bit_equal, difference, gdn_chunk, gdn_chunk_pieces, gdn_inputs, gdn_state_pool
from tests.kernels.conftest import TINY

BOUNDARIES = (64, 128)  # interior chunk boundaries of TINY's 170 tokens (chunks start at 0, 64, 128)
H_KERNEL = "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"
# Slow-decay heads (a decay of about 0.6 per 64-token chunk, 0.993 per token): with the tier's random
# gates a chunk keeps about 1e-7 of the state, which can wash a state's rounding out of the read before
# it ends (measured: at the boundary 64 the continuation came out bit-identical with them).
SLOW_DECAY = 1 / 32


def _inputs(dtype):
    q, k, v, g, beta = gdn_inputs(TINY, TINY.tokens, dtype, "cpu", torch.Generator().manual_seed(0))
    return q, k, v, g * SLOW_DECAY, beta


def _bf16_neighbour(got, exact) -> bool:
    """``got`` (bf16 values widened to fp32) is, element by element, one of the two bf16 values
    around the fp32 ``exact``: its rounding in either mode (the GPU's store rounds to nearest even;
    the Triton interpreter's fp32 -> bf16 cast truncates)."""
    down = exact.view(torch.int32) & ~0xFFFF
    bits = got.float().view(torch.int32)
    return bool(((bits == down) | (bits == down + 0x10000)).all())


def _read_with_h(chunk, inputs):
    """One forward over the whole sequence from a zero state, as the GDN backend's extend calls the
    kernel in bf16 (``TritonGDNKernel.extend``: ``chunk_gated_delta_rule`` with the pool and its
    indices): ``(output, final state, h)``, ``h`` as the backend receives it, ``[1, chunks, Hv, V, K]``."""
    q, k, v, g, beta = inputs
    pool = gdn_state_pool(TINY, 1, "cpu")
    out, _, h = chunk.chunk_gated_delta_rule(
        q=q, k=k, v=v, g=g, beta=beta, initial_state=pool, initial_state_indices=torch.zeros(1, dtype=torch.long),
        cu_seqlens=torch.tensor([0, q.shape[1]], dtype=torch.long), head_first=False, use_qk_l2norm_in_kernel=True)
    return out, pool[0], h


def _tracked(h, pool_dtype, boundary):
    """What ``_track_mamba_state_extend`` keeps for a boundary inside a one-sequence forward:
    ``h.squeeze(0)[boundary // 64].to(ssm_states.dtype)`` (the sequence's chunks start at offset 0)."""
    return h.squeeze(0)[boundary // 64].to(pool_dtype, copy=False)


def _resumed(chunk, inputs, state, boundary):
    """The rest of the sequence read from ``state`` kept at ``boundary``: ``(output, final state)``."""
    pool = gdn_state_pool(TINY, 1, "cpu")
    pool[0] = state
    return gdn_chunk(chunk, [tuple(x[:, boundary:] for x in inputs)], pool, [0])[0], pool[0]


@contextlib.contextmanager
def _fp32_h(chunk):
    """Within the block, every launch of the h kernel inside ``chunk_gated_delta_rule_fwd_h`` runs as
    it would, then once more on the same inputs with an fp32 ``h`` buffer (and a copy of the state
    pool as it was before the launch, and a scratch ``v_new``), whose per-chunk states are appended
    to the yielded list with the pool that launch ended with. The forward itself is untouched."""
    namespace = chunk.chunk_gated_delta_rule_fwd_h.__globals__  # the interpreted chunk_delta_h module
    kernel = namespace[H_KERNEL]
    captured = []

    class Twin:
        def __getitem__(self, grid):
            def launch(**kwargs):
                before = kwargs["initial_state"].clone()
                result = kernel[grid](**kwargs)
                states = torch.empty_like(kwargs["h"], dtype=torch.float32)
                kernel[grid](**{**kwargs, "h": states, "initial_state": before,
                                "v_new": torch.empty_like(kwargs["v_new"])})
                captured.append((states, before))
                return result

            return launch

    namespace[H_KERNEL] = Twin()
    try:
        yield captured
    finally:
        namespace[H_KERNEL] = kernel


@pytest.fixture(scope="module")
def bf16(sgl):
    """bf16 inputs, the unsplit forward with its ``h`` and the fp32 ``h`` its kernel would write,
    and per boundary the fp32 final state of a forward that ended there."""
    inputs = _inputs(torch.bfloat16)
    with _fp32_h(sgl.chunk) as captured:
        out, state, h = _read_with_h(sgl.chunk, inputs)
    (fp32_h, twin_final), = captured
    ended = {b: gdn_chunk_pieces(sgl.chunk, tuple(x[:, :b] for x in inputs), (), TINY)[1] for b in BOUNDARIES}
    return inputs, (out, state), h, (fp32_h, twin_final[0]), ended


def test_h_is_in_the_inputs_dtype_and_the_pool_in_fp32(bf16):
    _, (_, state), h, _, ended = bf16
    assert h.dtype == torch.bfloat16 and state.dtype == torch.float32 and ended[64].dtype == torch.float32
    assert h.shape == (1, 3, TINY.gdn_v_heads, TINY.gdn_v_dim, TINY.gdn_k_dim)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_state_tracked_from_h_is_not_the_ended_forwards_state(bf16, boundary):
    """A finding: SGLang's tracked state at a boundary inside the forward is the fp32 state a forward
    ending there keeps, rounded to bf16 and widened back; not the same bits."""
    _, _, h, _, ended = bf16
    tracked = _tracked(h, torch.float32, boundary)
    assert tracked.dtype == torch.float32 and not bit_equal(tracked, ended[boundary])
    assert _bf16_neighbour(tracked, ended[boundary])


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_read_resumed_from_h_continues_with_other_bits(sgl, bf16, boundary):
    """A finding: resumed from the tracked state, the rest of the sequence ends with another final
    state than the read that never stopped, and from its second chunk on gets other outputs (the
    first chunk after the boundary reads the state only as bf16, in ``h`` and ``v_new``, so its
    outputs agree; the fp32 state it carries on does not). Resumed from the ended forward's state,
    the same bits (the split invariance on the grid, ``test_gdn_chunk.py``)."""
    inputs, (out, state), h, _, ended = bf16
    from_ended = _resumed(sgl.chunk, inputs, ended[boundary], boundary)
    assert difference((out[:, boundary:], state), from_ended, ("output", "final state")) == ""
    from_h_out, from_h_state = _resumed(sgl.chunk, inputs, _tracked(h, torch.float32, boundary), boundary)
    assert not bit_equal(from_h_state, state)
    assert bit_equal(from_h_out[:, :64], out[:, boundary:boundary + 64])
    if boundary + 64 < TINY.tokens:
        assert not bit_equal(from_h_out[:, 64:], out[:, boundary + 64:])


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_kernel_writing_fp32_h_keeps_the_ended_forwards_state(bf16, boundary):
    """What item 5 needs, shown with SGLang's kernel unchanged: launched with an fp32 ``h`` buffer,
    the h kernel writes at each interior boundary the fp32 state a forward ending there keeps, bit
    for bit; the bf16 ``h`` is that state rounded. The twin launch is the same recurrence: the same
    final state as the forward's own launch."""
    _, (_, state), h, (fp32_h, twin_final), ended = bf16
    assert bit_equal(twin_final, state)
    assert bit_equal(fp32_h[0, boundary // 64], ended[boundary])
    assert _bf16_neighbour(h, fp32_h)


@pytest.fixture(scope="module")
def fp32(sgl):
    """fp32 inputs and their unsplit forward's ``h`` (the fp32 forward as ``gdn_chunk`` calls it:
    the wrapper refuses fp32)."""
    inputs = _inputs(torch.float32)
    q, k, v, g, beta = inputs
    cu_seqlens = torch.tensor([0, q.shape[1]], dtype=torch.long)
    chunk = sgl.chunk
    *_, h, _ = chunk.chunk_gated_delta_rule_fwd(
        q=chunk.l2norm_fwd(q), k=chunk.l2norm_fwd(k), v=v, g=g, beta=beta, scale=q.shape[-1] ** -0.5,
        initial_state=gdn_state_pool(TINY, 1, "cpu"), initial_state_indices=torch.zeros(1, dtype=torch.long),
        cu_seqlens=cu_seqlens, chunk_indices=chunk.prepare_chunk_indices(cu_seqlens, chunk.CHUNK_SIZE))
    return inputs, h


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_with_fp32_inputs_h_is_exact(sgl, fp32, boundary):
    """The contrast: with fp32 inputs ``h`` is fp32 and holds the ended forward's state bit for bit."""
    inputs, h = fp32
    ended = gdn_chunk_pieces(sgl.chunk, tuple(x[:, :boundary] for x in inputs), (), TINY)[1]
    assert h.dtype == torch.float32 and bit_equal(h[0, boundary // 64], ended)
