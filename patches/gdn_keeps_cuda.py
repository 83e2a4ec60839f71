"""States kept inside a GDN prefill forward on CUDA, exactly (exact's ``keeps=inside``; issue 35
item 5; docs/exact.md §6).

SGLang's GDN extend (``TritonGDNKernel.extend``) calls ``chunk_gated_delta_rule``, whose h kernel
(``chunk_gated_delta_rule_fwd_kernel_h_blockdim64``) carries each sequence's recurrent state in
fp32 through its 64-token chunks, stores the state at the start of every chunk into ``h`` and the
final state into the pool. ``h`` is allocated in the inputs' dtype (bf16 on a served model), so the
state it holds at a chunk boundary is rounded: not the state a forward that ended there would keep
(``tests/kernels/test_gdn_kept_states.py``). The same kernel, unchanged, launched with an fp32
``h`` buffer stores exactly that state (its store casts to the buffer's dtype; nothing else in its
arithmetic reads ``h``).

:func:`chunk_gated_delta_rule_keeping` runs SGLang's own ``chunk_gated_delta_rule`` and, for the
one launch of the h kernel inside it, hands the kernel an fp32 ``h`` buffer instead of the bf16 one
SGLang allocated. Then it fills SGLang's bf16 ``h`` from the fp32 buffer with :func:`_narrow` (a
Triton cast, the same ``.to()`` the h kernel's store performs, so the same rounding on a GPU and
under the interpreter), which the rest of the forward (``chunk_fwd_o``) reads and the caller gets
back; and it copies the fp32 states of the chunks that start at the keep offsets into their pool
slots. The recurrence runs once; the cost beside SGLang's forward is the fp32 buffer (twice ``h``'s
bytes, alive during the h launch only), one elementwise pass over it, and a gather of the kept
states. SGLang's source is not copied: its functions run as they are, one kernel reference in its
module is swapped for the duration of the call (the scheduler runs a forward on one thread).

CUDA path only: importing this module imports SGLang's fla kernels and Triton.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
import triton
import triton.language as tl
from sglang.kernels.ops.attention.fla import chunk

from patches import state_keeps
from patches.state_keeps import StateKeep

H_KERNEL = "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"  # in chunk_gated_delta_rule_fwd_h's module
CHUNK = chunk.CHUNK_SIZE  # 64: a keep offset must start one of the sequence's chunks
NARROW_BLOCK = 1024


@triton.jit
def _narrow_kernel(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    values = tl.load(source + offsets, mask=inside)
    tl.store(target + offsets, values.to(target.dtype.element_ty), mask=inside)


def _narrow(source: torch.Tensor, target: torch.Tensor) -> None:
    """``target[...] = source`` (fp32 into ``target``'s dtype) with a Triton cast: the rounding of
    the h kernel's own ``tl.store(p_h, b_h.to(p_h.dtype.element_ty))``, on any backend Triton runs
    on (a GPU rounds to nearest even; the interpreter truncates, and torch's cast would not)."""
    n = source.numel()
    assert source.is_contiguous() and target.is_contiguous() and target.numel() == n
    _narrow_kernel[(triton.cdiv(n, NARROW_BLOCK),)](source, target, n, BLOCK=NARROW_BLOCK)


def keep_rows(keeps: Sequence[StateKeep], bounds: Sequence[int], slots: int, own_slots: Sequence[int]) -> list[int]:
    """For each keep, its row in ``h`` flattened over (batch, chunk): the chunk of sequence
    ``keep.sequence`` that starts at ``keep.offset``. Under varlen ``cu_seqlens`` (``bounds``, as
    ints) SGLang lays the sequences' chunks out one after the other (``prepare_chunk_offsets``:
    sequence i's chunks start at the sum of ``ceil(len / 64)`` of the sequences before it).
    Raises ValueError naming the field of the first bad keep: ``sequence`` and ``offset`` as
    ``state_keeps.check`` says (a sequence of the forward, a multiple of 64 strictly inside it);
    ``slot`` not in the pool, a sequence's own slot (``own_slots``: the kernel reads and writes
    it), or another keep's."""
    state_keeps.check(keeps, bounds, CHUNK)
    first_chunk = [0]
    for start, end in zip(bounds, bounds[1:]):
        first_chunk.append(first_chunk[-1] + -(-(end - start) // CHUNK))
    rows, taken = [], set(own_slots)
    for keep in keeps:
        if not 0 <= keep.slot < slots:
            raise ValueError(f"StateKeep.slot={keep.slot}: the state pool has {slots} slots")
        if keep.slot in taken:
            raise ValueError(f"StateKeep.slot={keep.slot}: already a sequence's own slot or another keep's")
        taken.add(keep.slot)
        rows.append(first_chunk[keep.sequence] + keep.offset // CHUNK)
    return rows


@contextlib.contextmanager
def _fp32_h(pool: torch.Tensor, rows: Sequence[int], slots: Sequence[int]):
    """Within the block, the h kernel's launch in ``chunk_gated_delta_rule_fwd_h`` writes its
    per-chunk states into an fp32 buffer; SGLang's ``h`` gets them narrowed (:func:`_narrow`) and
    ``pool[slots[i]]`` gets the fp32 state of ``h`` row ``rows[i]``. Yields the list of launches
    seen (one per forward)."""
    namespace = chunk.chunk_gated_delta_rule_fwd_h.__globals__
    kernel = namespace[H_KERNEL]
    launches = []

    class Keeping:
        def __getitem__(self, grid):
            def launch(**kwargs):
                h = kwargs["h"]
                states = torch.empty(h.shape, dtype=torch.float32, device=h.device)
                result = kernel[grid](**{**kwargs, "h": states})
                _narrow(states, h)
                flat = states.view(-1, *states.shape[2:])
                index = torch.tensor(rows, dtype=torch.long, device=h.device)
                pool[torch.tensor(slots, dtype=torch.long, device=pool.device)] = flat[index].to(pool.device)
                launches.append(grid)
                return result

            return launch

    namespace[H_KERNEL] = Keeping()
    try:
        yield launches
    finally:
        namespace[H_KERNEL] = kernel


@torch.compiler.disable
def chunk_gated_delta_rule_keeping(q, k, v, g, beta, *, initial_state, initial_state_indices, cu_seqlens,
                                   keeps: Sequence[StateKeep], scale=None, head_first=False,
                                   use_qk_l2norm_in_kernel=True):
    """SGLang's ``chunk_gated_delta_rule`` (as ``TritonGDNKernel.extend`` calls it): the same
    arguments, the same ``(o, None, h)`` and the same final states written into
    ``initial_state[initial_state_indices[i]]``, bit for bit; and for each ``StateKeep`` the fp32
    state after ``keep.offset`` tokens of sequence ``keep.sequence`` (cu_seqlens order) written into
    ``initial_state[keep.slot]`` (the pool's ``[slots, Hv, V, K]``), the bits a forward that ended
    there would have left. No keeps: SGLang's function, called as it is. Bad keeps: ValueError
    (:func:`keep_rows`), before anything runs."""
    call = dict(q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                initial_state_indices=initial_state_indices, cu_seqlens=cu_seqlens, head_first=head_first,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    if not keeps:
        return chunk.chunk_gated_delta_rule(**call)
    if cu_seqlens is None or initial_state is None or initial_state_indices is None:
        raise ValueError("keeps need the varlen call SGLang's extend makes: cu_seqlens, initial_state and "
                         "initial_state_indices")
    rows = keep_rows(keeps, cu_seqlens.tolist(), initial_state.shape[0], initial_state_indices.tolist())
    with _fp32_h(initial_state, rows, [keep.slot for keep in keeps]) as launches:
        result = chunk.chunk_gated_delta_rule(**call)
    if len(launches) != 1:
        raise RuntimeError(f"SGLang's GDN chunk forward launched its h kernel {len(launches)} times, not once: "
                           "the kept states cannot be told apart")
    return result
