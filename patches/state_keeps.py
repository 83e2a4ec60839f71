"""States kept inside a prefill forward without ending it (exact, ``keeps=inside``; docs/exact.md §5.14).

Under ``cut=kept`` a keep point need not end a forward: the GDN layers write the recurrent state
and the conv window at the keep point into a Mamba-pool slot while the forward runs on, and the
exact tree inserts the KV before the point with that slot after the forward
(``patches/exact_tree.py``). What each forward must keep is set here by the scheduler's hook for
the one forward it runs (``pending``), and read by the GDN layer's wrappers.

A keep is exact when the written state has the bits a forward that ended at the point would
leave: the conv window is a copy of the layer's input rows before the point; the SSM state is the
chunk kernel's fp32 state at a chunk boundary (the point is on the 64-token grid from position 0,
and so is the forward's start), never the bf16 ``h`` SGLang's own tracking reads.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class StateKeep(NamedTuple):
    """Write the state after ``offset`` tokens of the forward's sequence ``sequence`` (its index in
    ``cu_seqlens`` order) into Mamba-pool slot ``slot``. ``offset`` is a positive multiple of 64,
    strictly inside the sequence's extend (its end is kept by SGLang's own state write)."""

    sequence: int
    offset: int
    slot: int


_pending: tuple[StateKeep, ...] = ()
_starts: list[int] | None = None  # the running forward's query_start_loc, read once (checked) by its first layer


def pending() -> tuple[StateKeep, ...]:
    """The keeps of the forward now running (empty: none, the GDN layers run as SGLang's)."""
    return _pending


def set_pending(keeps: Sequence[StateKeep]) -> None:
    global _pending, _starts
    _pending, _starts = tuple(keeps), None


def forward_starts(read) -> list[int]:
    """Where each sequence of the running forward starts (its ``query_start_loc`` as ints): ``read()``
    at the first GDN layer, the pending keeps checked against it (``check``), then the same list for
    every other layer, so a forward reads it from the device and checks its keeps once."""
    global _starts
    if _starts is None:
        starts = read()
        check(_pending, starts)
        _starts = starts
    return _starts


def clear() -> None:
    set_pending(())


def for_sequence(keeps: Sequence[StateKeep], sequence: int) -> dict[int, int]:
    """``{offset: slot}`` of the keeps of one sequence."""
    return {keep.offset: keep.slot for keep in keeps if keep.sequence == sequence}


def check(keeps: Sequence[StateKeep], bounds: Sequence[int], grid: int = 64) -> None:
    """Raise ``ValueError`` naming the field unless every keep names a sequence of the forward
    (``bounds``: its ``cu_seqlens`` as ints) and an offset on the ``grid`` strictly inside it."""
    for keep in keeps:
        if not 0 <= keep.sequence < len(bounds) - 1:
            raise ValueError(f"StateKeep.sequence={keep.sequence}: the forward has {len(bounds) - 1} sequences")
        length = bounds[keep.sequence + 1] - bounds[keep.sequence]
        if keep.offset <= 0 or keep.offset % grid or keep.offset >= length:
            raise ValueError(f"StateKeep.offset={keep.offset}: must be a multiple of {grid} inside the "
                             f"sequence's {length} tokens")
