"""This SGLang process as the overlay sees it: its policy (built once from the spec), its policy
executor (set by the scheduler's start-up hook), whether it leads its data-parallel group, and how
it stops (``fail``, ``refuse``).

The bottom of ``patches/``, with ``patches/targets.py``: it imports no other module of
``patches/``, so every hook module may use it, and ``patches.plugin`` (the top) installs them all.
"""

from __future__ import annotations

import logging

from serving import refusals

logger = logging.getLogger(__name__)

# The policy as (spec, policy): built by the first caller of ``policy_for`` (or handed in by the
# launcher with ``hold``), then handed down; the executor of this process's scheduler.
_state: dict = {"policy": None, "executor": None}


def fail(message: str) -> "SystemExit":
    """Stop the process with ``message`` (SGLang's plugin loader swallows ``Exception``, not ``SystemExit``)."""
    logger.critical("cache-policy overlay: %s", message)
    return SystemExit(f"cache-policy overlay: {message}")


def refuse(message: str) -> "SystemExit":
    """A start-up refusal found inside a scheduler process, passed on to the launcher."""
    refusals.record(message)
    return fail(message)


def hold(spec, policy) -> None:
    """The launcher built ``policy`` from ``spec`` already: ``policy_for(spec)`` answers it."""
    _state["policy"] = (spec, policy)


def policy_for(spec):
    """The policy of ``spec`` (``policy.registry.PolicySpec``), built on the first call in this
    process and the same object after; a spec that cannot be built stops the process."""
    held = _state["policy"]
    if held is not None and held[0] == spec:
        return held[1]
    try:
        policy = spec.build()
    except Exception as exc:  # noqa: BLE001 - any construction error stops the server
        raise fail(f"cannot build policy {spec.policy!r}: {exc}") from None
    hold(spec, policy)
    return policy


def executor():
    """The scheduler process's policy executor (None before the scheduler is built)."""
    return _state["executor"]


def set_executor(executor) -> None:
    """Called once by a hook set's scheduler-init hook with the object its hooks drive."""
    _state["executor"] = executor


def is_leader(scheduler) -> bool:
    """One scheduler per data-parallel group writes events and logs: attention TP/CP rank 0
    of the first pipeline stage (every rank of a group sees the same requests)."""
    ps = scheduler.ps
    return ps.attn_tp_rank == 0 and ps.attn_cp_rank == 0 and ps.pp_rank == 0
