"""Fault injection for containment tests: make a named step of a policy raise on its Nth call.

``CACHE_POLICY_FAULTS="scr.restore_state@1,scr.side_store~conv-b@2+"`` (read once per process)
makes ``check("scr.restore_state", rid)`` raise ``InjectedFault`` on its first call, and
``check("scr.side_store", rid)`` on the second and every later call whose ``rid`` starts with
``conv-b`` (``~`` filters by key prefix; ``+`` repeats). ``#R`` limits an item to tensor-parallel
rank R (``scr.place_rows#1@1``: the first copy fails on rank 1 only; the rank is set by the
scheduler's start-up hook, 0 until then). Use ``#R`` only on steps the ranks exchange about
(scr's tensor steps, ``exact.piece``): elsewhere one rank's failure leaves the ranks at different
collectives, a hang (docs/tensor_parallel.md §4). Unset (the default), a check is one dict
lookup. The steps are named where ``check`` is called (``grep faults.check``: the executor in
``patches/``, SCR's step carrier ``scr/steps.py``, the file writer ``serving/jsonl_append.py``); the
engine tests use this to show that a failing step ends one request, never the server. Standard
library only and in ``policy/``, so every package that names a step may use it (``scr/`` imports
only ``policy/``), and the executors' pure tests too.

Two points stand for a full disk under the per-request files, where a test cannot mount a small
tmpfs (``serving/jsonl_append.py``: the record's first half is written, then it is lost with
``ENOSPC``, logged and counted; the next good write ends the cut line and writes a ``lost``
marker):

* ``events.write`` (key: the rid): a request event of ``--cache-events`` (``serving/event_writer.py``);
* ``trace.write`` (key: the rid): a line of ``--cache-trace`` (``patches/trace_writer.py``).

``events.write@3+`` loses every event write from the 3rd. Items of one step count only the calls
that reach them (a firing item ends the call; ``test_items_of_one_step_count_their_own_calls``),
so k consecutive writes from the Nth are k copies of one item: ``events.write@3,events.write@3``
loses the 3rd and 4th, while ``events.write@3,events.write@4`` loses the 3rd and the 5th. The
start-up record passes no fault point.
"""

from __future__ import annotations

import os

ENV = "CACHE_POLICY_FAULTS"


class InjectedFault(RuntimeError):
    """Raised by ``check`` where a test asked for a failure."""


def parse(text: str) -> dict[str, list[tuple[str, int, bool, int | None]]]:
    """``"step[~prefix][#rank]@N[+],..."`` -> {step: [(key prefix, N, every later call, rank or
    None)]}; a malformed item is an error (so a typo in a test cannot silently inject nothing)."""
    plan: dict[str, list[tuple[str, int, bool, int | None]]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        target, sep, when = item.partition("@")
        target, has_rank, rank = target.partition("#")
        step, _, prefix = target.partition("~")
        repeat = when.endswith("+")
        number = when[:-1] if repeat else when
        if (not sep or not step or not number.isdigit() or int(number) < 1
                or (has_rank and not rank.isdigit())):
            raise ValueError(f"{ENV}: expected step[~keyprefix][#rank]@N[+] (N >= 1), got {item!r}")
        plan.setdefault(step, []).append((prefix, int(number), repeat, int(rank) if has_rank else None))
    return plan


_PLAN = parse(os.environ.get(ENV, ""))
_CALLS: dict[tuple[str, int], int] = {}  # (step, index of the item in its step's list) -> calls counted
_RANK = [0]  # this process's tensor-parallel rank


def set_rank(rank: int) -> None:
    """Called once per scheduler process: items with ``#R`` fire only where R is this rank."""
    _RANK[0] = int(rank)


def check(step: str, key: str = "") -> None:
    """Raise ``InjectedFault`` if this call of ``step`` (for ``key``, e.g. a rid) is one the
    environment asked to fail."""
    for item, (prefix, number, repeat, rank) in enumerate(_PLAN.get(step, ())):
        if not key.startswith(prefix) or (rank is not None and rank != _RANK[0]):
            continue
        _CALLS[step, item] = count = _CALLS.get((step, item), 0) + 1
        if count == number or (repeat and count > number):
            raise InjectedFault(f"injected fault in {step} for {key or '-'} (call {count})")
