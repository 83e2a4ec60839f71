"""The contract of a policy whose plans have engine-time steps (``Relocate``, ``Restore``): who
calls whom, with what, while the engine reads a request.

A policy that plans at enqueue (``plans_at = "enqueue"``, SCR) is a ``StepPolicy``: beside the
``CachePolicy`` members it sizes its side stores (``side_stores``) and builds one ``StepCarrier``
per scheduler over the engine's port (``step_carrier``). Three typed interfaces, nothing reached
by name::

    executor (patches/executor.py) ──StepCarrier──▶ carrier (scr/steps.py) ──EnginePort──▶ engine
                                                     │                        (patches/scr_runtime.py)
                                                     └── reads the plan's ``Admission``, the record's fields (``StepRecord``)

The engine port is split by what it gives: ``KvSlots`` (allocation: fresh K/V slots, eviction),
``RequestPrefix`` (the request's tree prefix and token array), ``StoredStates`` (the rows and
recurrent states the policy keeps in side slots); ``EnginePort`` is the three with the engine's
facts (``EngineFacts``), the token decoder and the ranks' exchange. ``req`` in every signature is
the engine's own request object: a carrier never reads it, only hands it back to the port.

Standard library only, like the rest of ``policy/``. ``CarrierDefaults`` gives every carrier
method a do-nothing default, so a carrier writes only the points it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Protocol, Sequence

from policy.api import CachePolicy, Plan
from policy.executor_lines import ExecutorLines

Req = Any  # the engine's request object: opaque to a carrier, handed back to the port
Slots = Any  # K/V slots of the engine's pool, as ``KvSlots.alloc`` gave them


# ---------------------------------------------------------------------- values


class RequestFacts(NamedTuple):
    """What a step carrier reads of a request from the engine port, as the engine has it now."""

    prompt: Sequence[int]
    prefix_len: int  # tokens in place (tree match, read, relocated)
    full_len: int  # prompt + output tokens
    extend_end: int | None  # where this round's read ends
    finished: bool
    has_state_slot: bool  # the request holds a slot of the recurrent-state pool


class Committed(NamedTuple):
    """The K/V a request holds when it leaves: ``kv_len`` rows for ``tokens`` in its pool row."""

    kv_len: int
    tokens: Sequence[int]
    pool_row: Any  # the engine's row of the request (handed back to ``StoredStates.store_rows``)


class Room(NamedTuple):
    """The engine's K/V pool now: its size, the slots free, the slots eviction could free."""

    size: int
    free: int
    evictable: int


class Restored(NamedTuple):
    """What ``StoredStates.restore_state`` did: the request's state slot it overwrote, the
    checksums asked for (before, side copy, after; None when not asked: reading them syncs a GPU),
    and what ``undo_restore`` needs to put the request's own state back."""

    state_slot: int
    checksums: tuple[float, float, float] | None
    kept: Any


@dataclass(frozen=True)
class EngineFacts:
    """What the engine is, once its pools and the policy's side stores exist (the carrier's
    start-up lines and its state rules read it)."""

    version: str  # the serving engine's version
    pid: int
    environ: Mapping[str, str]  # the process environment
    pool_slots: int  # K/V slots in the engine's pool
    layers: tuple[int, ...]  # the full-attention layers whose rows a side slot holds
    rotary: bool  # keys can be re-rotated (the model's rotary table was found)
    state_pool: bool  # the model has recurrent layers (a state pool)
    side_bytes_per_token: int | None  # bytes of one side row; None: no side rows allocated
    shadow_bytes: int | None  # bytes of the saved recurrent states; None: none are kept

    @property
    def shadow(self) -> bool:
        """Recurrent states can be saved to side slots and restored from them."""
        return self.shadow_bytes is not None


@dataclass(frozen=True)
class StoreCosts:
    """What the engine tells a policy before it sizes its side stores (``StepPolicy.side_stores``)."""

    kv_bytes_per_token: int  # K and V of every full-attention layer on this rank
    state_bytes_per_slot: int  # one recurrent state (0: the model has none)
    where: str  # the device the stores would go on, for messages
    free_memory: Callable[[], tuple[int, int] | None]  # (free, total) bytes there, None: unknown; asked only if needed
    on_gpu: bool
    chunked_prefill_size: int | None
    tp_size: int
    pp_size: int
    mem_fraction_static: float | None


@dataclass(frozen=True)
class SideStores:
    """A policy's side stores on one engine: ``slots`` side slots of ``tokens`` K/V rows, with one
    saved recurrent state each when ``states``; allocated only when ``allocate``. ``problem``: the
    engine refuses to start with it; ``line``: logged at start (``warn``: at WARNING)."""

    slots: int
    tokens: int
    states: bool
    allocate: bool
    problem: str | None
    line: str
    warn: bool = False


# ---------------------------------------------------------------------- the engine port


class KvSlots(Protocol):
    """Allocation: fresh K/V slots from the engine's pool, and room made by evicting its tree."""

    def room(self) -> Room: ...

    def alloc(self, rows: int) -> Slots | None:
        """``rows`` fresh slots, or None when the pool has too few."""
        ...

    def free(self, slots: Slots) -> None: ...

    def evict(self, tokens: int) -> None: ...


class RequestPrefix(Protocol):
    """The tree prefix: the rows a request has in place, and its token array for this round."""

    def facts(self, req: Req) -> RequestFacts: ...

    def committed(self, req: Req) -> Committed | None:
        """The K/V the request holds (None: no rows)."""
        ...

    def advance_prefix(self, req: Req) -> None:
        """The prefix covers what the last chunk read (the engine's stash left it behind)."""
        ...

    def cut(self, req: Req, end: int | None) -> None:
        """This round reads up to ``end``; None: the token array gets its full length back."""
        ...

    def attach(self, req: Req, slots: Slots, rows: int, outside_tree: bool) -> None:
        """Append ``slots`` (``rows`` of them) to the prefix; ``outside_tree``: the engine must not
        cache the request in its tree."""
        ...

    def detach(self, req: Req, prefix_len: int, rows: int) -> None:
        """Undo ``attach``: the prefix back to ``prefix_len``, the request cacheable again."""
        ...

    def include_in_tree(self, req: Req) -> None:
        """The engine may cache the request again."""
        ...


class StoredStates(Protocol):
    """States: the K/V rows and recurrent states a policy keeps in side slots, copied between a
    request and a side slot."""

    def place(self, side_slot: int, old_start: int, new_start: int, slots: Slots, rerotate: bool) -> None:
        """Side rows ``[old_start, old_start + len(slots))`` into ``slots``, keys re-rotated from
        the old positions to ``[new_start, ...)`` when ``rerotate``."""
        ...

    def store_rows(self, side_slot: int, pool_row: Any, kv_len: int, keep: int, end: int) -> None:
        """Rows ``[keep, end)`` of a request's committed K/V (``Committed``) into the same side rows."""
        ...

    def save_state(self, req: Req, side_slot: int) -> int:
        """The request's recurrent state into the side slot; returns the state slot copied."""
        ...

    def restore_state(self, req: Req, side_slot: int, checksums: bool) -> Restored:
        """The side slot's saved state over the request's own (the policy's approximation)."""
        ...

    def undo_restore(self, req: Req, restored: Restored) -> None:
        """The request's own state back, as ``restore_state`` found it."""
        ...


class EnginePort(KvSlots, RequestPrefix, StoredStates, Protocol):
    """The whole port a carrier is built over (``StepPolicy.step_carrier``)."""

    about: EngineFacts

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` for a log tag ("" when the engine has no tokenizer)."""
        ...

    def exchange(self, row: tuple[int, int]) -> list[tuple[int, int]]:
        """Every tensor-parallel rank's row, by rank (``policy.ranks``): one rank returns its own."""
        ...


# ---------------------------------------------------------------------- the carrier


class StepRecord(Protocol):
    """What a carrier reads and writes of the executor's record of a request
    (``patches.request_book.TrackedRequest``)."""

    plan: Plan  # the plan made at enqueue; its ``admission`` is the policy's, for its carrier
    tokens: tuple[int, ...]  # the prompt
    progress: Any  # the carrier's own state for the request (None: it has none)
    moved: int  # rows relocated into the prefix: the carrier adds each relocation's rows
    blocks: int  # relocations carried out


class StepCarrier(Protocol):
    """What the executor calls on a policy's carrier, one method per scheduling point. The
    executor calls it only for a request whose record has ``progress`` (set by ``armed``), except
    ``armed``, ``before_admission``, ``keeps_chunk``, ``retracted`` and ``forget``, which see
    every record it keeps; it contains every exception (the request is then read plainly, after
    ``undo``). A carrier orders the engine through its ``EnginePort`` only."""

    lines: ClassVar[ExecutorLines | None]  # the executor's log lines in the policy's words; None: its own

    def armed(self, req: Req, record: StepRecord) -> None:
        """At enqueue, the plan is on the record: set up ``record.progress``."""
        ...

    def before_round(self, req: Req, record: StepRecord, chunked_path: bool) -> None:
        """Before the engine's match (waiting queue) or its chunk stash (``chunked_path``)."""
        ...

    def after_round(self, req: Req, record: StepRecord, waiting_queue: bool, chunk_busy: bool) -> None:
        """After that match or stash: move the plan on (nothing once its steps are done).
        ``chunk_busy``: another request holds the engine's chunked-request slot."""
        ...

    def before_admission(self, req: Req, record: StepRecord, chunk_taken: bool) -> bool:
        """Before the engine tries to admit ``req`` to a round; True: its steps need the round's
        chunked-request slot. ``chunk_taken``: the round already has a chunked request."""
        ...

    def after_admission(self, req: Req, record: StepRecord, admitted: bool, needs_chunk: bool,
                        chunk_free: bool) -> bool:
        """After that admission pass (``needs_chunk``: ``before_admission``'s answer); True: make
        ``req`` the round's chunked request, and admit nothing else."""
        ...

    def not_admitted(self, req: Req, record: StepRecord) -> None:
        """A round another request's steps own passed ``req`` over."""
        ...

    def keeps_chunk(self, record: StepRecord, prefix_len: int) -> bool:
        """The request must stay the chunked request (its next step is not reached yet)."""
        ...

    def after_prefill(self, req: Req, record: StepRecord) -> None:
        """After each prefill forward of ``req``."""
        ...

    def retracted(self, req: Req, record: StepRecord) -> str | None:
        """The engine took ``req`` back and freed its rows (it is queued again): the reason for the
        event's ``fallback`` when steps were lost, else None."""
        ...

    def store(self, req: Req, record: StepRecord) -> None:
        """``req`` finished: keep what the policy keeps of it (before ``CachePolicy.release``)."""
        ...

    def forget(self, record: StepRecord) -> None:
        """The request left without a release (aborted while waiting, or gone at idle): give back
        what the carrier holds for it."""
        ...

    def undo(self, req: Req, record: StepRecord) -> None:
        """After a contained failure: no further step runs; leave the request readable plainly."""
        ...


class CarrierDefaults:
    """Do-nothing defaults of every ``StepCarrier`` method: a carrier overrides the points it needs."""

    lines: ClassVar[ExecutorLines | None] = None

    def armed(self, req: Req, record: StepRecord) -> None:
        return None

    def before_round(self, req: Req, record: StepRecord, chunked_path: bool) -> None:
        return None

    def after_round(self, req: Req, record: StepRecord, waiting_queue: bool, chunk_busy: bool) -> None:
        return None

    def before_admission(self, req: Req, record: StepRecord, chunk_taken: bool) -> bool:
        return False

    def after_admission(self, req: Req, record: StepRecord, admitted: bool, needs_chunk: bool,
                        chunk_free: bool) -> bool:
        return False

    def not_admitted(self, req: Req, record: StepRecord) -> None:
        return None

    def keeps_chunk(self, record: StepRecord, prefix_len: int) -> bool:
        return False

    def after_prefill(self, req: Req, record: StepRecord) -> None:
        return None

    def retracted(self, req: Req, record: StepRecord) -> str | None:
        return None

    def store(self, req: Req, record: StepRecord) -> None:
        return None

    def forget(self, record: StepRecord) -> None:
        return None

    def undo(self, req: Req, record: StepRecord) -> None:
        return None


# ---------------------------------------------------------------------- the policy


class StepPolicy(CachePolicy, Protocol):
    """A ``CachePolicy`` whose plans have ``Relocate``/``Restore`` steps (``plans_at = "enqueue"``):
    the ``enqueue`` hook set sizes its side stores, then builds its carrier over the engine port."""

    def side_stores(self, costs: StoreCosts) -> SideStores:
        """The side stores the policy's steps read from (``Relocate.slot``, ``Restore.slot``), for
        an engine whose rows cost ``costs``; called once per scheduler, before its carrier."""
        ...

    def step_carrier(self, engine: EnginePort, logger, leader: bool) -> StepCarrier:
        """The carrier of this scheduler (``leader``: the rank that writes logs)."""
        ...
