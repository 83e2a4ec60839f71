"""``patches/gdn_keeps_cuda.py``: SGLang's GDN chunk forward keeping fp32 states inside it (exact's
``keeps=inside`` on CUDA; issue 35 item 5), run here on SGLang's kernels under the interpreter.

One varlen forward of three sequences (bf16, slow-decay gates so a state's bits reach the end of a
read): the first from a zero state with keeps at 64 and 128, a neighbour without keeps, the third
from a nonzero state with keeps at 64 and 192 (its 128 skipped). The forward with keeps is SGLang's
own, bit for bit (outputs, ``h``, final states); each kept state is the final state of SGLang's
forward over the sequence cut at the offset, and a read resumed from it is the unsplit read's rest.

Finding pinned here: the interpreter narrows fp32 to bf16 by truncation (a GPU rounds to nearest
even), so only a Triton cast fills SGLang's bf16 ``h`` from the fp32 states with the h kernel's own
bits on both; torch's cast (round to nearest even) does not here.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from patches.kernel_selftest import bit_equal, difference, gdn_chunk, gdn_inputs, gdn_state_pool
from patches.state_keeps import StateKeep
from tests.kernels.conftest import TINY
from tests.kernels.interpreted import autotuner_of
from tests.kernels.test_gdn_kept_states import SLOW_DECAY

LENGTHS = (150, 70, 200)  # none on the grid: the later sequences' chunks start after ragged ones
START_SCALE = 0.05  # the third sequence's initial state, random
SLOTS = 8  # pool: slots 0-2 the sequences' own, 3-6 the keeps, 7 never written
OWN = (0, 1, 2)
BOUNDS = (0, *itertools.accumulate(LENGTHS))  # their cu_seqlens
KEEPS = (StateKeep(0, 64, 3), StateKeep(0, 128, 4), StateKeep(2, 64, 5), StateKeep(2, 192, 6))
UNTOUCHED = 7
SENTINEL = 7.0


def _sequence(n, seed):
    q, k, v, g, beta = gdn_inputs(TINY, n, torch.bfloat16, "cpu", torch.Generator().manual_seed(seed))
    return q, k, v, g * SLOW_DECAY, beta


def _pool(starts):
    pool = gdn_state_pool(TINY, SLOTS, "cpu").fill_(SENTINEL)
    for slot, start in zip(OWN, starts):
        pool[slot] = start
    return pool


def _call(sequences, pool, slots):
    parts = [torch.cat([s[i] for s in sequences], dim=1) for i in range(5)]
    bounds = [0, *torch.tensor([s[0].shape[1] for s in sequences]).cumsum(0).tolist()]
    return dict(zip(("q", "k", "v", "g", "beta"), parts), initial_state=pool, cu_seqlens=torch.tensor(bounds),
                initial_state_indices=torch.tensor(slots, dtype=torch.long))


def _alone(sgl, inputs, start):
    """SGLang's forward over one sequence from ``start``: ``(output, final state)``."""
    pool = gdn_state_pool(TINY, 1, "cpu")
    pool[0] = start
    return gdn_chunk(sgl.chunk, [inputs], pool, [0])[0], pool[0].clone()


@pytest.fixture(scope="module")
def batch(sgl):
    """The inputs, SGLang's forward of the batch and the keeping forward of it:
    ``(sequences, starts, (o, h, pool), (o, h, pool))``."""
    sequences = [_sequence(n, seed=40 + i) for i, n in enumerate(LENGTHS)]
    starts = [torch.zeros(TINY.gdn_v_heads, TINY.gdn_v_dim, TINY.gdn_k_dim)] * 2
    starts.append(torch.randn(starts[0].shape, generator=torch.Generator().manual_seed(7)) * START_SCALE)
    runs = []
    for keeps in ((), KEEPS):
        pool = _pool(starts)
        call = _call(sequences, pool, OWN)
        if keeps:
            o, none, h = sgl.keeping.chunk_gated_delta_rule_keeping(**call, keeps=keeps)
        else:
            o, none, h = sgl.chunk.chunk_gated_delta_rule(**call, head_first=False, use_qk_l2norm_in_kernel=True)
        assert none is None
        runs.append((o, h, pool))
    return sequences, starts, *runs


def _row(keep):
    return sum(-(-n // 64) for n in LENGTHS[:keep.sequence]) + keep.offset // 64


def test_the_module_runs_the_interpreted_kernels(sgl):
    assert sgl.keeping.chunk is sgl.chunk
    assert type(sgl.keeping._narrow_kernel).__name__ == "InterpretedFunction"


def test_with_keeps_the_forward_is_sglangs_bit_for_bit(batch):
    """Outputs, ``h`` (bf16, the third result) and every sequence's final state in its own slot:
    SGLang's bits. Slots no keep names are not written."""
    _, _, (o, h, pool), (keeping_o, keeping_h, keeping_pool) = batch
    assert h.dtype == torch.bfloat16 and h.shape[:2] == (1, sum(-(-n // 64) for n in LENGTHS))
    assert difference((o, h, pool[list(OWN)]), (keeping_o, keeping_h, keeping_pool[list(OWN)]),
                      ("output", "h", "final states")) == ""
    assert bool((keeping_pool[UNTOUCHED] == SENTINEL).all()) and bool((pool[3:] == SENTINEL).all())


@pytest.mark.parametrize("keep", KEEPS, ids=lambda k: f"seq{k.sequence}@{k.offset}")
def test_each_kept_state_is_the_ended_forwards_final_state(sgl, batch, keep):
    """The state kept after ``offset`` tokens is the final state SGLang's forward over the sequence
    cut there leaves (from the sequence's own initial state), bit for bit, and not the state SGLang's
    ``h`` holds there (its bf16 narrowing)."""
    sequences, starts, _, (_, h, pool) = batch
    cut = tuple(x[:, :keep.offset] for x in sequences[keep.sequence])
    ended = _alone(sgl, cut, starts[keep.sequence])[1]
    assert bit_equal(pool[keep.slot], ended)
    assert not bit_equal(pool[keep.slot], h[0, _row(keep)].float())


@pytest.mark.parametrize("keep", KEEPS, ids=lambda k: f"seq{k.sequence}@{k.offset}")
def test_a_read_resumed_from_a_kept_state_is_the_unsplit_reads_rest(sgl, batch, keep):
    """From the kept state, SGLang's forward over the rest of the sequence gives the outputs and
    final state of the forward that never stopped."""
    sequences, _, _, (o, _, pool) = batch
    rest = tuple(x[:, keep.offset:] for x in sequences[keep.sequence])
    begin = sum(LENGTHS[:keep.sequence])
    expected = (o[:, begin + keep.offset:begin + LENGTHS[keep.sequence]], pool[OWN[keep.sequence]])
    assert difference(expected, _alone(sgl, rest, pool[keep.slot]), ("output", "final state")) == ""


def test_the_interpreter_narrows_by_truncation_so_h_is_filled_by_a_triton_cast(batch):
    """A finding: SGLang's bf16 ``h`` at a kept offset is the kept fp32 state truncated (the
    interpreter's fp32 -> bf16), which torch's round-to-nearest-even cast is not; a GPU rounds both
    to nearest even. ``_narrow`` casts in Triton, like the h kernel's store, and matches either."""
    _, _, (_, h, _), (_, _, pool) = batch
    for keep in KEEPS:
        kept, stored = pool[keep.slot], h[0, _row(keep)]
        assert torch.equal(stored.view(torch.int16).to(torch.int32) & 0xFFFF, kept.view(torch.int32) >> 16 & 0xFFFF)
        assert not bit_equal(kept.to(torch.bfloat16), stored)


def test_without_keeps_it_is_sglangs_call(sgl, monkeypatch):
    """No keeps: SGLang's ``chunk_gated_delta_rule`` is called with the same arguments and its answer
    returned, nothing swapped."""
    seen = []
    monkeypatch.setattr(sgl.keeping.chunk, "chunk_gated_delta_rule", lambda **kwargs: seen.append(kwargs) or "theirs")
    call = dict(q=1, k=2, v=3, g=4, beta=5, initial_state=6, initial_state_indices=7, cu_seqlens=8)
    assert sgl.keeping.chunk_gated_delta_rule_keeping(**call, keeps=()) == "theirs"
    assert seen == [{**call, "scale": None, "head_first": False, "use_qk_l2norm_in_kernel": True}]


@pytest.mark.parametrize("keep, field", [
    (StateKeep(0, 100, 3), "offset"),
    (StateKeep(0, 0, 3), "offset"),
    (StateKeep(0, 192, 3), "offset"),  # past the 150-token sequence
    (StateKeep(1, 64, 3), None),  # inside the 70-token sequence: fine
    (StateKeep(3, 64, 3), "sequence"),
    (StateKeep(-1, 64, 3), "sequence"),
    (StateKeep(0, 64, SLOTS), "slot"),
    (StateKeep(0, 64, 2), "slot"),  # a sequence's own slot
], ids=["off-grid", "zero", "past-end", "fine", "no-such-sequence", "negative-sequence", "no-such-slot", "own-slot"])
def test_a_bad_keep_is_refused_naming_its_field(sgl, keep, field):
    """Checked before anything runs (:func:`keep_rows`, pure: no kernel here)."""
    if field is None:
        assert sgl.keeping.keep_rows([keep], BOUNDS, SLOTS, OWN) == [_row(keep)]
        return
    with pytest.raises(ValueError, match=rf"^StateKeep\.{field}={keep._asdict()[field]}: "):
        sgl.keeping.keep_rows([keep], BOUNDS, SLOTS, OWN)


def test_an_offset_at_the_sequences_end_and_a_slot_kept_twice_are_refused(sgl):
    with pytest.raises(ValueError, match=r"^StateKeep\.offset=128: .* inside the sequence's 128 tokens"):
        sgl.keeping.keep_rows([StateKeep(0, 128, 3)], (0, 128), SLOTS, (0,))
    with pytest.raises(ValueError, match=r"^StateKeep\.slot=3: already"):
        sgl.keeping.keep_rows([StateKeep(0, 64, 3), StateKeep(0, 128, 3)], (0, 150), SLOTS, (0,))


def test_keeps_are_checked_before_the_forward_runs_and_the_kernel_is_restored(sgl, batch):
    """A bad keep through the function: ValueError, the pool untouched; SGLang's h kernel is its
    own again after a call (the swap lasts one call; ``batch`` made one)."""
    namespace = sgl.chunk.chunk_gated_delta_rule_fwd_h.__globals__
    kernel = namespace[sgl.keeping.H_KERNEL]
    assert autotuner_of(kernel) is not None  # SGLang's autotuned kernel, not the keeping launcher
    sequences = [_sequence(n, seed=40 + i) for i, n in enumerate(LENGTHS)]
    pool = _pool([torch.zeros(TINY.gdn_v_heads, TINY.gdn_v_dim, TINY.gdn_k_dim)] * 3)
    before = pool.clone()
    with pytest.raises(ValueError, match=r"^StateKeep\.offset=96"):
        sgl.keeping.chunk_gated_delta_rule_keeping(**_call(sequences, pool, OWN), keeps=[StateKeep(2, 96, 3)])
    assert bit_equal(pool, before) and namespace[sgl.keeping.H_KERNEL] is kernel
