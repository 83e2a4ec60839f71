"""``ScrPolicy``: Suffix Cache Reuse behind the ``policy.api.CachePolicy`` seam.

SCR plans when a request enters the queue (``plans_at = "enqueue"``): ``plan`` admits it to its
conversation, diffs the previous prompt against the new one and answers with ``Read``,
``Relocate`` and ``Restore`` steps (``scr.execution.relocation_plan``), resuming wherever SGLang's
prefix match ends. It is a ``policy.carrier.StepPolicy``: it sizes its side buffer and state shadow
(``side_stores``), and the one executor carries the steps out with its step carrier
(``step_carrier``: ``scr.steps.ScrSteps``, the two-phase relocation driven by
``scr.cursor.RelocationCursor`` with the rules of ``scr.execution``). The carrier reads and
changes the session table only through the methods below (never ``policy.sessions`` directly),
so every change to a session is one of these calls. Pure Python: no SGLang, no torch.
"""
# Spec: docs/scr.md

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from policy.api import Arrival, Plan, PolicyDefaults, Release
from policy.carrier import EnginePort, SideStores, StepCarrier, StoreCosts
from policy.formats import quantized_kv_problem
from scr.execution import relocation_plan
from scr.intercept import Intercept, intercept
from scr.knobs import parse_request_knobs
from scr.kvreuse_env import resolve
from scr.sessions import Dropped, SessionTable, Store, request_identity
from scr.settings import ScrConfig


@dataclass(frozen=True)
class RelocationGuard:
    """The check before a relocation (§7.5 step 5): ``ok`` = the rows may be copied."""

    ok: bool
    ids_match: bool  # the stored token ids are the destination's
    owner: str | None  # who holds the pinned slot now (for the ``slot_stolen`` line)


class ScrPolicy(PolicyDefaults):
    """SCR's decisions; ``snapshot_budget`` stays the default 0 because SCR keeps its saved states in
    its own shadow (``patches/scr_tensors.py``), outside SGLang's Mamba pool."""

    name: ClassVar[str] = "scr"
    plans_at: ClassVar[str] = "enqueue"
    config_class: ClassVar[type] = ScrConfig

    def __init__(self, config: ScrConfig):
        self.config = config
        self.sessions = SessionTable(config)

    @staticmethod
    def config_from_settings(settings: Mapping[str, Any]) -> ScrConfig:
        """The launcher's entry (``policy.registry.resolve_config``): defaults < the authors'
        ``KVREUSE_*`` environment < ``--cache-policy-set`` (``settings``, parsed)."""
        return resolve(os.environ, settings)

    # ------------------------------------------------------------------ the seam

    def plan(self, arrival: Arrival) -> Plan:
        """At enqueue: ``admit`` the request, then its relocation plan (``admission``: the outcome).
        Raises ``scr.kvreuse_env.UnsupportedKnob`` (a ``policy.api.RequestRefused``) for a knob
        this port does not serve."""
        outcome = self.admit(arrival.tokens, arrival.cache_key, arrival.rid, arrival.session_id)
        return relocation_plan(arrival.rid, outcome, len(arrival.tokens))

    def side_stores(self, costs: StoreCosts) -> SideStores:
        """SCR's side buffer and state shadow (§5.4, ``scr.lines.stores_decision``) for an engine
        whose rows cost ``costs`` (a shadow only with ``ssm`` on a model with recurrent states)."""
        from scr.lines import stores_decision

        shadow = costs.state_bytes_per_slot if self.config.ssm else 0
        return stores_decision(self.config, costs.kv_bytes_per_token, shadow, costs.free_memory, costs.where,
                               on_gpu=costs.on_gpu, chunked_prefill_size=costs.chunked_prefill_size,
                               tp_size=costs.tp_size, pp_size=costs.pp_size,
                               mem_fraction_static=costs.mem_fraction_static)

    def step_carrier(self, engine: EnginePort, logger, leader: bool) -> StepCarrier:
        """``scr.steps.ScrSteps`` over the hook set's engine port."""
        from scr.steps import ScrSteps

        return ScrSteps(self, engine, logger, leader)

    def release(self, release: Release) -> None:
        return None

    def check(self) -> None:
        self.sessions.check()

    # ------------------------------------------------------------------ SCR's own decisions

    def admit(self, tokens: Sequence[int], cache_salt: str | None, rid: str = "",
              session_id: str | None = None) -> Intercept:
        """§4.2: attach a new request to its conversation and plan what to relocate.

        Raises ``scr.kvreuse_env.UnsupportedKnob`` (a ``ValueError``), before any session changes, when
        ``cache_salt`` asks for the single-phase path (§2.3 knobs ``pin``/``v6``/``lead``/``force``).
        It is not caught here: the scheduler glue fails that one request with the message, rather
        than serving it with full SCR, which the client did not ask for.
        """
        identity = request_identity(self.config.session_identity, rid, session_id)
        return intercept(self.sessions, tokens, parse_request_knobs(cache_salt), self.config, identity)

    def relocation_guard(self, outcome: Intercept, old_start: int, rows: int,
                         new_ids: Sequence[int]) -> RelocationGuard:
        """§7.5 step 5, made strict: the session must still hold the very side-slot acquisition the
        plan pinned (owner, slot and generation: a slot released and re-acquired since, by anyone,
        may hold another tenant's rows), and, with ``t6_guard``, the side rows
        ``[old_start, old_start + rows)`` must hold ``new_ids``. Pure."""
        sid, slot = outcome.sid, outcome.side_slot
        session = self.sessions.get(sid)
        pinned = self.sessions.holds(sid, slot, outcome.slot_generation)
        stored = tuple(session.side_ids[old_start:old_start + rows]) if session is not None else ()
        ids_match = stored == tuple(new_ids)
        ok = pinned and (ids_match or not outcome.config.t6_guard)
        return RelocationGuard(ok, ids_match, self.sessions.owner(slot))

    @property
    def num_free_slots(self) -> int:
        return len(self.sessions.free_slots)

    def snapshot_slot(self, sid: str) -> tuple[int | None, bool]:
        """A state snapshot of session ``sid`` is about to be written (§9.2): ``(slot, acquired)``,
        the shadow row to write (None: no slot free, skip it) and whether it was just taken.

        The session's saved state is marked missing first, so a copy that fails half-way leaves no
        snapshot that claims to be valid (``snapshot_taken`` records it once it is written)."""
        self.sessions.set_state_tokens(sid, -1)
        had_slot = self.sessions.get(sid).side_slot is not None
        slot = self.sessions.acquire_slot(sid)
        return slot, slot is not None and not had_slot

    def snapshot_taken(self, sid: str, n_tokens: int) -> None:
        """The snapshot of ``sid`` now covers the first ``n_tokens`` tokens (§9.2)."""
        self.sessions.set_state_tokens(sid, n_tokens)

    def drop_state(self, sid: str) -> None:
        """Forget the saved state of ``sid``: it no longer pairs with the session's K/V rows."""
        self.sessions.set_state_tokens(sid, -1)

    def store_turn(self, sid: str, committed: Sequence[int]) -> Store:
        """A request of ``sid`` ended holding the KV of ``committed``: which rows to copy (§5.2)."""
        return self.sessions.finish(sid, committed, store=True)

    def count_out(self, sid: str, if_present: bool = False) -> None:
        """A request of ``sid`` ended with nothing to store (no rows, or aborted on the queue);
        ``if_present``: the session may be gone already."""
        if not if_present or self.sessions.get(sid) is not None:
            self.sessions.finish(sid, (), store=False)

    def drop_private(self, sid: str) -> Dropped:
        """Give up the session's slot (its rows may be half written, §4.5)."""
        return self.sessions.drop_private(sid)

    # ------------------------------------------------------------------ server settings

    def server_settings(self) -> dict[str, object]:
        """SGLang settings the relocation relies on (the launcher adds or enforces them).

        One KV slot per token (relocated rows are placed row by row), and no overlap scheduling:
        the recurrent-state restore is a copy issued from the scheduler, which must not race the
        previous forward (``docs/scr.md`` §9.6; the authors leave overlap on).
        """
        return {"page_size": 1, "disable_overlap_schedule": True}

    def server_defaults(self) -> dict[str, object]:
        """Added only when the command line does not set them: the authors' ``serve.py`` turns on
        request logging (``Finish:`` lines, metadata only) so their report can read the log."""
        return {"log_requests": True, "log_requests_level": 0}

    def startup_problems(self, settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool) -> list[str]:
        """Settings SCR does not support (``docs/scr.md`` §10.1)."""
        problems = []
        if settings.get("disable_radix_cache"):
            problems.append("--disable-radix-cache: SCR runs phase 1 on the radix cache's prefix")
        chunk = settings.get("chunked_prefill_size")
        if chunk is None or chunk <= 0:
            problems.append("chunked prefill is off: the two-phase relocation needs --chunked-prefill-size > 0")
        if settings.get("enable_dp_attention"):
            problems.append("--enable-dp-attention: the ranks of one TP group would serve different requests, and "
                            "SCR keeps its ranks in step per TP group (unsupported; see docs/tensor_parallel.md)")
        if (settings.get("pp_size") or 1) > 1:
            problems.append("--pp-size > 1: relocation is untested with pipeline stages (see docs/tensor_parallel.md)")
        if settings.get("enable_hierarchical_cache"):
            problems.append("--enable-hierarchical-cache: plans would be consumed at enqueue (unsupported, as upstream)")
        if settings.get("speculative_algorithm"):
            problems.append("speculative decoding: relocated prefixes are untested with draft models")
        kv = quantized_kv_problem(settings, "SCR re-rotates relocated keys in the pool's dtype, so a quantized "
                                  "key would be rounded back to its format on every move and drift from a cold read")
        if kv:
            problems.append(kv)
        strategy = settings.get("mamba_radix_cache_strategy")
        if strategy in ("extra_buffer", "extra_buffer_lazy"):
            # SGLang resolves "auto" to no_buffer here (no overlap, page size 1); only an explicit flag gets here.
            problems.append(f"--mamba-radix-cache-strategy {strategy}: SCR's recurrent-state save and restore "
                            "(docs/scr.md §9.2, §9.4) have only been run with no_buffer, whose state slots it "
                            "copies; use --mamba-radix-cache-strategy no_buffer")
        return problems
