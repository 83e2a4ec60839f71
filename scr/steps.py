"""SCR's step carrier: how the ``Relocate`` and ``Restore`` steps of SCR's plan, and its
side-buffer stores, are carried out while SGLang reads a request.

The one executor (``patches/executor.py``) owns every request's record, containment, events,
aborts, retraction and the idle check; for a policy whose plan has engine-time steps it asks the
policy for a carrier (``ScrPolicy.step_carrier``) and calls it at the points below, with the
request's record (``patches.request_book.TrackedRequest``, SCR's progress in ``record.progress``).
It implements ``policy.carrier.StepCarrier``: the executor calls nothing else of it. The carrier
decides with the pure rules of ``scr.execution`` and ``scr.cursor`` and has the engine port
(``policy.carrier.EnginePort``, implemented on SGLang by ``patches/scr_runtime.py``) carry the
orders out: cut the token array, allocate slots, copy rows and states, attach rows to the prefix.
What is printed is ``scr.lines``. A step raises on failure; the executor contains it and calls
``undo``.
Under tensor parallelism each tensor step ends with an exchange between the ranks
(``on_every_rank``, ``policy.ranks``), so a step that fails on one rank fails on all of them.
"""
# Spec: docs/scr.md

from __future__ import annotations

from functools import partial
from typing import Sequence

from policy import ranks
from policy.carrier import EnginePort, RequestFacts, Restored
from scr import lines
from scr.cursor import Relocation, phase1_step
from scr.execution import (Counters, RelocationProgress, chunk_admission, evict_amount, evict_floor, new_cursor,
                           plan_gate, relocation_refusal, snapshot_at_prefill_end, state_at_release)
from policy import faults


class ScrSteps:
    """Carries out SCR's steps for one scheduler; holds no request of its own (the executor's
    records carry each request's ``RelocationProgress``), only the scheduler-wide counters."""

    lines = lines.EXECUTOR_LINES  # the executor logs its lines for SCR in the authors' words

    def __init__(self, policy, engine: EnginePort, logger, leader: bool):
        self.policy, self.config, self.engine = policy, policy.config, engine
        self.logger, self.leader = logger, leader
        self.counters = Counters()
        about = self.about = engine.about
        # The start-up lines, in the authors' order, once the engine's stores and pools exist.
        for line in lines.startup_lines(
                self.config, about.version, about.pid, about.environ, bytes_per_token=about.side_bytes_per_token,
                shadow_gib=about.shadow_bytes / 2**30 if about.shadow else None, layers=list(about.layers),
                rotary=about.rotary, pool_slots=about.pool_slots):
            self.say(line)

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

    def undo(self, req, record) -> None:
        """After a contained failure: no further step runs, a relocation made on the waiting queue
        is given back, a cut token array gets its full length. The request keeps what is still
        correct (rows relocated before the failing step, when the forward after them already ran)
        and reads the rest."""
        progress = record.progress
        if progress is None:
            return
        progress.stop_plan()
        if progress.direct is not None:
            self.undo_direct(req, record, replan=False)
        if progress.cut and not self.engine.facts(req).finished:
            self.engine.cut(req, None)
        progress.cut = False

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

    def armed(self, req, record) -> None:
        """H7: the plan ``ScrPolicy.plan`` made at enqueue is on the record; set up its progress."""
        plan = record.plan
        outcome = plan.admission
        rid, tokens = plan.rid, record.tokens
        progress = record.progress = RelocationProgress(outcome.sid, outcome)
        if outcome.admission is None:
            return
        if self.config.trace:  # the tag decodes tokens: not worth it for a line nobody prints
            self.say(lines.trace_request(rid, outcome, len(tokens), self.engine.decode(tokens[:48])))
        for dropped in outcome.admission.evicted:
            self._trace_dropped(dropped)
        if outcome.kind == "passthrough":
            self.say(lines.format_line("passthrough", sid=outcome.sid, kept=outcome.kept, deleted=outcome.deleted,
                                       inserted=outcome.inserted), debug=True)
        if not plan.relocations():
            return
        progress.gate = plan_gate(outcome, self.about.state_pool, self.about.shadow)
        progress.cursor = new_cursor(progress, plan)
        if len(outcome.blocks) > 1:
            self.say(lines.multiblock_plan(rid, outcome, len(tokens)), debug=True)

    # ------------------------------------------------------------------ each round (§7.2-§7.5)

    def before_round(self, req, record, chunked_path: bool) -> None:
        """H10, before the engine's chunk stash (``chunked_path``) or its match: the stash leaves the
        prefix of a request kept out of the tree at the previous chunk's start; move it on."""
        if record.progress.outside_tree and chunked_path:
            self.engine.advance_prefix(req)

    def after_round(self, req, record, waiting_queue: bool, chunk_busy: bool) -> None:
        """H10, after the engine's match (``waiting_queue``) or its chunk stash: move the plan on,
        while it has steps to carry out. ``chunk_busy``: another request is the engine's chunked
        request."""
        progress = record.progress
        if progress is None or progress.cursor is None:
            return
        faults.check("scr.round", record.plan.rid)
        facts = self.engine.facts(req)
        prefix = facts.prefix_len
        if not progress.phase1:
            if waiting_queue:
                self._decide(req, record, facts, chunk_busy)
            return
        via = "waiting queue" if waiting_queue else "chunked path"
        action, detail = phase1_step(progress.cursor, prefix, waiting_queue)
        if action == "read":
            self._cut(req, progress, progress.cursor.stop)
            self.say(lines.phase1_again(record.plan.rid, via, prefix, progress.cursor.stop), debug=True)
        elif action == "abort":
            self.give_up(req, record, detail)
        else:
            self._relocate(req, record, detail, facts)

    def _decide(self, req, record, facts: RequestFacts, chunk_busy: bool) -> None:
        """§7.2 at a waiting-queue pass, after the engine's own prefix match."""
        progress, rid = record.progress, record.plan.rid
        cursor, tree_hit = progress.cursor, facts.prefix_len
        decision = cursor.decide(tree_hit, chunk_busy, progress.gate.allow)
        if decision.action == "retry":
            self.say(lines.format_line("deferred_retry", rid=rid, attempt=cursor.retries,
                                       max_attempts=cursor.max_retries))
        elif decision.action in ("drop", "gated"):
            reason = decision.reason or f"ssm gate: {progress.gate.reason}"
            self.say(lines.plan_not_run(rid, decision.action, reason), debug=True)
            progress.cursor = None
        elif decision.action == "relocate_now":
            # The radix match ends exactly at the first stop: relocate before admission (§7.2 step 8).
            progress.tree_hit = tree_hit
            self._relocate(req, record, cursor.at_prefix(tree_hit), facts, direct=True)
        else:
            progress.phase1, progress.tree_hit = True, tree_hit
            self._cut(req, progress, cursor.stop)
            self.say(lines.phase1(rid, progress, len(facts.prompt), self.about.state_pool, self.about.shadow))

    def _cut(self, req, progress: RelocationProgress, end: int) -> None:
        """The request ends at ``end`` this round (the engine rebuilds the full array at the next)."""
        self.engine.cut(req, end)
        progress.cut = True

    def _read_rest(self, req, progress: RelocationProgress) -> None:
        """Stop the plan; a token array cut at a stop gets its full length back."""
        progress.stop_plan()
        if progress.cut:
            self.engine.cut(req, None)
        progress.cut = False

    def give_up(self, req, record, reason: str, restore_lengths: bool = False) -> None:
        """§10.2: phase 1 gives up (the authors' ``phase1_aborted``; the request itself goes on); the rest is read with the request's own state (block 1's restore
        is only armed inside its relocation, so before it the own state covers everything before
        the stop). A cut array keeps its cut for this round unless ``restore_lengths``."""
        progress = record.progress
        if restore_lengths:
            self.engine.cut(req, None)
            progress.cut = False
        progress.stop_plan()
        self.counters.aborts += 1
        self.say(lines.format_line("phase1_aborted", reason=reason, aborts=self.counters.aborts))

    def _relocate(self, req, record, relocation: Relocation, facts: RequestFacts, direct: bool = False) -> None:
        """§7.5: carry out one ``Relocate`` step (rows to the end of the prefix), then arm the next.

        ``direct``: on the waiting queue, before admission (undone if the request is not admitted
        this round). Copies and the restore come before the slots are attached, so a failure leaves
        the request exactly as phase 1 left it (a plain read of the rest is exact). The restore's
        checks run with the row copy, before any rank overwrites its state; a state copy that fails
        on another rank is undone here, so every rank reads the rest from its own state."""
        progress, rid = record.progress, record.plan.rid
        block, prefix, slot = relocation.block, facts.prefix_len, progress.outcome.side_slot
        n, full_len = block.num_rows, facts.full_len
        reason = relocation_refusal(n, slot, full_len, prefix, relocation.arm_restore,
                                    self.about.shadow and facts.has_state_slot)
        if reason is None and not self._guard(rid, progress, block.old_start, facts.prompt[prefix:prefix + n]):
            reason = "side slot guard"
        slots = self._alloc(n) if reason is None else None
        if reason is None and slots is None:
            self.say(lines.format_line("alloc_failed", n=n))
            reason = "allocation failed"
        if reason is not None:
            self.say(lines.not_relocated(rid, progress.cursor.index + 1, reason), debug=True)
            return self._read_rest(req, progress)
        try:
            self.on_every_rank("place_rows", rid, self._place, rid, progress, slot, block.old_start, prefix, slots,
                               relocation.arm_restore)
            if relocation.arm_restore:
                self.on_every_rank("restore_copy", rid, self._restore, req, rid, slot, progress.sid,
                                   undo=partial(self.engine.undo_restore, req))
        except Exception as exc:
            self.logger.error(lines.RELOCATION_FAILED, exc, n)
            self.engine.free(slots)
            raise
        self._attach(req, record, slots, n, direct)
        for line in lines.relocated(rid, progress, relocation, prefix, full_len, self.counters):
            self._emit(progress, line)
        self._next_block(req, record, prefix + n)

    def _place(self, rid: str, progress: RelocationProgress, slot: int, old_start: int, new_start: int, slots,
               restore: bool) -> None:
        self.engine.place(slot, old_start, new_start, slots, rerotate=not progress.outcome.config.no_rerotate)
        if restore:
            faults.check("scr.restore_state", rid)

    def _restore(self, req, rid: str, slot: int, sid: str) -> Restored:
        """§9.4 (fork): the session's saved state over the request's own; traced with checksums
        (which read the state back, a device sync on GPU: only when traced)."""
        restored = self.engine.restore_state(req, slot, checksums=self.config.trace)
        if restored.checksums is not None:
            before, shadow, after = restored.checksums
            self.trace("ssm_restore", rid=rid, slot=slot, midx=restored.state_slot, sid=sid, before=round(before, 3),
                       shadow=round(shadow, 3), after=round(after, 3))
        return restored

    def _guard(self, rid: str, progress: RelocationProgress, old_start: int, new_ids: Sequence[int]) -> bool:
        n = len(new_ids)
        guard = self.policy.relocation_guard(progress.outcome, old_start, n, new_ids)
        if not guard.ok:
            self.counters.stolen += 1
            self.say(lines.slot_stolen(rid, progress, old_start, n, guard.owner, guard.ids_match,
                                       self.counters.stolen))
        return guard.ok

    def _alloc(self, n: int):
        """Fresh KV slots, with the authors' evict-then-retry once (§10.3)."""
        slots = self.engine.alloc(n)
        if slots is not None or not self.config.evict_on_alloc_fail:
            return slots
        room = self.engine.room()
        avail, evictable = room.free, room.evictable
        floor = evict_floor(room.size, self.config.evict_floor_frac)
        wanted = evict_amount(n, avail, evictable, floor, self.config.evict_margin)
        if wanted is None:
            self.say(lines.format_line("evict_declined", avail=avail, evictable=evictable, need=n, floor=floor))
            return None
        self.engine.evict(wanted)
        evicted = self.engine.room().free - avail
        slots = self.engine.alloc(n)
        counts = self.counters
        counts.evict_retries += 1
        counts.evict_retries_ok += slots is not None
        self.say(lines.format_line("evict_retry", requested=wanted, evicted=evicted, retry="OK" if slots is not None
                                   else "FAIL", ok=counts.evict_retries_ok, total=counts.evict_retries))
        return slots

    def _attach(self, req, record, slots, n: int, direct: bool) -> None:
        """Append the filled slots to the request's prefix (§7.5 step 7)."""
        progress = record.progress
        outside_tree = not progress.outcome.config.relocated_in_tree
        self.engine.attach(req, slots, n, outside_tree)
        progress.outside_tree = progress.outside_tree or outside_tree
        record.moved += n
        record.blocks += 1
        self.counters.relocated(n)
        if direct:
            progress.direct = (slots, n)

    def _emit(self, progress: RelocationProgress, line: str) -> None:
        """Log a relocation line now, or, for one made on the waiting queue, once the request is
        admitted: an undone relocation must leave no line (the accounting sums them)."""
        if progress.direct is None:
            self.say(line)
        else:
            progress.held_lines = [*(progress.held_lines or []), line]

    def _next_block(self, req, record, prefix: int) -> None:
        """§7.5 step 9: cut at the next block's stop and stay in phase 1 (a forced middle chunk, so
        nothing is sampled there, also after a relocation on the waiting queue), or read the rest."""
        progress = record.progress
        num_blocks = len(progress.cursor.blocks)
        following = progress.cursor.after_relocation()
        if following.stop is not None:
            self._cut(req, progress, following.stop)
            progress.phase1 = True
            return self._emit(progress, lines.next_block(record.plan.rid, following, num_blocks, prefix))
        if following.abandoned:
            self.say(lines.next_block(record.plan.rid, following, num_blocks, prefix))
        self._read_rest(req, progress)

    def undo_direct(self, req, record, replan: bool = True) -> None:
        """A relocation made on the waiting queue, and the request waits another round: return the
        slots, plan again at its next pass. Everything the relocation set is undone: prefix, cached
        count, tree exclusion, a cut at a second stop."""
        progress = record.progress
        slots, n = progress.direct
        progress.held_lines = None
        self.engine.free(slots)
        self.engine.detach(req, progress.tree_hit, n)
        progress.direct, progress.outside_tree = None, False
        self._read_rest(req, progress)
        record.moved -= n
        record.blocks -= 1
        self.counters.relocated(n, sign=-1)
        progress.cursor = new_cursor(progress, record.plan) if replan else None
        self.say(lines.direct_undone(record.plan.rid), debug=True)

    # ------------------------------------------------------------------ admission to a round (§7.3)

    def not_admitted(self, req, record) -> None:
        """H8, a round that belongs to a phase-1 request: ``req`` waits, and a relocation it made on
        the waiting queue gives its slots back."""
        if record.progress.direct is not None:
            self.undo_direct(req, record)

    def before_admission(self, req, record, chunk_taken: bool) -> bool:
        """H8, before the engine tries to admit ``req``: True when it is in phase 1 (it must become
        the round's chunked request). ``chunk_taken``: the round already has a chunked request."""
        progress = record.progress
        in_phase1 = progress is not None and progress.cursor is not None and progress.phase1
        if in_phase1 and chunk_taken:
            self.give_up(req, record, "another request is already chunked", restore_lengths=True)
            return False
        return in_phase1

    def after_admission(self, req, record, admitted: bool, needs_chunk: bool, chunk_free: bool) -> bool:
        """After the engine's admission pass over ``req`` (``needs_chunk``: ``before_admission``'s
        answer, True in phase 1;
        ``chunk_free``: the round has no other chunked request). A relocation made on the waiting
        queue stays (its lines are logged now) or, for a request not admitted, is undone. True = make
        the admitted phase-1 request the round's chunked request; else its plan is aborted (§7.3)."""
        progress = record.progress
        if progress.direct is not None:
            if not admitted:
                self.undo_direct(req, record)
                return False
            progress.direct = None
            for line in progress.held_lines or ():
                self.say(line)
            progress.held_lines = None
        if not (needs_chunk and admitted and progress.cursor is not None):
            return False
        reason = chunk_admission(self.engine.facts(req).extend_end, progress.cursor.stop, chunk_free)
        if reason is not None:
            self.give_up(req, record, reason)
        return reason is None

    def keeps_chunk(self, record, prefix_len: int) -> bool:
        """H9: ``RelocationProgress.keeps_chunk`` (False for a request without SCR progress)."""
        return record.progress is not None and record.progress.keeps_chunk(prefix_len)

    # ------------------------------------------------------------------ recurrent state (§9)

    def after_prefill(self, req, record) -> None:
        """H4: the state snapshot at prefill end (§9.2)."""
        facts = self.engine.facts(req)
        if snapshot_at_prefill_end(self.config, self.about.shadow, record.progress, facts.finished,
                                   facts.has_state_slot):
            self._save_state(req, record, facts.extend_end)

    def _save_state(self, req, record, n_tokens: int) -> None:
        """§9.2: the request's recurrent state -> the shadow row of its session's side slot."""
        progress, rid = record.progress, record.plan.rid
        slot, acquired = self.policy.snapshot_slot(progress.sid)
        if slot is None:
            return
        if acquired:
            self.trace("side_acq", slot=slot, sid=progress.sid, free=self.policy.num_free_slots)
        index = self.on_every_rank("save_state", rid, self.engine.save_state, req, slot)
        self.policy.snapshot_taken(progress.sid, n_tokens)
        progress.state_saved = True
        self.trace("ssm_save", rid=rid, sid=progress.sid, slot=slot, midx=index, n=n_tokens)

    # ------------------------------------------------------------------ the request leaves

    def retracted(self, req, record) -> str | None:
        """SGLang retracted or preempted ``req`` and freed every row it held, relocated ones too;
        it is queued again and read again without relocation. Returns the event's fallback reason
        when a plan was running or had moved rows, else None."""
        progress = record.progress
        running = progress is not None and progress.retracted()
        self.engine.include_in_tree(req)
        return "retracted: read again without relocation" if running or record.moved else None

    def store(self, req, record) -> None:
        """H2, §5.2: a request of a session copies the rows that changed into the session's side
        slot (or drops the session). A failure while copying drops the session's private data (its
        slot may be half written)."""
        progress, rid = record.progress, record.plan.rid
        if progress is None or progress.sid is None:
            return
        committed = self.engine.committed(req)
        if committed is None:
            return self.policy.count_out(progress.sid)
        kv_len, tokens, pool_row = committed
        store = self.policy.store_turn(progress.sid, tokens)
        if store.slot is not None:
            if store.acquired:
                self.trace("side_acq", slot=store.slot, sid=progress.sid, free=self.policy.num_free_slots)
            if store.end > store.keep:
                try:
                    self.on_every_rank("side_store", rid, self.engine.store_rows, store.slot, pool_row, kv_len,
                                       store.keep, store.end)
                except Exception:
                    self._trace_dropped(self.policy.drop_private(progress.sid))
                    raise
            self.trace("snap", sid=progress.sid, slot=store.slot, keep=store.keep, n=store.end, prev=store.prev)
        if store.dropped is not None:
            self.say(lines.store_skipped(progress.sid, store.reason), debug=True)
            self._trace_dropped(store.dropped)
        action = state_at_release(progress.outcome.config, self.about.shadow, store.slot is not None,
                                  self.engine.facts(req).has_state_slot, progress.state_saved)
        if action == "save":
            self._save_state(req, record, kv_len)
        elif action == "drop":
            self.policy.drop_state(progress.sid)
            self.say(lines.format_line("ssm_dropped", rid=rid, sid=progress.sid))

    def forget(self, record) -> None:
        """A request that never reaches release (popped from the waiting queue by an abort, or gone
        from the idle scheduler): give back a relocation made on the waiting queue, count it out of
        its session, which may be gone already (nothing stored: it read nothing)."""
        progress = record.progress
        if progress is not None and progress.direct is not None:
            self.engine.free(progress.direct[0])
        if progress is not None and progress.sid is not None:
            self.policy.count_out(progress.sid, if_present=True)
