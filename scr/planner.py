"""K-block relocation plan for Suffix Cache Reuse (spec ``docs/scr.md`` §6.5, default path).

Given the previous prompt ("old") and the new prompt ("new"), SCR serves the leading equal
run from the radix cache and, for up to K of the largest unchanged blocks after it, copies
the block's K/V rows from the side buffer instead of recomputing them.  The last
``min_extend`` tokens of every block are forwarded (re-read) so that the computation right
before each stretch of new text, and before sampling, is real forward computation.

:func:`plan_blocks` returns ``(resume_limit, blocks)``, the blocks sorted by ``new_start``:
rows ``old[old_start : old_start + num_rows]`` are relocated to new positions ``new_start ...``;
everything else is prefilled.  No blocks means "no plan" (the request is served by plain radix
caching plus prefill).

Rules, in the spec's order:

* passthrough (§4.2 step 10): no plan unless the diff kept, deleted *and* inserted tokens;
* the first opcode must be ``equal`` starting at (0, 0) (§6.5 "Built only when"); its new
  end is ``resume_limit``.  The leading run itself is never relocated, and it has no
  minimum length here (the >= 1024-token LCP is a session-matching rule, §4.3);
* candidates (§6.5 step 1): every *later* equal op with ``cj1 >= resume_limit``, length
  ``n_c >= min_tail``, ``ci2 <= side_len`` and ``ci2 <= len(old)`` (``len(positions)``);
* order (step 2): descending by ``(n_c, op_index, ci1, ci2, cj1, cj2)``: largest first,
  ties to the later op;
* acceptance (step 3): ``kext = max(1, min_extend)``, ``maxb = max(1, max_blocks)``; skip a
  candidate when ``n_c - kext < min_tail`` (so a block needs ``min_tail + kext`` = 80
  tokens at defaults); with ``side_ids`` given, skip it when the stored tokens do not
  match (alignment check); accept until ``maxb`` blocks.  Each accepted block relocates
  ``[cj1, cj2 - kext)`` from old rows ``[ci1, ci2 - kext)``;
* multi-block scheduling (step 4): sort accepted blocks by new start; with
  ``mb_min_gap > 0`` drop any block whose start is closer than ``mb_min_gap`` to the end of
  the previous *kept* block's relocated part; if that leaves exactly one block, the plan
  is the **largest** accepted block (the spec's quirk: even if the gap filter dropped it).

Standard library only.  Interpretations (where the spec leaves room):

1. Passthrough is applied here although the spec places it in the intercept (§4.2), so
   that ``plan_blocks(old, new)`` makes the same decision as SCR for the same inputs.  It
   is idempotent if a caller checks it too.  Pass ``ops`` to reuse a diff already made.
2. ``side_len`` is ``n_side`` (rows stored in the side slot); ``None`` means no cap beyond
   ``len(old)``.  The cap is on the *block* end ``ci2`` (including its forwarded last
   ``kext`` tokens), as in §6.5 step 1, not only on the relocated rows.
3. The alignment check needs the stored token ids (``side_ids``), which are not among the
   required arguments; it runs only when ``side_ids`` is passed (then ``side_len``
   defaults to ``len(side_ids)``).  A misaligned candidate does not count towards
   ``max_blocks`` ("-> next candidate").
4. The "at least kext new tokens remain after the relocated part" check of step 3 is
   always true as written and is omitted.
5. ``min_tail`` and ``min_extend`` are used exactly as the spec writes them (no clamping of
   ``min_tail``); ``max_blocks`` and ``min_extend`` are clamped to >= 1.
"""
# Spec: docs/scr.md

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from scr.diff import Opcode, diff_opcodes, is_passthrough

#: KVREUSE_MAX_BLOCKS under ``config.DEFAULTS`` (§2.1): K, the most blocks per request.
MAX_BLOCKS = 6
#: KVREUSE_V6_MIN_EXTEND (§2.1): "kext", tokens at the end of each block that are forwarded.
MIN_EXTEND = 16
#: KVREUSE_V6_MIN_TAIL (§2.2): "mintail", smallest block and smallest relocated part.
MIN_TAIL = 64
#: KVREUSE_MB_MIN_GAP (§2.1): minimum forwarded stretch between relocated blocks; 0 = off.
MB_MIN_GAP = 0


class Block(NamedTuple):
    """One accepted block (§6.5 step 3): relocate ``old[old_start:old_start+num_rows]``.

    ``n_c`` is the equal run's length and ``new_end`` its end (``cj2``) in new coordinates;
    the run's last ``n_c - num_rows`` tokens are forwarded.
    """

    old_start: int
    new_start: int
    num_rows: int
    n_c: int
    new_end: int


def leading_equal_end(ops: Sequence[Opcode]) -> int | None:
    """``resume_limit``: new-side end of the leading equal run, or None if there is none (§6.5).

    The leading run is what the radix cache already serves; SCR only plans after it.
    """
    if ops and ops[0][0] == "equal" and ops[0][1] == 0 and ops[0][3] == 0:
        return ops[0][4]
    return None


def candidate_ops(
    ops: Sequence[Opcode], resume_limit: int, *,
    side_len: int | None, len_positions: int, min_tail: int = MIN_TAIL,
) -> list[tuple[int, Opcode]]:
    """``(op_index, op)`` for each equal op after the leading run that may be relocated (§6.5 step 1).

    Only rows of the previous prompt that are also stored in the side slot can be copied
    (§6.2), hence the caps on the block end.
    """
    out = []
    for k in range(1, len(ops)):
        tag, ci1, ci2, cj1, cj2 = ops[k]
        if tag != "equal" or cj1 < resume_limit or ci2 - ci1 < min_tail:
            continue
        if side_len is not None and ci2 > side_len:
            continue
        if ci2 > len_positions:
            continue
        out.append((k, ops[k]))
    return out


def plan_blocks(
    old: Sequence[int], new: Sequence[int], *,
    side_len: int | None = None, max_blocks: int = MAX_BLOCKS,
    min_extend: int = MIN_EXTEND, min_tail: int = MIN_TAIL, mb_min_gap: int = MB_MIN_GAP,
    side_ids: Sequence[int] | None = None, ops: Sequence[Opcode] | None = None,
) -> tuple[int | None, list[Block]]:
    """``(resume_limit, blocks)``: the plan, blocks sorted by ``new_start``.

    ``resume_limit`` is None when there is no leading equal run or the diff is a
    passthrough; ``blocks`` is ``[]`` when there is no plan.  Executors need
    ``resume_limit`` for the "radix match past the leading run" deferral (§7.2 step 6).
    See the module docstring for the rules.  ``side_ids`` (stored token ids) enables the
    alignment check; ``ops`` skips the diff when the caller already has it.
    """
    if ops is None:
        ops = diff_opcodes(old, new)
    if is_passthrough(ops):
        return None, []
    resume_limit = leading_equal_end(ops)
    if resume_limit is None:
        return None, []
    if side_ids is not None and side_len is None:
        side_len = len(side_ids)
    kext = max(1, min_extend)
    cands = candidate_ops(ops, resume_limit, side_len=side_len, len_positions=len(old), min_tail=min_tail)
    cands.sort(key=lambda c: (c[1][2] - c[1][1], c[0], c[1][1], c[1][2], c[1][3], c[1][4]),
               reverse=True)
    accepted = accept_blocks(cands, old, new, kext=kext, min_tail=min_tail, max_blocks=max(1, max_blocks),
                             side_ids=side_ids)
    return resume_limit, schedule_blocks(accepted, kext=kext, mb_min_gap=mb_min_gap)


def accept_blocks(
    cands: Sequence[tuple[int, Opcode]], old: Sequence[int], new: Sequence[int], *,
    kext: int, min_tail: int, max_blocks: int, side_ids: Sequence[int] | None,
) -> list[Block]:
    """§6.5 step 3: walk the sorted candidates, accept up to ``max_blocks``, largest first.

    A block relocates ``[cj1, cj2 - kext)`` from old rows ``[ci1, ci2 - kext)``; it needs
    ``min_tail`` rows after the forwarded ``kext``. With ``side_ids``, the stored ids must be
    the old and the new ids of those rows (alignment check); a misaligned one is skipped.
    """
    accepted: list[Block] = []
    for _k, (_tag, ci1, ci2, cj1, cj2) in cands:
        n_c = ci2 - ci1
        if n_c - kext < min_tail:
            continue
        if side_ids is not None:
            if len(side_ids) < ci2:
                continue
            stored = list(side_ids[ci1:ci2 - kext])
            if stored != list(old[ci1:ci2 - kext]) or stored != list(new[cj1:cj2 - kext]):
                continue
        accepted.append(Block(ci1, cj1, n_c - kext, n_c, cj2))
        if len(accepted) >= max_blocks:
            break
    return accepted


def schedule_blocks(accepted: Sequence[Block], *, kext: int, mb_min_gap: int) -> list[Block]:
    """§6.5 step 4: the accepted blocks (largest first) in new-start order, gap-filtered.

    With ``mb_min_gap > 0`` a block starting closer than that to the end of the previous kept
    block's relocated part is dropped. If one block is left, the plan is the *largest* accepted
    block, even if the gap filter dropped it (the spec's quirk: "tail" is only overwritten when
    more than one block remains).
    """
    if len(accepted) <= 1:
        return list(accepted)
    ordered = sorted(accepted, key=lambda b: b.new_start)
    if mb_min_gap > 0:
        kept = [ordered[0]]
        for b in ordered[1:]:
            if b.new_start - (kept[-1].new_end - kext) >= mb_min_gap:
                kept.append(b)
        ordered = kept
    return [accepted[0]] if len(ordered) == 1 else ordered

