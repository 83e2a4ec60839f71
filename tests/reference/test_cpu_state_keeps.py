"""States kept inside a forward by the CPU engine (exact ``keeps=inside``, docs/exact.md §5.14).

A kept state is only as good as its bits: each must be the state a forward that ENDED at its
point leaves (the GDN state after the chunk loop, the conv window after the conv), so a later read
resumed from it is the read that never stopped. The reference for each is the CPU engine's own
forward over the sequence cut at the point, run without keeps; the keeping forward's outputs and
final states must not move either.
"""

from __future__ import annotations

import pytest
import torch

from patches import gdn_keep_hooks
from patches.cpu import kernels
from patches.state_keeps import StateKeep

HEADS, V_HEADS, DIM = 2, 4, 16
LENGTHS = (200, 150)  # two sequences of one varlen forward
SLOTS = 8  # pool slots: 0 and 1 the sequences', the rest free for keeps


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(LENGTHS)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = randn(1, total, HEADS, DIM), randn(1, total, HEADS, DIM)
    v = randn(1, total, V_HEADS, DIM)
    g = -torch.rand(1, total, V_HEADS, generator=gen) * 0.1  # log decays
    beta = torch.rand(1, total, V_HEADS, generator=gen)
    pool = torch.zeros(SLOTS, V_HEADS, DIM, DIM)
    pool[1] = randn(V_HEADS, DIM, DIM) * 0.1  # the second sequence resumes from a state
    return q, k, v, g, beta, pool


def cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)


def prefill(q, k, v, g, beta, pool, lengths, keeps=()):
    """One varlen forward of sequences 0 and 1 (slots 0 and 1) over the first ``lengths`` tokens of
    each; returns its outputs, and the pool after it."""
    pool = pool.clone()
    parts = [slice(sum(LENGTHS[:i]), sum(LENGTHS[:i]) + n) for i, n in enumerate(lengths)]
    take = [torch.cat([t[:, part] for part in parts], dim=1) for t in (q, k, v, g, beta)]
    args = dict(initial_state=pool, initial_state_indices=torch.tensor([0, 1]), cu_seqlens=cu(lengths),
                use_qk_l2norm_in_kernel=True)
    if keeps:
        out, _, _ = kernels.chunk_gated_delta_rule_keeping(*take, keeps=keeps, **args)
    else:
        out, _, _ = kernels.chunk_gated_delta_rule(*take, **args)
    return out, pool


KEEPS = (StateKeep(0, 64, 2), StateKeep(0, 128, 3), StateKeep(1, 64, 4), StateKeep(1, 128, 5))


def test_keeping_moves_no_output_and_no_final_state():
    q, k, v, g, beta, pool = inputs()
    out, after = prefill(q, k, v, g, beta, pool, LENGTHS)
    kept_out, kept_after = prefill(q, k, v, g, beta, pool, LENGTHS, KEEPS)
    assert torch.equal(kept_out, out)
    assert torch.equal(kept_after[:2], after[:2])
    assert torch.equal(kept_after[6:], pool[6:])  # slots no keep names are untouched


@pytest.mark.parametrize("keep", KEEPS, ids=lambda keep: f"seq{keep.sequence}-at{keep.offset}")
def test_a_kept_state_is_the_state_of_a_forward_that_ended_there(keep):
    q, k, v, g, beta, pool = inputs()
    _, kept = prefill(q, k, v, g, beta, pool, LENGTHS, KEEPS)
    cut = [keep.offset if i == keep.sequence else n for i, n in enumerate(LENGTHS)]
    _, ended = prefill(q, k, v, g, beta, pool, cut)
    assert torch.equal(kept[keep.slot], ended[keep.sequence])
    assert not torch.equal(kept[keep.slot], kept[keep.sequence])  # not the final state by accident


def test_a_read_resumed_from_a_kept_state_is_the_read_that_never_stopped():
    q, k, v, g, beta, pool = inputs()
    out, after = prefill(q, k, v, g, beta, pool, (LENGTHS[0], 1))
    _, kept = prefill(q, k, v, g, beta, pool, (LENGTHS[0], 1), (StateKeep(0, 128, 2),))
    resumed_pool = pool.clone()
    resumed_pool[0] = kept[2]
    rest = [t[:, 128:LENGTHS[0]] for t in (q, k, v, g, beta)]
    resumed, _, _ = kernels.chunk_gated_delta_rule(
        *rest, initial_state=resumed_pool, initial_state_indices=torch.tensor([0]),
        cu_seqlens=cu([LENGTHS[0] - 128]), use_qk_l2norm_in_kernel=True)
    assert torch.equal(resumed[:, :], out[:, 128:LENGTHS[0]])
    assert torch.equal(resumed_pool[0], after[0])


@pytest.mark.parametrize("keep, field", [
    (StateKeep(0, 100, 2), "offset"), (StateKeep(0, 0, 2), "offset"), (StateKeep(0, 256, 2), "offset"),
    (StateKeep(1, 192, 2), "offset"), (StateKeep(2, 64, 2), "sequence"),
])
def test_a_keep_off_the_grid_or_outside_its_sequence_is_refused(keep, field):
    q, k, v, g, beta, pool = inputs()
    with pytest.raises(ValueError, match=f"StateKeep.{field}"):
        prefill(q, k, v, g, beta, pool, LENGTHS, (keep,))


def test_a_kept_conv_window_is_the_one_a_conv_that_ended_there_leaves():
    """``keep_conv_windows`` against the CPU conv's own state write for the sequence cut at the point."""
    gen = torch.Generator().manual_seed(1)
    dim, width = 6, 4
    x = torch.randn(sum(LENGTHS), dim, generator=gen)  # the layer's input rows, [tokens, dim]
    weight = torch.randn(dim, width, generator=gen)
    states = torch.zeros(SLOTS, dim, width - 1)
    starts = cu(LENGTHS).tolist()
    keeps = (StateKeep(0, 64, 2), StateKeep(1, 128, 3))
    gdn_keep_hooks.keep_conv_windows(x, states, starts, keeps)
    for keep in keeps:
        ended = torch.zeros(1, dim, width - 1)
        begin = starts[keep.sequence]
        kernels.causal_conv1d_fn(x[begin:begin + keep.offset].T.contiguous(), weight, None, ended,
                                 cu([keep.offset]), [keep.offset], cache_indices=torch.tensor([0]),
                                 has_initial_state=torch.tensor([False]))
        assert torch.equal(states[keep.slot], ended[0])
