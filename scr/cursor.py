"""Executing a relocation plan, as a state machine over prefix lengths (``docs/scr.md`` §7, two-phase "v6").

For block i with relocated rows at new positions ``[stop_i, stop_i + rows_i)``::

    new prompt |0 .. tree_hit|tree_hit .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| ... tail |
                 from the tree  phase 1: read     relocate 1     read                 relocate 2 read

* phase 1: read up to the block's stop (as SGLang's chunked request, so no token is sampled);
* phase 2: at exactly ``stop``, relocate the block's rows (``Relocation``), then continue with
  the next block, or read the rest of the prompt normally.
The scheduler side reports prefix lengths; the cursor (and ``phase1_step``) answers with what to
do. Pure logic; the other rules the step carrier (``scr.steps``) asks are in ``scr.execution``.
"""
# Spec: docs/scr.md

from __future__ import annotations

from dataclasses import dataclass

from scr.planner import Block


@dataclass(frozen=True)
class Decision:
    """Outcome of the waiting-queue pass (§7.2)."""

    action: str  # "phase1" | "relocate_now" | "retry" | "drop" | "gated"
    reason: str = ""


@dataclass(frozen=True)
class Relocation:
    """Relocate ``block`` now: side rows ``[old_start, old_start + num_rows)`` to new positions
    ``[prefix, prefix + num_rows)``; ``arm_restore`` = overwrite the recurrent state (block 1, fork)."""

    block: Block
    index: int  # 1-based
    arm_restore: bool


class RelocationCursor:
    """Where one request is in its plan: which block it works towards, and how often it waited.

    Mutated only by its own methods (``decide`` counts retries, ``after_relocation`` moves on)."""

    def __init__(self, blocks: tuple[Block, ...], resume_limit: int, max_retries: int, restore: bool):
        if not blocks:
            raise ValueError("a cursor needs at least one block")
        self.blocks = blocks
        self.resume_limit = resume_limit
        self.max_retries = max_retries  # the ``splice_retry`` setting
        self.restore = restore  # the state gate asked for a restore at block 1
        self.retries = 0
        self.index = 0  # 0-based index of the block being worked towards
        self.relocated = 0

    @property
    def stop(self) -> int:
        """Where the current block's relocated rows start (new coordinates): phase 1 reads up to here."""
        return self.blocks[self.index].new_start

    def decide(self, tree_hit: int, chunked_slot_busy: bool, gate_allows: bool) -> Decision:
        """§7.2 steps 6-8, at a waiting-queue pass after SGLang's own prefix match (``tree_hit``)."""
        if chunked_slot_busy or tree_hit > self.resume_limit:
            if chunked_slot_busy and self.retries < self.max_retries:
                self.retries += 1
                return Decision("retry", f"chunked slot busy ({self.retries}/{self.max_retries})")
            cause = "chunked slot busy" if chunked_slot_busy else f"radix match {tree_hit} past the lead {self.resume_limit}"
            return Decision("drop", cause)
        if not gate_allows:
            return Decision("gated")
        if self.stop - tree_hit >= 1:
            return Decision("phase1")
        return Decision("relocate_now")

    def at_prefix(self, prefix_len: int) -> Relocation | str:
        """A forward ended with ``prefix_len`` tokens in place (§7.4): relocate, keep reading, or abort.

        Returns a ``Relocation``, ``"read"`` (continue phase 1 up to ``stop``) or ``"abort"`` (the
        prefix went past the stop: serve the rest normally).
        """
        if prefix_len < self.stop:
            return "read"
        if prefix_len > self.stop:
            return "abort"
        block = self.blocks[self.index]
        first = self.relocated == 0
        return Relocation(block, self.index + 1, arm_restore=first and self.restore)

    def after_relocation(self) -> "NextBlock":
        """Record the relocation of the current block and say what follows (§7.5 step 9): the next
        block's stop, or None when the rest is read normally because there is no further block,
        or the next block's stop is not ahead ("multiblock DROP": the remaining blocks are
        abandoned)."""
        block = self.blocks[self.index]
        self.relocated += 1
        prefix = block.new_start + block.num_rows
        remaining = len(self.blocks) - self.index - 1
        if remaining == 0:
            return NextBlock(None, None, 0, 0)
        following = self.blocks[self.index + 1]
        if following.new_start <= prefix or following.num_rows <= 0:
            return NextBlock(None, following, self.index + 2, remaining)
        self.index += 1
        return NextBlock(following.new_start, following, self.index + 1, 0)


@dataclass(frozen=True)
class NextBlock:
    """After a relocation: read on to ``stop`` and relocate ``block`` (number ``number``, 1-based), or, with
    ``stop`` None, read the rest normally, ``abandoned`` blocks (from ``block`` on) left unrun."""

    stop: int | None
    block: Block | None
    number: int
    abandoned: int


def phase1_step(cursor: RelocationCursor, prefix_len: int, on_waiting_queue: bool) -> tuple[str, object]:
    """Phase 1 met its request again with ``prefix_len`` tokens in place (§7.4).

    Returns ``("read", None)`` (cut at the stop again), ``("relocate", Relocation)`` or
    ``("abort", reason)``. A relocation runs only on the chunked path: on the waiting queue SGLang
    has matched the prefix anew, so a prefix at the stop there is not phase 1's own forward."""
    step = cursor.at_prefix(prefix_len)
    if step == "read":
        return "read", None
    if step == "abort":
        return "abort", f"re-entered with prefix {prefix_len} beyond |A|+|B'| {cursor.stop}"
    if on_waiting_queue:
        return "abort", f"prefix {prefix_len} reached the stop on the waiting queue"
    return "relocate", step
