"""Tensor-parallel ranks kept in step: the row each rank contributes after a step, and what the
rows of all ranks mean (``docs/tensor_parallel.md`` §3, §4).

Under ``--tp-size N`` every rank runs its own policy over its own shard. Their decisions agree
because they are pure functions of the same request stream; what can still differ is caught by an
exchange of one row per rank, ``(failed, digest of step and rid)``, after each step that matters:

* ``scr``: after each *tensor step* (placing rows, restoring or saving a recurrent state, storing
  a turn's rows), which can fail on one rank only. Any rank failed -> every rank takes the same
  fallback (its own error, or ``PeerFailed`` on the others), so prefixes, extend lengths and
  session tables stay equal on every rank.
* ``exact``: after each prefill forward, with the forward's end and what is kept there in the
  step, so two trees that drifted apart are named at once instead of a hang.
* The digests differ -> the ranks are at different steps or requests: ``RanksDisagree``, which is
  not contained and stops the scheduler with both ranks' views (going on would hang the next
  collective or serve rows one rank does not hold).

With one rank the exchange is the rank's own row, so the same code runs without a collective.
Standard library only: the rules are unit-tested here, the collective lives in ``patches/tp_rows.py``.
"""
# Spec: docs/tensor_parallel.md §3, §4

from __future__ import annotations

import hashlib
from typing import Sequence

DIGEST_BYTES = 7  # fits a signed int64 tensor element


class PeerFailed(RuntimeError):
    """This rank's step succeeded, another rank's failed: take the same fallback as that rank."""


class RanksDisagree(RuntimeError):
    """The ranks reached different tensor steps: their decisions diverged. Never contained."""


class ExchangeFailed(RanksDisagree):
    """The exchange itself failed (a peer died, a timeout): the ranks can no longer be kept in step."""


def step_digest(step: str, rid: str) -> int:
    """A 56-bit digest of (step, rid), equal on every rank that is at the same step of one request."""
    return int.from_bytes(hashlib.blake2b(repr((step, rid)).encode(), digest_size=DIGEST_BYTES).digest(), "big")


def own_row(step: str, rid: str, failed: bool) -> tuple[int, int]:
    """What this rank contributes to the exchange."""
    return int(failed), step_digest(step, rid)


def failed_ranks(rows: Sequence[tuple[int, int]], step: str, rid: str) -> list[int]:
    """The ranks whose step failed, from every rank's row (index = rank); ``RanksDisagree`` when a
    rank's digest is not this step's."""
    want = step_digest(step, rid)
    strays = [rank for rank, (_, digest) in enumerate(rows) if digest != want]
    if strays:
        raise RanksDisagree(f"TP ranks disagree at step {step} of rid={rid}: rank(s) "
                            f"{', '.join(map(str, strays))} are at another step or request; digests "
                            f"{[digest for _, digest in rows]}, expected {want}")
    return [rank for rank, (failed, _) in enumerate(rows) if failed]


def peer_failure(step: str, ranks: Sequence[int]) -> PeerFailed:
    return PeerFailed(f"{step} failed on TP rank(s) {', '.join(map(str, ranks))}")
