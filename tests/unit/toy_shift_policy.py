"""A toy policy that relocates, written by following docs/ARCHITECTURE.md "How to add a policy"
(the ``"enqueue"`` way of planning), and nothing else: when a prompt drops ``offset`` tokens right
after the part the tree holds, the rows after the gap move ``offset`` positions back, keys
re-rotated (the rotary rule), instead of being read again.

It keeps one side slot: the K/V rows of the last request it stored (``ShiftSteps.store``), and
their tokens. A later prompt of the same cache key whose tokens at ``[at, at + rows)`` equal the
stored ones at ``[at + offset, ...)`` (``at``: where the two prompts first differ) is planned
``Read [0, at)`` (served by the tree), ``Relocate`` those rows from the side slot, ``Read`` the rest.
Its carrier relocates on the waiting queue, once the tree's match ends exactly at ``at``, and gives
the slots back if the request is not admitted that round; any other match reads the prompt
plainly. Pure Python over ``policy/`` only; registered only by its tests
(``tests/unit/test_toy_policy.py``, ``tests/integration/test_toy_shift_policy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from policy.api import Admission, Arrival, Plan, PolicyDefaults, Read, Release, Relocate
from policy.carrier import CarrierDefaults, EnginePort, SideStores, StepCarrier, StoreCosts

SLOT = 0  # the one side slot


@dataclass(frozen=True)
class ShiftConfig:
    offset: int = 4  # tokens a prompt drops after the part the tree holds
    min_rows: int = 8  # fewer rows are read, not moved
    side_tokens: int = 256  # rows the side slot holds

    def __post_init__(self):
        if self.offset <= 0 or self.min_rows <= 0 or self.side_tokens <= 0:
            raise ValueError(f"offset, min_rows and side_tokens must be positive, got {self}")


@dataclass(frozen=True)
class ShiftAdmission(Admission):
    """``kind``: ``relocate`` or ``read``; the request's cache key (its rows are stored under it)."""

    cache_key: str | None = None


class ShiftPolicy(PolicyDefaults):
    name: ClassVar[str] = "shift"
    plans_at: ClassVar[str] = "enqueue"

    def __init__(self, config: ShiftConfig):
        self.config = config
        self.stored: tuple[int, ...] = ()  # the tokens whose rows the side slot holds
        self.stored_key: str | None = None

    def plan(self, arrival: Arrival) -> Plan:
        tokens, old, offset = arrival.tokens, self.stored, self.config.offset
        admission = ShiftAdmission("read", arrival.cache_key)
        read_all = Plan(arrival.rid, 0, (Read(0, len(tokens)),), resume_limit=len(tokens), admission=admission)
        if arrival.cache_key != self.stored_key:
            return read_all
        at = next((i for i, (a, b) in enumerate(zip(tokens, old)) if a != b), min(len(tokens), len(old)))
        rows = 0
        while (at + rows < len(tokens) - 1 and at + offset + rows < len(old)
               and tokens[at + rows] == old[at + offset + rows]):
            rows += 1
        if rows < self.config.min_rows:
            return read_all
        steps = ((Read(0, at),) if at else ()) + (Relocate(at, rows, at + offset, SLOT), Read(at + rows, len(tokens)))
        return Plan(arrival.rid, 0, steps, resume_limit=at, admission=ShiftAdmission("relocate", arrival.cache_key))

    def holds(self, source: int, ids) -> bool:
        """The side slot still holds ``ids`` at ``[source, ...)`` (a later store may have replaced them)."""
        return tuple(self.stored[source:source + len(ids)]) == tuple(ids)

    def kept(self, tokens, cache_key: str | None) -> None:
        self.stored, self.stored_key = tuple(tokens), cache_key

    def side_stores(self, costs: StoreCosts) -> SideStores:
        size = self.config.side_tokens
        return SideStores(1, size, states=False, allocate=True, problem=None,
                          line=f"shift: one side slot of {size} rows, {size * costs.kv_bytes_per_token} bytes")

    def step_carrier(self, engine: EnginePort, logger, leader: bool) -> StepCarrier:
        return ShiftSteps(self, engine)

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        assert len(self.stored) <= self.config.side_tokens


@dataclass
class Progress:
    step: Relocate | None  # still to carry out
    slots: object = None  # relocated on the waiting queue, the request not yet admitted


class ShiftSteps(CarrierDefaults):
    def __init__(self, policy: ShiftPolicy, engine: EnginePort):
        self.policy, self.engine = policy, engine

    def armed(self, req, record) -> None:
        relocations = record.plan.relocations()
        record.progress = Progress(relocations[0][0] if relocations else None)

    def after_round(self, req, record, waiting_queue: bool, chunk_busy: bool) -> None:
        progress = record.progress
        step = progress.step
        if step is None or not waiting_queue or progress.slots is not None:
            return
        facts = self.engine.facts(req)
        ids = facts.prompt[step.at:step.end]
        slots = None
        if facts.prefix_len == step.at and self.policy.holds(step.source, ids):
            slots = self.engine.alloc(step.rows)
        if slots is None:
            progress.step = None  # read the rest plainly
            return
        try:
            self.engine.place(step.slot, step.source, step.at, slots, rerotate=True)
        except Exception:
            self.engine.free(slots)
            raise
        self.engine.attach(req, slots, step.rows, outside_tree=True)
        progress.slots = slots
        record.moved, record.blocks = record.moved + step.rows, record.blocks + 1

    def after_admission(self, req, record, admitted: bool, needs_chunk: bool, chunk_free: bool) -> bool:
        progress = record.progress
        if progress.slots is not None:
            if admitted:  # the rows are the request's now
                progress.step, progress.slots = None, None
            else:
                self._give_back(req, record)
        return False

    def not_admitted(self, req, record) -> None:
        if record.progress.slots is not None:
            self._give_back(req, record)

    def _give_back(self, req, record) -> None:
        """A relocation made on the waiting queue, and the request waits: free the slots; the next
        pass relocates again."""
        progress, step = record.progress, record.progress.step
        self.engine.free(progress.slots)
        self.engine.detach(req, step.at, step.rows)
        progress.slots = None
        record.moved, record.blocks = record.moved - step.rows, record.blocks - 1

    def retracted(self, req, record) -> str | None:
        if record.progress is not None:  # the engine freed every row, moved ones too
            record.progress.step = record.progress.slots = None
        self.engine.include_in_tree(req)
        return "retracted: read again without relocation" if record.moved else None

    def store(self, req, record) -> None:
        committed = self.engine.committed(req)
        if committed is None:
            return
        end = min(committed.kv_len, self.policy.config.side_tokens)
        self.policy.kept((), None)  # a copy that fails half-way leaves rows no plan may read
        self.engine.store_rows(SLOT, committed.pool_row, committed.kv_len, 0, end)
        self.policy.kept(committed.tokens[:end], record.plan.admission.cache_key)

    def forget(self, record) -> None:
        if record.progress is not None and record.progress.slots is not None:
            self.engine.free(record.progress.slots)

    def undo(self, req, record) -> None:
        if record.progress.slots is not None:
            self._give_back(req, record)
        record.progress.step = None
