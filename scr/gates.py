"""Recurrent-state decisions of SCR (``scr_spec.md`` §9.3, §9.5): may a plan run, and with which state.

Pure functions over the facts the scheduler side knows; the tensor copies are in
``patches/scr_store.py``. Modes: ``fork`` (default: at block 1's splice the request's state is
overwritten by the snapshot taken at the end of the previous turn's prompt), ``strict`` (fork,
but only when the snapshot covers no more tokens than the surviving rows), ``none`` (never
restore; the linear layers skip relocated spans).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    allow: bool
    freeze_n: int = 0  # rows a single-phase materialise may use
    restore: bool = False  # arm the state restore at block 1's splice
    reason: str = ""  # why it declined (or which cap applied)


def ssm_ready(
    *,
    mode: str,
    rows: int,
    has_mamba: bool,
    shadow_ready: bool,
    has_snapshot: bool,
    ssm_tokens: int,
    window: int | None = None,
) -> Gate:
    """§9.3, in the spec's order. ``rows`` = surviving rows of the plan (lead run included);
    ``has_snapshot`` = the session holds a side slot inside the shadow; ``ssm_tokens`` = tokens the
    saved state covers (-1 when none or stale)."""
    if rows <= 0:
        return Gate(False, reason="no_rows")
    reason = ""
    if window is not None:
        rows -= window
        if rows <= 0:
            return Gate(False, reason="swa_too_short")
        reason = "swa_capped"
    if not shadow_ready:
        if not has_mamba:
            return Gate(True, freeze_n=rows, reason=reason or "ssm_na")
        return Gate(False, reason="no_shadow")
    if mode == "none":
        return Gate(True, freeze_n=rows, reason=reason)
    if not has_snapshot or ssm_tokens <= 0:
        return Gate(False, reason="no_snapshot")
    if mode == "strict":
        if not 0 < ssm_tokens <= rows:
            return Gate(False, reason="strict_snapshot_longer_than_rows")
        return Gate(True, freeze_n=ssm_tokens, restore=True, reason=reason)
    if mode == "fork":
        return Gate(True, freeze_n=rows, restore=True, reason=reason)
    raise ValueError(f"unknown ssm mode {mode!r}")


def fallback_restore(*, radix_a: bool, block_index: int | None, carries_restore: bool, side_slot: int | None):
    """§9.5 fallback rule after an abort, a position mismatch or an allocation failure: the side
    slot to arm the state restore from, or None to keep the request's own state.

    * prefix from the radix cache and no block spliced yet (block_index <= 1): own state, which
      already covers A + B';
    * else, if this record carries the restore (single-phase lead from the side buffer): arm it;
    * blocks >= 2 carry no restore: leave the already forked state alone.
    """
    if radix_a and (block_index or 0) <= 1:
        return None
    if carries_restore:
        return side_slot
    return None
