"""Token diff for Suffix Cache Reuse (spec ``docs/scr.md`` §6.1–§6.3, §4.2 step 9).

SCR decides what to relocate from a diff of the previous prompt's token ids ("old") against
the new prompt's token ids ("new").  The planner (``scr.planner``) consumes the opcodes
produced here, so the exact opcodes matter: a different but equally valid diff can split or
merge equal runs and therefore change which blocks are relocated.  For that reason this
module reproduces the spec's algorithm step by step instead of using "any correct diff".

Two paths (§6.1):

* short inputs (``min(len(old), len(new)) < FASTDIFF_MIN`` or FASTDIFF off): Python's
  ``difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()``;
* long inputs: a content-defined-chunking (CDC) diff (:func:`fast_opcodes`), checked by
  :func:`verify_opcodes`; if it returns None, raises, or fails verification, the result is
  difflib's on the raw tokens.

Opcodes are difflib-style ``(tag, i1, i2, j1, j2)`` with half-open ranges ``old[i1:i2]`` and
``new[j1:j2]``; tags are ``equal``, ``replace``, ``delete`` and ``insert``.

Standard library only: this is pure planning logic, importable without torch or SGLang.

Interpretations of the spec (where it is ambiguous, the choice made here):

1. Rebuilding the CDC opcodes (§6.1 step 5): a gap op is emitted before the first equal
   block, between blocks and after the last one, all by the same rule (both sides non-empty:
   replace; old only: delete; new only: insert).  The spec's text names only "between" and
   "after", but the authors' code also emits the leading gap, and without it the ops would
   not start at (0, 0): the verifier would reject them and difflib would answer, which can
   plan where the authors' code does not.  Where the first equal block starts after (0, 0)
   (an edit inside the first ~64-token chunk), the leading op swallows any short common
   prefix before the edit, as theirs does, so the first op is not ``equal`` and no block is
   relocated (§6.5).  With no equal block at all, the single gap is the whole input.
2. Extension (§6.1 step 4) can close a gap completely, leaving two ``equal`` ops back to
   back.  The spec does not merge them, so neither does this module (the planner then sees
   two candidate runs, as the spec's code would).
3. The boundary rule "if (h >> 8) AND mask == 0, put a boundary after this token" is
   applied to every token including the last; the end boundary ``len(ids)`` is added once.
   The rolling value is never reset at a boundary (the spec says it starts at 0 and does
   not mention a reset), and there is no minimum or maximum chunk size.
4. Chunk interning assigns ids in order of first appearance, old first, then new.  The
   numbering does not affect ``SequenceMatcher`` (it only compares ids for equality).
5. The verifier checks exactly the four conditions of §6.1 step 6 (start at (0,0),
   contiguous on both sides, end at (len(old), len(new)), equal runs truly equal); an
   empty op list is rejected unless both inputs are empty.  It does not check tag/shape
   consistency beyond that, because the spec's verifier does not.
6. Counters and logging (§6.1, §13.1 tests 6–7): ``fastdiff_ok`` is counted when the fast
   path is accepted, ``fastdiff_reject`` when it is rejected; the reject line is logged
   when ``count % 50 == 1``.  An exception additionally logs ``fastdiff failed (...)``
   (logged before the reject line).  Counters live in a caller-supplied dict, or in the
   module-level :data:`STATS` when none is given.  The short path touches no counter.
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
from collections.abc import Hashable, MutableMapping, Sequence
from difflib import SequenceMatcher

log = logging.getLogger(__name__)

Opcode = tuple[str, int, int, int, int]

# --- constants, each with the spec section that fixes it ------------------------------
#: KVREUSE_FASTDIFF default 1 (§2.2): use the CDC diff for long sequences.
FASTDIFF = True
#: KVREUSE_FASTDIFF_MIN default 2048 (§2.2, §6.1): CDC only when *both* inputs have at
#: least this many tokens.
FASTDIFF_MIN = 2048
#: KVREUSE_CDC_TARGET default 64 (§2.2, §6.1 step 1): target chunk size T; used as the mask
#: ``T - 1``, so it must be a power of two (not validated, as in the spec).
CDC_TARGET = 64
#: KVREUSE_CDC_EXTEND default 1 (§2.2, §6.1 step 4): grow CDC-equal blocks token by token.
CDC_EXTEND = True
#: §6.1 step 1: multiplier applied to each token id in the rolling hash.
CDC_MULT = 0x9E3779B1
#: §6.1 step 1: the rolling value is 32-bit.
_MASK32 = 0xFFFFFFFF
#: §6.1 step 1: the boundary test looks at ``h >> 8`` (bits 8..8+log2(T)-1).
CDC_SHIFT = 8
#: §6.1: the reject line is logged only when ``fastdiff_reject % 50 == 1``.
REJECT_LOG_EVERY = 50

#: Counters used when the caller passes no ``stats`` dict (§6.1: ``fastdiff_ok`` /
#: ``fastdiff_reject``).
STATS: dict[str, int] = {}


def difflib_opcodes(old: Sequence[Hashable], new: Sequence[Hashable]) -> list[Opcode]:
    """Difflib opcodes on the raw token lists, with autojunk off (§6.1 short path).

    autojunk is off because token ids repeat a lot (whitespace, template tokens); difflib's
    popularity heuristic would otherwise hide real matches in long prompts.
    """
    return [tuple(op) for op in SequenceMatcher(None, old, new, autojunk=False).get_opcodes()]


def cdc_bounds(ids: Sequence[int], target: int = CDC_TARGET) -> list[int]:
    """Content-defined chunk boundaries of ``ids`` (§6.1 step 1, ``_cdc_bounds``).

    A boundary depends only on the last few tokens (the test reads bits 8..13 of a
    shift-xor hash, so about the last 14 tokens), which is why chunking re-synchronises
    shortly after an edit and equal text far from edits yields identical chunks on both
    sides.  Returns a list starting at 0 and ending at ``len(ids)``; chunk ``k`` is
    ``ids[b[k]:b[k+1]]``.
    """
    mask = target - 1
    h = 0
    bounds = [0]
    for idx, t in enumerate(ids):
        h = ((h << 1) ^ ((t * CDC_MULT) & _MASK32)) & _MASK32
        if (h >> CDC_SHIFT) & mask == 0:
            bounds.append(idx + 1)
    if bounds[-1] != len(ids):
        bounds.append(len(ids))
    return bounds


def chunk_ids(
    old: Sequence[int], old_bounds: Sequence[int],
    new: Sequence[int], new_bounds: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Intern each chunk's token tuple into a small int, one table for both sides (§6.1 step 2).

    Equal chunk ids then mean equal token content, so the chunk-level diff can only pair
    chunks whose tokens are identical.
    """
    table: dict[tuple, int] = {}

    def intern(ids: Sequence[int], bounds: Sequence[int]) -> list[int]:
        out = []
        for a, b in zip(bounds, bounds[1:]):
            out.append(table.setdefault(tuple(ids[a:b]), len(table)))
        return out

    return intern(old, old_bounds), intern(new, new_bounds)


def _extend_blocks(
    old: Sequence[int], new: Sequence[int], blocks: list[list[int]]
) -> None:
    """Grow equal blocks token by token at their edges, in place (§6.1 step 4).

    Chunk matching only finds whole equal chunks; the equal tokens of a partly edited chunk
    next to a block are recovered here.  Backwards first (in order), never crossing the
    previous block's end; then forwards (in reverse order), never crossing the next
    block's start.  Both limits apply on the old and the new side.
    """
    prev_i, prev_j = 0, 0
    for blk in blocks:
        i1, i2, j1, j2 = blk
        while i1 > prev_i and j1 > prev_j and old[i1 - 1] == new[j1 - 1]:
            i1 -= 1
            j1 -= 1
        blk[0], blk[2] = i1, j1
        prev_i, prev_j = i2, j2
    next_i, next_j = len(old), len(new)
    for blk in reversed(blocks):
        i1, i2, j1, j2 = blk
        while i2 < next_i and j2 < next_j and old[i2] == new[j2]:
            i2 += 1
            j2 += 1
        blk[1], blk[3] = i2, j2
        next_i, next_j = i1, j1


def _gap_op(i1: int, i2: int, j1: int, j2: int) -> Opcode | None:
    """The op for the gap ``old[i1:i2]`` / ``new[j1:j2]`` (§6.1 step 5), or None when it is empty."""
    if i2 > i1 and j2 > j1:
        return ("replace", i1, i2, j1, j2)
    if i2 > i1:
        return ("delete", i1, i2, j1, j2)
    if j2 > j1:
        return ("insert", i1, i2, j1, j2)
    return None


def _rebuild_ops(blocks: list[list[int]], len_old: int, len_new: int) -> list[Opcode]:
    """Equal blocks -> ops that tile both sequences (§6.1 step 5; module docstring, interpretation 1).

    One cursor walks the blocks in order; every gap it crosses, before the first block,
    between two blocks and after the last, becomes one op (an empty gap none)::

        old  0 [ gap )[== block 1 ==)[ gap )[== block 2 ==)[ gap ) len_old
        new  0 [ gap )[== block 1 ==)[ gap )[== block 2 ==)[ gap ) len_new
    """
    ops: list[Opcode] = []
    i = j = 0
    for i1, i2, j1, j2 in blocks:
        gap = _gap_op(i, i1, j, j1)
        if gap is not None:
            ops.append(gap)
        ops.append(("equal", i1, i2, j1, j2))
        i, j = i2, j2
    gap = _gap_op(i, len_old, j, len_new)
    if gap is not None:
        ops.append(gap)
    return ops


def fast_opcodes(
    old: Sequence[int], new: Sequence[int], *,
    target: int = CDC_TARGET, extend: bool = CDC_EXTEND,
) -> list[Opcode] | None:
    """The content-defined-chunking diff (§6.1 steps 1–5, ``_fast_opcodes``).

    Difflib on 30k raw tokens can be slow; on ~64-token chunks it is ~64x shorter.  The
    result is not guaranteed to equal difflib's raw-token opcodes, and it is not checked
    here: callers must run :func:`verify_opcodes` (``diff_opcodes`` does).  Returns None if
    an equal chunk run maps to token runs of different lengths (cannot happen with
    interned tuples; kept because the spec aborts there).
    """
    ob, nb = cdc_bounds(old, target), cdc_bounds(new, target)
    oc, nc = chunk_ids(old, ob, new, nb)
    blocks: list[list[int]] = []
    for tag, ci1, ci2, cj1, cj2 in SequenceMatcher(None, oc, nc, autojunk=False).get_opcodes():
        if tag != "equal":
            continue
        i1, i2, j1, j2 = ob[ci1], ob[ci2], nb[cj1], nb[cj2]
        if i2 - i1 != j2 - j1:
            return None
        blocks.append([i1, i2, j1, j2])
    if extend:
        _extend_blocks(old, new, blocks)
    return _rebuild_ops(blocks, len(old), len(new))


def verify_opcodes(old: Sequence[Hashable], new: Sequence[Hashable], ops) -> bool:
    """True when ``ops`` tile both sequences and every equal run is truly equal (§6.1 step 6).

    This is the safety net that lets the fast diff be heuristic: a wrong "equal" would make
    SCR relocate K/V for tokens that are not the same, so anything doubtful goes to difflib.
    """
    if not ops:
        return len(old) == 0 and len(new) == 0
    i, j = 0, 0
    for tag, i1, i2, j1, j2 in ops:
        if i1 != i or j1 != j:
            return False
        if tag == "equal" and list(old[i1:i2]) != list(new[j1:j2]):
            return False
        i, j = i2, j2
    return i == len(old) and j == len(new)


def diff_with_path(
    old: Sequence[int], new: Sequence[int], *,
    fastdiff: bool = FASTDIFF, fastdiff_min: int = FASTDIFF_MIN,
    cdc_target: int = CDC_TARGET, cdc_extend: bool = CDC_EXTEND,
    stats: MutableMapping[str, int] | None = None,
) -> tuple[list[Opcode], str]:
    """:func:`diff_opcodes` plus which path produced the answer.

    The path is ``"difflib"`` (short inputs or FASTDIFF off), ``"fastdiff"`` (CDC accepted)
    or ``"fallback"`` (CDC returned None, raised, or failed the verifier; difflib answered).
    Exposed so tests and traces can tell a fallback from a short-input difflib result.
    """
    if stats is None:
        stats = STATS
    if not fastdiff or min(len(old), len(new)) < fastdiff_min:
        return difflib_opcodes(old, new), "difflib"
    try:
        ops = fast_opcodes(old, new, target=cdc_target, extend=cdc_extend)
        ok = ops is not None and verify_opcodes(old, new, ops)
    except Exception as exc:  # noqa: BLE001 - any failure of the heuristic means difflib
        log.warning("fastdiff failed (%r); using difflib", exc)
        ok = False
    if ok:
        stats["fastdiff_ok"] = stats.get("fastdiff_ok", 0) + 1
        return ops, "fastdiff"
    n = stats["fastdiff_reject"] = stats.get("fastdiff_reject", 0) + 1
    if n % REJECT_LOG_EVERY == 1:
        log.warning("fastdiff rejected by verifier [n=%d]; falling back to difflib", n)
    return difflib_opcodes(old, new), "fallback"


def diff_opcodes(
    old: Sequence[int], new: Sequence[int], *,
    fastdiff: bool = FASTDIFF, fastdiff_min: int = FASTDIFF_MIN,
    cdc_target: int = CDC_TARGET, cdc_extend: bool = CDC_EXTEND,
    stats: MutableMapping[str, int] | None = None,
) -> list[Opcode]:
    """Opcodes turning ``old`` (previous prompt) into ``new`` (new prompt), per §6.1.

    Keyword arguments are the §2.2 knobs (defaults = the spec's module defaults) and an
    optional counter dict (see the module docstring, interpretation 6).
    """
    return diff_with_path(
        old, new, fastdiff=fastdiff, fastdiff_min=fastdiff_min,
        cdc_target=cdc_target, cdc_extend=cdc_extend, stats=stats,
    )[0]


def edit_counts(ops) -> tuple[int, int, int]:
    """``(kept, deleted, inserted)`` in tokens (§4.2 step 9).

    kept = new-side length of equal ops; deleted = old-side length of delete and replace;
    inserted = new-side length of insert and replace.  SCR plans only when all three are
    non-zero (§4.2 step 10, "passthrough" otherwise).
    """
    kept = deleted = inserted = 0
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            kept += j2 - j1
        if tag in ("delete", "replace"):
            deleted += i2 - i1
        if tag in ("insert", "replace"):
            inserted += j2 - j1
    return kept, deleted, inserted


def is_passthrough(ops) -> bool:
    """True when SCR leaves the request to the radix cache (§4.2 step 10).

    A pure append (nothing deleted) is already served by the radix prefix match; a pure
    deletion (nothing inserted) and a total rewrite (nothing kept) are not handled by SCR.
    """
    kept, deleted, inserted = edit_counts(ops)
    return inserted == 0 or kept == 0 or deleted == 0


def new_positions(ops) -> list[int]:
    """The session's new ``positions`` (§6.3).

    Equal, insert and replace ops each contribute their new-side length of consecutive
    positions; delete contributes nothing.  For ops that tile ``new`` this is always
    ``0..len(new)-1``, which is why "old position of side row k" is simply k on the next
    turn (a relocated row is re-rotated to its new index).
    """
    out: list[int] = []
    for tag, _i1, _i2, j1, j2 in ops:
        if tag != "delete":
            start = len(out)
            out.extend(range(start, start + (j2 - j1)))
    return out
