"""Executing a relocation plan, as a state machine over prefix lengths (``scr_spec.md`` §7, two-phase "v6").

For block i with relocated rows at new positions ``[stop_i, stop_i + rows_i)``::

    new prompt |0 .. radix_n0|radix_n0 .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| ... tail |
                 from the tree  phase 1: read     splice 1       read                 splice 2   read

* phase 1: read up to the block's stop (as SGLang's chunked request, so no token is sampled);
* phase 2: at exactly ``stop``, splice the block's rows (``Splice``), then continue with the
  next block, or read the rest of the prompt normally.
The scheduler side reports prefix lengths; the cursor answers with what to do. Pure logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from scr.planner import Block


@dataclass(frozen=True)
class Decision:
    """Outcome of the waiting-queue pass (§7.2)."""

    action: str  # "phase1" | "direct_splice" | "retry" | "drop" | "gated"
    reason: str = ""


@dataclass(frozen=True)
class Splice:
    """Relocate ``block`` now: side rows ``[old_start, old_start + num_rows)`` to new positions
    ``[prefix, prefix + num_rows)``; ``arm_restore`` = overwrite the recurrent state (block 1, fork)."""

    block: Block
    index: int  # 1-based
    arm_restore: bool


class SpliceCursor:
    def __init__(self, blocks: tuple[Block, ...], lead_new_end: int, splice_retry: int, restore: bool):
        if not blocks:
            raise ValueError("a cursor needs at least one block")
        self.blocks = blocks
        self.lead_new_end = lead_new_end
        self.splice_retry = splice_retry
        self.restore = restore  # the state gate asked for a restore at block 1
        self.retries = 0
        self.index = 0  # 0-based index of the block being worked towards
        self.spliced = 0
        self.radix_a = False

    @property
    def stop(self) -> int:
        """Where the current block's relocated rows start (new coordinates): phase 1 reads up to here."""
        return self.blocks[self.index].new_start

    def decide(self, radix_n0: int, chunked_slot_busy: bool, gate_allows: bool) -> Decision:
        """§7.2 steps 6-8, at a waiting-queue pass after SGLang's own prefix match (``radix_n0``)."""
        if chunked_slot_busy or radix_n0 > self.lead_new_end:
            if chunked_slot_busy and self.retries < self.splice_retry:
                self.retries += 1
                return Decision("retry", f"chunked slot busy ({self.retries}/{self.splice_retry})")
            cause = "chunked slot busy" if chunked_slot_busy else f"radix match {radix_n0} past the lead {self.lead_new_end}"
            return Decision("drop", cause)
        if not gate_allows:
            return Decision("gated")
        self.radix_a = True
        if self.stop - radix_n0 >= 1:
            return Decision("phase1")
        return Decision("direct_splice")

    def at_prefix(self, prefix_len: int) -> Splice | str:
        """A forward ended with ``prefix_len`` tokens in place (§7.4): splice, keep reading, or abort.

        Returns a ``Splice``, ``"read"`` (continue phase 1 up to ``stop``) or ``"abort"`` (the
        prefix went past the stop: serve the rest normally).
        """
        if prefix_len < self.stop:
            return "read"
        if prefix_len > self.stop:
            return "abort"
        block = self.blocks[self.index]
        first = self.spliced == 0
        return Splice(block, self.index + 1, arm_restore=first and self.restore)

    def spliced_block(self) -> int | None:
        """Record the splice of the current block; returns the next stop, or None when the rest is
        read normally (no further block, or the next block's stop is not ahead: §7.5 step 9)."""
        block = self.blocks[self.index]
        self.spliced += 1
        prefix = block.new_start + block.num_rows
        if self.index + 1 >= len(self.blocks):
            return None
        following = self.blocks[self.index + 1]
        if following.new_start <= prefix or following.num_rows <= 0:
            return None  # "multiblock DROP": the remaining blocks are abandoned
        self.index += 1
        return following.new_start
