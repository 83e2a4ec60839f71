"""Recurrent-state decisions of SCR (``docs/scr.md`` §9.3, §9.5): may a plan run, and with which state.

The authors' fallback rule after an abort (§9.5) needs no function here: on the two-phase path the
restore is a copy made inside block 1's relocation, so a request that falls back before it keeps
its own state (which covers everything before the stop), and blocks >= 2 never restore; the
single-phase case that arms a restore on fallback is not ported. Pure functions over the facts
the scheduler side knows; the tensor copies are in ``patches/scr_tensors.py``. Modes: ``fork``
(default: at block 1's relocation the request's state is
overwritten by the snapshot taken at the end of the previous turn's prompt), ``strict`` (fork,
but only when the snapshot covers no more tokens than the surviving rows), ``none`` (never
restore; the linear layers skip relocated blocks).
"""
# Spec: docs/scr.md

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gate:
    """May a plan run, and does block 1's relocation overwrite the request's recurrent state?"""

    allow: bool
    restore: bool = False  # arm the state restore at block 1's relocation
    reason: str = ""  # why it declined (or which cap applied)


def state_ready(
    *,
    mode: str,
    rows: int,
    has_state_pool: bool,
    shadow_ready: bool,
    has_snapshot: bool,
    state_tokens: int,
    window: int | None = None,
) -> Gate:
    """§9.3, in the spec's order. ``rows`` = surviving rows of the plan (lead run included);
    ``has_state_pool`` = the model has recurrent layers; ``has_snapshot`` = the session holds a side
    slot inside the shadow; ``state_tokens`` = tokens the saved state covers (-1 when none or stale)."""
    if rows <= 0:
        return Gate(False, reason="no_rows")
    reason = ""
    if window is not None:
        rows -= window
        if rows <= 0:
            return Gate(False, reason="swa_too_short")
        reason = "swa_capped"
    if not shadow_ready:
        if not has_state_pool:
            return Gate(True, reason=reason or "ssm_na")
        return Gate(False, reason="no_shadow")
    if mode == "none":
        return Gate(True, reason=reason)
    if not has_snapshot or state_tokens <= 0:
        return Gate(False, reason="no_snapshot")
    if mode == "strict":
        if not 0 < state_tokens <= rows:
            return Gate(False, reason="strict_snapshot_longer_than_rows")
        return Gate(True, restore=True, reason=reason)
    if mode == "fork":
        return Gate(True, restore=True, reason=reason)
    raise ValueError(f"unknown ssm mode {mode!r}")
