"""SCR's executor: what happens to each request, step by step, from enqueue to release.

``patches/scr_runtime.py`` turns SGLang's calls into calls of a ``Runner`` and is the ``Engine``
the runner drives: it answers questions about a request (prefix length, prompt, does it hold a
recurrent-state slot) and carries out orders (cut the token array, allocate slots, copy rows and
states, attach rows to the prefix, write the event). A request is an opaque handle here: only the
engine reads or changes it. The rules each step asks are ``scr.execution`` and ``scr.cursor``;
what is printed, ``scr.lines``. An exception inside any step is contained (``contain``): the
request falls back to a plain read, a line says why, and its event carries the reason. Under tensor
parallelism each tensor step ends with an exchange between the ranks (``on_every_rank``,
``policy.ranks``), so a step that fails on one rank ends in the same fallback on all of them.
"""
# Spec: docs/scr.md

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple, Protocol, Sequence

from policy.events import RequestEvent
from policy import ranks
from scr import lines
from scr.cursor import Relocation, phase1_step
from scr.execution import (Counters, RequestState, chunk_admission, evict_amount, evict_floor, new_cursor, plan_gate,
                           relocation_refusal, request_event, snapshot_at_prefill_end, state_at_release)
from scr.intercept import Intercept
from scr.kvreuse_env import UnsupportedKnob
from scr.policy import ScrPolicy
from serving import faults
from serving.request_book import check_invariants, forget_stale

STALE_LOG = "scr: dropped state of %d request(s) the idle scheduler no longer has: %s"
# One line per contained failure; ``step`` names the SCR step, ``outcome`` what the request got.
FALLBACK_LOG = "[kvreuse] scr fallback: rid=%s step=%s outcome=%s reason=%s"


class RequestFacts(NamedTuple):
    """What the runner reads of a request, as the engine has it now."""

    prompt: Sequence[int]
    prefix_len: int  # tokens in place (tree match, read, relocated)
    full_len: int  # prompt + output tokens
    extend_end: int | None  # where this round's read ends
    finished: bool
    has_state_slot: bool  # the request holds a slot of the recurrent-state pool


class Engine(Protocol):
    """What the runner needs from the serving engine (``req``: the engine's request object)."""

    has_state_pool: bool  # the model has recurrent layers (a state pool)
    has_shadow: bool  # SCR keeps a state shadow (``ssm`` on, on a hybrid model)
    pool_size: int  # KV slots in the engine's pool

    def facts(self, req) -> RequestFacts: ...
    def committed(self, req) -> tuple[int, Sequence[int], Any] | None: ...  # (kv_len, tokens, pool row); None: no rows
    def advance_prefix(self, req) -> None: ...  # the prefix covers what the last chunk read
    def cut(self, req, end: int) -> None: ...  # this round reads up to ``end``
    def uncut(self, req) -> None: ...  # the token array gets its full length back
    def attach(self, req, slots, rows: int, outside_tree: bool) -> None: ...
    def detach(self, req, prefix_len: int, rows: int) -> None: ...  # undo ``attach``
    def include_in_tree(self, req) -> None: ...  # the engine may cache the request again
    def alloc(self, rows: int) -> Any: ...  # fresh KV slots, or None
    def free(self, slots) -> None: ...
    def available(self) -> int: ...
    def evictable(self) -> int: ...
    def evict(self, tokens: int) -> None: ...
    def place(self, side_slot: int, old_start: int, new_start: int, slots, rerotate: bool) -> None: ...
    def restore_state(self, req, side_slot: int, sid: str) -> Any: ...  # returns what undo_restore needs
    def undo_restore(self, req, kept) -> None: ...  # the state and staged copy restore_state found
    def save_state(self, req, side_slot: int) -> int: ...  # returns the state slot copied
    def store_rows(self, side_slot: int, pool_row, kv_len: int, keep: int, end: int) -> None: ...
    def event_facts(self, req) -> dict | None: ...  # None: no events file
    def write_event(self, event: RequestEvent) -> None: ...
    def decode(self, tokens: Sequence[int]) -> str: ...
    def exchange(self, row: tuple[int, int]) -> list[tuple[int, int]]: ...  # every TP rank's row, by rank


class Runner:
    """Per-request plan state of one scheduler (one ``RequestState`` per rid, released in
    ``release``; ``idle`` drops what the idle scheduler no longer has, logged)."""

    def __init__(self, policy: ScrPolicy, engine: Engine, logger, leader: bool):
        self.policy, self.config, self.engine = policy, policy.config, engine
        self.logger, self.leader = logger, leader
        self.requests: dict[str, RequestState] = {}
        self.counters = Counters()

    def say(self, line: str, debug: bool = False) -> None:
        if self.leader and (self.config.debug or not debug):
            self.logger.info(line)

    def trace(self, ev: str, **fields) -> None:
        if self.config.trace:
            self.say(lines.format_line("trace", ev=ev, fields=fields))

    def _trace_dropped(self, dropped) -> None:
        self.trace("drop_private", sid=dropped.sid, slot=dropped.side_slot, n_side=dropped.n_side)
        if dropped.side_slot is not None:
            self.trace("side_rel", slot=dropped.side_slot, sid=dropped.sid)

    def contain(self, step: str, rid: str | None, req, state: RequestState | None, fn, *args):
        """Run one SCR step; an exception ends in a plain read of this request, never a dead scheduler.

        The engine's own code is never run in here (its AROUND hooks call ``original`` outside), so
        only failures of the policy are caught. The request keeps what is still correct (rows
        relocated before the failing step, when the forward after them already ran) and reads the rest."""
        try:
            return fn(*args)
        except ranks.RanksDisagree:
            raise  # the ranks' decisions diverged: no fallback can make them agree again
        except Exception as exc:  # noqa: BLE001 - containment is the point
            self.logger.exception("[kvreuse] scr step %s failed for rid=%s", step, rid)
            if state is not None:
                state.fallback = state.fallback or f"{step}: {type(exc).__name__}: {exc}"
                state.stop_plan()
                if state.direct is not None:
                    self.undo_direct(req, state, replan=False)
                if state.cut and not self.engine.facts(req).finished:
                    self.engine.uncut(req)
                state.cut = False
                self.logger.error(FALLBACK_LOG, rid, step, "plain_read", state.fallback)
            return None

    def on_every_rank(self, step: str, rid: str, fn, *args, undo=None):
        """One tensor step on this rank's shard (``scr.<step>`` is its fault-injection point), then
        the ranks' exchange: every rank learns whether any rank failed the step, and all raise (their
        own error, or ``PeerFailed`` after ``undo(result)`` of the step that succeeded here) so they
        take the same fallback. One rank: no collective. An exchange that fails is not contained."""
        error = result = None
        try:
            faults.check(f"scr.{step}", rid)
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - raised below, once every rank knows
            error = exc
        try:
            rows = self.engine.exchange(ranks.own_row(step, rid, error is not None))
        except Exception as exc:
            raise ranks.ExchangeFailed(f"TP exchange at step {step} of rid={rid} failed: {exc}") from exc
        failed = ranks.failed_ranks(rows, step, rid)
        if error is not None:
            raise error
        if failed:
            if undo is not None:
                undo(result)
            raise ranks.peer_failure(step, failed)
        return result

    # ------------------------------------------------------------------ enqueue (§4.2)

    def admit(self, req, rid: str, tokens: tuple[int, ...], cache_salt: str | None,
              session_id: str | None = None) -> str | None:
        """H7: admit a new request to its session and, for a plan, arm its cursor. Returns the
        message to refuse the request with (a per-request knob this port cannot serve), or None."""
        if rid in self.requests:
            return None
        try:
            outcome = self.policy.admit(tokens, cache_salt, rid, session_id)
        except UnsupportedKnob as exc:
            return f"cache_salt: {exc}"  # the client gets a 400 naming it
        except Exception as exc:  # noqa: BLE001 - a failed admission serves the request plainly
            self.logger.exception("[kvreuse] scr admission failed for rid=%s", rid)
            self.requests[rid] = RequestState(rid, None, Intercept("off", self.config), time.time(),
                                              fallback=f"admit: {exc}")
            return None
        state = self.requests[rid] = RequestState(rid, outcome.sid, outcome, time.time())
        self.contain("plan", rid, req, state, self._arm_plan, state, outcome, tokens)
        return None

    def _arm_plan(self, state: RequestState, outcome: Intercept, tokens) -> None:
        if outcome.admission is None:
            return
        if self.config.trace:  # the tag decodes tokens: not worth it for a line nobody prints
            self.say(lines.trace_request(state.rid, outcome, len(tokens), self.engine.decode(tokens[:48])))
        for dropped in outcome.admission.evicted:
            self._trace_dropped(dropped)
        if outcome.kind == "passthrough":
            self.say(lines.format_line("passthrough", sid=outcome.sid, kept=outcome.kept, deleted=outcome.deleted,
                                       inserted=outcome.inserted), debug=True)
        if outcome.kind != "plan":
            return
        state.gate = plan_gate(outcome, self.engine.has_state_pool, self.engine.has_shadow)
        state.cursor = new_cursor(state)
        if len(outcome.blocks) > 1:
            self.say(lines.multiblock_plan(state.rid, outcome, len(tokens)), debug=True)

    # ------------------------------------------------------------------ each round (§7.2-§7.5)

    def before_round(self, req, rid: str, chunked_path: bool) -> None:
        """H10, before the engine's chunk stash (``chunked_path``) or its match: the stash leaves the
        prefix of a request kept out of the tree at the previous chunk's start; move it on."""
        state = self.requests.get(rid)
        if state is not None and state.outside_tree and chunked_path:
            self.contain("advance_prefix", rid, req, state, self.engine.advance_prefix, req)

    def after_round(self, req, rid: str, waiting_queue: bool, chunk_busy: bool) -> None:
        """H10, after the engine's match (``waiting_queue``) or its chunk stash: move the plan on.
        ``chunk_busy``: another request is the engine's chunked request."""
        state = self.requests.get(rid)
        if state is not None and state.cursor is not None:
            self.contain("round", rid, req, state, self._round, req, state, waiting_queue, chunk_busy)

    def _round(self, req, state: RequestState, waiting_queue: bool, chunk_busy: bool) -> None:
        faults.check("scr.round", state.rid)
        facts = self.engine.facts(req)
        prefix = facts.prefix_len
        if not state.phase1:
            if waiting_queue:
                self._decide(req, state, facts, chunk_busy)
            return
        via = "waiting queue" if waiting_queue else "chunked path"
        action, detail = phase1_step(state.cursor, prefix, waiting_queue)
        if action == "read":
            self._cut(req, state, state.cursor.stop)
            self.say(f"[kvreuse] kv6 rid={state.rid} phase1 re-entry ({via}): prefix={prefix} "
                     f"stop={state.cursor.stop}", debug=True)
        elif action == "abort":
            self.abort(req, state, detail)
        else:
            self._relocate(req, state, detail, facts)

    def _decide(self, req, state: RequestState, facts: RequestFacts, chunk_busy: bool) -> None:
        """§7.2 at a waiting-queue pass, after the engine's own prefix match."""
        cursor, radix_n0 = state.cursor, facts.prefix_len
        decision = cursor.decide(radix_n0, chunk_busy, state.gate.allow)
        if decision.action == "retry":
            self.say(lines.format_line("deferred_retry", rid=state.rid, attempt=cursor.retries,
                                       max_attempts=cursor.max_retries))
        elif decision.action in ("drop", "gated"):
            reason = decision.reason or f"ssm gate: {state.gate.reason}"
            self.say(f"[kvreuse] kv6 rid={state.rid} plan not run ({decision.action}: {reason})", debug=True)
            state.cursor = None
        elif decision.action == "relocate_now":
            # The radix match ends exactly at the first stop: relocate before admission (§7.2 step 8).
            state.radix_n0 = radix_n0
            self._relocate(req, state, cursor.at_prefix(radix_n0), facts, direct=True)
        else:
            state.phase1, state.radix_n0 = True, radix_n0
            self._cut(req, state, cursor.stop)
            self.say(lines.phase1(state.rid, state, len(facts.prompt), self.engine.has_state_pool,
                                  self.engine.has_shadow))

    def _cut(self, req, state: RequestState, end: int) -> None:
        """The request ends at ``end`` this round (the engine rebuilds the full array at the next)."""
        self.engine.cut(req, end)
        state.cut = True

    def _read_rest(self, req, state: RequestState) -> None:
        """Stop the plan; a token array cut at a stop gets its full length back."""
        state.stop_plan()
        if state.cut:
            self.engine.uncut(req)
        state.cut = False

    def abort(self, req, state: RequestState, reason: str, restore_lengths: bool = False) -> None:
        """§10.2: phase 1 gives up; the rest is read with the request's own state (block 1's restore
        is only armed inside its relocation, so before it the own state covers everything before
        the stop). A cut array keeps its cut for this round unless ``restore_lengths``."""
        if restore_lengths:
            self.engine.uncut(req)
            state.cut = False
        state.stop_plan()
        self.counters.aborts += 1
        self.say(lines.format_line("phase1_aborted", reason=reason, aborts=self.counters.aborts))

    def _relocate(self, req, state: RequestState, relocation: Relocation, facts: RequestFacts,
                  direct: bool = False) -> None:
        """§7.5: relocate one block's rows to the end of the prefix, then arm the next block.

        ``direct``: on the waiting queue, before admission (undone if the request is not admitted
        this round). Copies and the restore come before the slots are attached, so a failure leaves
        the request exactly as phase 1 left it (a plain read of the rest is exact). The restore's
        checks run with the row copy, before any rank overwrites its state; a state copy that fails
        on another rank is undone here, so every rank reads the rest from its own state."""
        block, prefix, slot = relocation.block, facts.prefix_len, state.outcome.side_slot
        n, full_len = block.num_rows, facts.full_len
        reason = relocation_refusal(n, slot, full_len, prefix, relocation.arm_restore,
                                    self.engine.has_shadow and facts.has_state_slot)
        if reason is None and not self._guard(state, block.old_start, facts.prompt[prefix:prefix + n]):
            reason = "side slot guard"
        slots = self._alloc(n) if reason is None else None
        if reason is None and slots is None:
            self.say(lines.format_line("alloc_failed", n=n))
            reason = "allocation failed"
        if reason is not None:
            self.say(f"[kvreuse] kv6 rid={state.rid} block {state.cursor.index + 1} not spliced ({reason}) "
                     "-> normal prefill of the tail", debug=True)
            return self._read_rest(req, state)
        try:
            self.on_every_rank("place_rows", state.rid, self._place, state, slot, block.old_start, prefix, slots,
                               relocation.arm_restore)
            if relocation.arm_restore:
                self.on_every_rank("restore_copy", state.rid, self.engine.restore_state, req, slot, state.sid,
                                   undo=partial(self.engine.undo_restore, req))
        except Exception as exc:
            self.logger.error("[kvreuse] v6 splice failed (%s); freeing %d slots", exc, n)
            self.engine.free(slots)
            raise
        self._attach(req, state, slots, n, direct)
        for line in lines.relocated(state.rid, state, relocation, prefix, full_len, self.counters):
            self._emit(state, line)
        self._next_block(req, state, prefix + n)

    def _place(self, state: RequestState, slot: int, old_start: int, new_start: int, slots, restore: bool) -> None:
        self.engine.place(slot, old_start, new_start, slots, rerotate=not state.outcome.config.no_rerotate)
        if restore:
            faults.check("scr.restore_state", state.rid)

    def _guard(self, state: RequestState, old_start: int, new_ids: Sequence[int]) -> bool:
        n = len(new_ids)
        guard = self.policy.relocation_guard(state.outcome, old_start, n, new_ids)
        if not guard.ok:
            self.counters.stolen += 1
            self.say(lines.slot_stolen(state.rid, state, old_start, n, guard.owner, guard.ids_match,
                                       self.counters.stolen))
        return guard.ok

    def _alloc(self, n: int):
        """Fresh KV slots, with the authors' evict-then-retry once (§10.3)."""
        slots = self.engine.alloc(n)
        if slots is not None or not self.config.evict_on_alloc_fail:
            return slots
        avail, evictable = self.engine.available(), self.engine.evictable()
        floor = evict_floor(self.engine.pool_size, self.config.evict_floor_frac)
        wanted = evict_amount(n, avail, evictable, floor, self.config.evict_margin)
        if wanted is None:
            self.say(lines.format_line("evict_declined", avail=avail, evictable=evictable, need=n, floor=floor))
            return None
        self.engine.evict(wanted)
        evicted = self.engine.available() - avail
        slots = self.engine.alloc(n)
        counts = self.counters
        counts.evict_retries += 1
        counts.evict_retries_ok += slots is not None
        self.say(lines.format_line("evict_retry", requested=wanted, evicted=evicted, retry="OK" if slots is not None
                                   else "FAIL", ok=counts.evict_retries_ok, total=counts.evict_retries))
        return slots

    def _attach(self, req, state: RequestState, slots, n: int, direct: bool) -> None:
        """Append the filled slots to the request's prefix (§7.5 step 7)."""
        outside_tree = not state.outcome.config.relocated_in_tree
        self.engine.attach(req, slots, n, outside_tree)
        state.outside_tree = state.outside_tree or outside_tree
        state.moved += n
        state.blocks += 1
        self.counters.relocated(n)
        if direct:
            state.direct = (slots, n)

    def _emit(self, state: RequestState, line: str) -> None:
        """Log a relocation line now, or, for one made on the waiting queue, once the request is
        admitted: an undone relocation must leave no line (the accounting sums them)."""
        if state.direct is None:
            self.say(line)
        else:
            state.held_lines = [*(state.held_lines or []), line]

    def _next_block(self, req, state: RequestState, prefix: int) -> None:
        """§7.5 step 9: cut at the next block's stop and stay in phase 1 (a forced middle chunk, so
        nothing is sampled there, also after a relocation on the waiting queue), or read the rest."""
        num_blocks = len(state.cursor.blocks)
        following = state.cursor.after_relocation()
        if following.stop is not None:
            self._cut(req, state, following.stop)
            state.phase1 = True
            return self._emit(state, lines.next_block(state.rid, following, num_blocks, prefix))
        if following.abandoned:
            self.say(lines.next_block(state.rid, following, num_blocks, prefix))
        self._read_rest(req, state)

    def undo_direct(self, req, state: RequestState, replan: bool = True) -> None:
        """A relocation made on the waiting queue, and the request waits another round: return the
        slots, plan again at its next pass. Everything the relocation set is undone: prefix, cached
        count, tree exclusion, a cut at a second stop."""
        slots, n = state.direct
        state.held_lines = None
        self.engine.free(slots)
        self.engine.detach(req, state.radix_n0, n)
        state.direct, state.outside_tree = None, False
        self._read_rest(req, state)
        state.moved -= n
        state.blocks -= 1
        self.counters.relocated(n, sign=-1)
        state.cursor = new_cursor(state) if replan else None
        self.say(f"[kvreuse] kv6 rid={state.rid} direct splice undone (not admitted this round)", debug=True)

    # ------------------------------------------------------------------ admission to a round (§7.3)

    def not_admitted(self, req, rid: str) -> None:
        """H8, a round that belongs to a phase-1 request: ``req`` waits, and a relocation it made on
        the waiting queue gives its slots back."""
        state = self.requests.get(rid)
        if state is not None and state.direct is not None:
            self.contain("undo_direct", rid, req, state, self.undo_direct, req, state)

    def before_admission(self, req, rid: str, chunk_taken: bool) -> bool:
        """H8, before the engine tries to admit ``req``: True when it is in phase 1 (it must become
        the round's chunked request). ``chunk_taken``: the round already has a chunked request."""
        state = self.requests.get(rid)
        in_phase1 = state is not None and state.cursor is not None and state.phase1
        if in_phase1 and chunk_taken:
            self.abort(req, state, "another request is already chunked", restore_lengths=True)
            return False
        return in_phase1

    def after_admission(self, req, rid: str, admitted: bool, in_phase1: bool, chunk_free: bool) -> bool:
        """After the engine's admission pass over ``req`` (``in_phase1``: ``before_admission``'s answer;
        ``chunk_free``: the round has no other chunked request). A relocation made on the waiting
        queue stays (its lines are logged now) or, for a request not admitted, is undone. True = make
        the admitted phase-1 request the round's chunked request; else its plan is aborted (§7.3)."""
        state = self.requests.get(rid)
        if state is None:
            return False
        return bool(self.contain("admit_round", rid, req, state, self._after_admission, req, state, admitted,
                                 in_phase1, chunk_free))

    def _after_admission(self, req, state: RequestState, admitted: bool, in_phase1: bool, chunk_free: bool) -> bool:
        if state.direct is not None:
            if not admitted:
                self.undo_direct(req, state)
                return False
            state.direct = None
            for line in state.held_lines or ():
                self.say(line)
            state.held_lines = None
        if not (in_phase1 and admitted and state.cursor is not None):
            return False
        reason = chunk_admission(self.engine.facts(req).extend_end, state.cursor.stop, chunk_free)
        if reason is not None:
            self.abort(req, state, reason)
        return reason is None

    def keeps_chunk(self, rid: str, prefix_len: int) -> bool:
        """H9: ``RequestState.keeps_chunk`` of ``rid`` (False for a request without SCR state)."""
        state = self.requests.get(rid)
        return state is not None and state.keeps_chunk(prefix_len)

    # ------------------------------------------------------------------ recurrent state (§9)

    def after_prefill(self, req, rid: str) -> None:
        """H4: the state snapshot at prefill end (§9.2)."""
        state = self.requests.get(rid)
        if state is None:
            return
        facts = self.engine.facts(req)
        if snapshot_at_prefill_end(self.config, self.engine.has_shadow, state, facts.finished, facts.has_state_slot):
            self.contain("save_state", rid, req, state, self._save_state, req, state, facts.extend_end)

    def _save_state(self, req, state: RequestState, n_tokens: int) -> None:
        """§9.2: the request's recurrent state -> the shadow row of its session's side slot."""
        slot, acquired = self.policy.snapshot_slot(state.sid)
        if slot is None:
            return
        if acquired:
            self.trace("side_acq", slot=slot, sid=state.sid, free=self.policy.num_free_slots)
        index = self.on_every_rank("save_state", state.rid, self.engine.save_state, req, slot)
        self.policy.snapshot_taken(state.sid, n_tokens)
        state.state_saved = True
        self.trace("ssm_save", rid=state.rid, sid=state.sid, slot=slot, midx=index, n=n_tokens)

    # ------------------------------------------------------------------ the request leaves

    def release(self, req, rid: str, finished: bool) -> None:
        """H2: store the turn's rows in the side buffer, write the request's event. A request released
        unfinished was retracted or preempted: the engine freed every row of it, relocated ones too,
        and queues it again; it is read again without relocation, and released again at its end."""
        state = self.requests.get(rid)
        if state is None:
            return
        if not finished:
            state.retracted()
            self.engine.include_in_tree(req)
            self.logger.warning(FALLBACK_LOG, state.rid, "retract", "plain_read", "retracted or preempted")
            return
        del self.requests[state.rid]
        if state.sid is not None:
            self.contain("store", state.rid, req, state, self._store, req, state)
        self.contain("event", state.rid, req, None, self._write_event, req, state)

    def _store(self, req, state: RequestState) -> None:
        """§5.2: copy the rows that changed into the session's side slot (or drop the session).
        A failure while copying drops the session's private data (its slot may be half written)."""
        committed = self.engine.committed(req)
        if committed is None:
            return self.policy.count_out(state.sid)
        kv_len, tokens, pool_row = committed
        store = self.policy.store_turn(state.sid, tokens)
        if store.slot is not None:
            if store.acquired:
                self.trace("side_acq", slot=store.slot, sid=state.sid, free=self.policy.num_free_slots)
            if store.end > store.keep:
                try:
                    self.on_every_rank("side_store", state.rid, self.engine.store_rows, store.slot, pool_row, kv_len,
                                       store.keep, store.end)
                except Exception:
                    self._trace_dropped(self.policy.drop_private(state.sid))
                    raise
            self.trace("snap", sid=state.sid, slot=store.slot, keep=store.keep, n=store.end, prev=store.prev)
        if store.dropped is not None:
            self.say(f"[kvreuse] {state.sid} side store skipped ({store.reason})", debug=True)
            self._trace_dropped(store.dropped)
        action = state_at_release(state.outcome.config, self.engine.has_shadow, store.slot is not None,
                                  self.engine.facts(req).has_state_slot, state.state_saved)
        if action == "save":
            self._save_state(req, state, kv_len)
        elif action == "drop":
            self.policy.drop_state(state.sid)
            self.say(lines.format_line("ssm_dropped", rid=state.rid, sid=state.sid))

    def _write_event(self, req, state: RequestState) -> None:
        facts = self.engine.event_facts(req)
        if facts is not None:
            self.engine.write_event(request_event(state, self.policy.name, time.time(), **facts))

    def forget(self, rid: str) -> None:
        """A request popped from the waiting queue by an abort never reaches release: count it out
        of its session (nothing stored, no event: it read nothing), give back a relocation made on
        the waiting queue."""
        state = self.requests.pop(rid, None)
        if state is not None and state.direct is not None:
            self.engine.free(state.direct[0])
        if state is not None and state.sid is not None:
            self.contain("abort", None, None, None, self.policy.count_out, state.sid, True)

    def idle(self) -> None:
        """The engine is idle: drop requests it no longer has (aborted before admission), then check."""
        for state in forget_stale(self.requests, self.logger, STALE_LOG):
            if state.sid is not None:
                self.policy.count_out(state.sid, if_present=True)
        check_invariants(self.policy, self.logger, "[kvreuse] scr invariant check failed")
