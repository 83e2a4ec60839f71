"""SCR inside a scheduler process: carries out ``ScrPolicy``'s decisions on SGLang 0.5.16.

The rules are pure (``scr/``: ``cursor`` for the plan's steps, ``execution`` for everything asked
while executing, with the design and where this port differs from the authors' code, ``lines``
for what is printed); the tensors are ``scr_tensors``; SGLang's calls arrive through
``scr_hooks``. Here: read facts off SGLang objects, ask, then change request fields, allocate or
free slots, and write events. An exception inside any SCR step is contained (``_contain``): the
request falls back to a plain read, a line says why, and its event carries the reason.
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import os
import time

import sglang
import torch

from serving import faults
from patches.events import EventWriter
from patches.executor import aborted_waiting, finish_type, match_cap
from patches.scr_tensors import ScrTensors
from policy.events import RequestEvent
from scr import lines
from scr.cursor import Splice, phase1_step
from scr.execution import (Counters, RequestState, accounting, chunk_admission, evict_amount, evict_floor,
                           new_cursor, plan_gate, snapshot_at_prefill_end, splice_refusal, state_at_release)
from scr.intercept import Intercept
from scr.kvreuse_env import UnsupportedKnob
from scr.policy import ScrPolicy

logger = logging.getLogger(__name__)

FORCED = "_scr_forced_chunk"  # set on a PrefillAdder whose round belongs to a phase-1 request
STALE_LOG = "scr: dropped state of %d request(s) the idle scheduler no longer has: %s"
# One line per contained failure; ``step`` names the SCR step, ``outcome`` what the request got.
FALLBACK_LOG = "[kvreuse] scr fallback: rid=%s step=%s outcome=%s reason=%s"


class ScrRuntime:
    """Per-request plan state of one scheduler (one ``RequestState`` per rid, released in
    ``on_release``; ``on_idle`` drops what the idle scheduler no longer has, logged)."""

    def __init__(self, policy: ScrPolicy, scheduler, events: EventWriter | None, leader: bool):
        self.policy, self.config = policy, policy.config
        self.scheduler, self.events, self.leader = scheduler, events, leader
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.tensors = ScrTensors(scheduler, self.config)
        self.tokenizer = getattr(scheduler, "tokenizer", None)
        self._reqs: dict[str, RequestState] = {}
        self.counters = Counters()
        t = self.tensors
        for line in lines.startup_lines(
                self.config, sglang.__version__, os.getpid(), os.environ, bytes_per_token=t.side.bytes_per_token,
                shadow_gib=t.shadow_gib() if t.shadow is not None else None, layers=t.layers,
                rotary=t.rotary is not None, pool_slots=int(self.allocator.size)):
            self._log(line)

    def _log(self, line: str, debug: bool = False) -> None:
        if self.leader and (self.config.debug or not debug):
            logger.info(line)

    def _trace(self, ev: str, **fields) -> None:
        if self.config.trace:
            self._log(lines.format_line("trace", ev=ev, fields=fields))

    def _trace_dropped(self, dropped) -> None:
        self._trace("drop_private", sid=dropped.sid, slot=dropped.side_slot, n_side=dropped.n_side)
        if dropped.side_slot is not None:
            self._trace("side_rel", slot=dropped.side_slot, sid=dropped.sid)

    def on_enqueue(self, scheduler, req, is_retracted: bool = False, *args, **kwargs) -> None:
        """H7: admit a new request to its session and, for a plan, arm its cursor."""
        if is_retracted or req.rid in self._reqs or req.finished() or req.to_finish is not None:
            return
        tokens = tuple(req.origin_input_ids)
        try:
            outcome = self.policy.admit(tokens, req.extra_key)
        except UnsupportedKnob as exc:
            # A per-request choice this port cannot serve: the client gets a 400 naming it.
            req.set_finish_with_abort(f"cache_salt: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - a failed admission serves the request plainly
            logger.exception("[kvreuse] scr admission failed for rid=%s", req.rid)
            self._reqs[req.rid] = RequestState(req.rid, None, Intercept("off", self.config), time.time(),
                                               fallback=f"admit: {exc}")
            return
        state = self._reqs[req.rid] = RequestState(req.rid, outcome.sid, outcome, time.time())
        self._contain("plan", req, state, self._arm_plan, req, state, outcome, tokens)

    def _arm_plan(self, req, state: RequestState, outcome: Intercept, tokens) -> None:
        if outcome.admission is None:
            return
        if self.config.trace:  # the tag decodes tokens: not worth it for a line nobody prints
            self._log(lines.trace_request(req.rid, outcome, len(tokens), self._decode(tokens[:48])))
        for dropped in outcome.admission.evicted:
            self._trace_dropped(dropped)
        if outcome.kind == "passthrough":
            self._log(lines.format_line("passthrough", sid=outcome.sid, kept=outcome.kept, deleted=outcome.deleted,
                                        inserted=outcome.inserted), debug=True)
        if outcome.kind != "plan":
            return
        state.gate = plan_gate(outcome, self.tensors.state is not None, self.tensors.shadow is not None)
        state.cursor = new_cursor(state)
        if len(outcome.blocks) > 1:
            self._log(lines.multiblock_plan(req.rid, outcome, len(tokens)), debug=True)

    def _decode(self, tokens) -> str:
        try:
            return self.tokenizer.decode(list(tokens)) if self.tokenizer is not None else ""
        except Exception:  # noqa: BLE001 - the tag is cosmetic
            return ""

    def _contain(self, step: str, req, state: RequestState | None, fn, *args):
        """Run one SCR step; an exception ends in a plain read of this request, never a dead scheduler.

        SGLang's own code is never run in here (the AROUND hooks call ``original`` outside), so only
        failures of the policy are caught. The request keeps what is still correct (rows spliced
        before the failing step, when the forward after them already ran) and reads the rest."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - containment is the point
            logger.exception("[kvreuse] scr step %s failed for rid=%s", step, getattr(req, "rid", None))
            if state is not None:
                state.fallback = state.fallback or f"{step}: {type(exc).__name__}: {exc}"
                state.stop_plan()
                if state.direct is not None:
                    self._undo_direct_splice(req, state, replan=False)
                if state.cut and not req.finished():
                    self._uncut(req)
                state.cut = False
                logger.error(FALLBACK_LOG, req.rid, step, "plain_read", state.fallback)
            return None

    def _read_rest(self, req, state: RequestState) -> None:
        """Stop the plan; a token array cut at a stop gets its full length back."""
        state.stop_plan()
        if state.cut:
            self._uncut(req)
        state.cut = False

    @staticmethod
    def _uncut(req) -> None:
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids  # SGLang's array("q")
        if req.extend_range is not None:
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))

    @staticmethod
    def _cut(req, state: RequestState, end: int) -> None:
        """Make the request end at ``end`` for this round (SGLang rebuilds the full array at the next)."""
        req.full_untruncated_fill_ids = req.full_untruncated_fill_ids[:end]
        req.set_extend_range(len(req.prefix_indices), end)
        state.cut = True

    def init_round(self, original, req, tree_cache=None, cow_mamba=None, *args, **kwargs):
        """H10: after SGLang's match (waiting queue) or its chunk stash (chunked path), move the plan on."""
        state = self._reqs.get(req.rid)
        if state is not None and state.outside_tree and tree_cache is None:
            self._contain("advance_prefix", req, state, self._advance_prefix, req)
        result = original(req, tree_cache, cow_mamba, *args, **kwargs)
        if state is not None and state.cursor is not None:
            self._contain("round", req, state, self._round, req, state, tree_cache is not None)
        return result

    def _advance_prefix(self, req) -> None:
        """SGLang's stash skips a request marked ``skip_radix_cache_insert`` and so leaves its
        prefix at the previous chunk's start (docs/sglang.md §6.4): move it to the chunk's end."""
        end = req.extend_range.end
        if req.req_pool_idx is not None and end > len(req.prefix_indices):
            req.prefix_indices = self.tensors.prefix_rows(req.req_pool_idx, end)

    def _round(self, req, state: RequestState, waiting_queue: bool) -> None:
        faults.check("scr.round", req.rid)
        if not state.phase1:
            if waiting_queue:
                self._decide(req, state)
            return
        prefix, via = len(req.prefix_indices), "waiting queue" if waiting_queue else "chunked path"
        action, detail = phase1_step(state.cursor, prefix, waiting_queue)
        if action == "read":
            self._cut(req, state, state.cursor.stop)
            self._log(f"[kvreuse] kv6 rid={req.rid} phase1 re-entry ({via}): prefix={prefix} stop={state.cursor.stop}",
                      debug=True)
        elif action == "abort":
            self._abort(req, state, detail)
        else:
            self._splice(req, state, detail)

    def _decide(self, req, state: RequestState) -> None:
        """§7.2 at a waiting-queue pass, after SGLang's own prefix match."""
        radix_n0, chunked, cursor = len(req.prefix_indices), self.scheduler.chunked_req, state.cursor
        decision = cursor.decide(radix_n0, chunked is not None and chunked is not req, state.gate.allow)
        if decision.action == "retry":
            self._log(lines.format_line("deferred_retry", rid=req.rid, attempt=cursor.retries,
                                        max_attempts=cursor.splice_retry))
        elif decision.action in ("drop", "gated"):
            reason = decision.reason or f"ssm gate: {state.gate.reason}"
            self._log(f"[kvreuse] kv6 rid={req.rid} plan not run ({decision.action}: {reason})", debug=True)
            state.cursor = None
        elif decision.action == "direct_splice":
            # The radix match ends exactly at the first stop: splice before admission (§7.2 step 8).
            state.radix_n0 = radix_n0
            self._splice(req, state, cursor.at_prefix(radix_n0), direct=True)
        else:
            state.phase1, state.radix_n0 = True, radix_n0
            self._cut(req, state, cursor.stop)
            self._log(lines.phase1(req.rid, state, len(req.origin_input_ids), self.tensors.state is not None,
                                   self.tensors.shadow is not None))

    def _abort(self, req, state: RequestState, reason: str, restore_lengths: bool = False) -> None:
        """§10.2: phase 1 gives up; the rest is read with the request's own state (block 1's restore
        is only armed inside its splice, so before it the own state covers A + B'). A cut array
        keeps its cut for this round (SGLang rebuilds it at the next) unless ``restore_lengths``."""
        if restore_lengths:
            self._uncut(req)
            state.cut = False
        state.stop_plan()
        self.counters.aborts += 1
        self._log(lines.format_line("phase1_aborted", reason=reason, aborts=self.counters.aborts))

    def _splice(self, req, state: RequestState, splice: Splice, direct: bool = False) -> None:
        """§7.5: relocate one block's rows to the end of the prefix, then arm the next block.

        ``direct``: on the waiting queue, before admission (``add_one_req`` undoes it if the request
        is not admitted this round). Copies and the restore come before the slots are attached, so
        a failure leaves the request exactly as phase 1 left it (a plain read of the rest is exact)."""
        block, prefix, slot = splice.block, len(req.prefix_indices), state.outcome.side_slot
        n, full_len = block.num_rows, len(req.origin_input_ids) + len(req.output_ids)
        reason = splice_refusal(n, slot, full_len, prefix, splice.arm_restore,
                                self.tensors.shadow is not None and req.mamba_pool_idx is not None)
        if reason is None and not self._guard(req, state, block.old_start, prefix, n):
            reason = "side slot guard"
        slots = self._alloc(n) if reason is None else None
        if reason is None and slots is None:
            self._log(lines.format_line("alloc_failed", n=n))
            reason = "allocation failed"
        if reason is not None:
            self._log(f"[kvreuse] kv6 rid={req.rid} block {state.cursor.index + 1} not spliced ({reason}) "
                      "-> normal prefill of the tail", debug=True)
            return self._read_rest(req, state)
        try:
            faults.check("scr.place_rows", req.rid)
            self.tensors.place(slot, block.old_start, prefix, slots, rerotate=not state.outcome.config.no_rerotate)
            if splice.arm_restore:
                self._restore_state(req, state, slot)
        except Exception as exc:
            logger.error("[kvreuse] v6 splice failed (%s); freeing %d slots", exc, n)
            self.allocator.free(slots)
            raise
        self._attach(req, state, slots, n, direct)
        for line in lines.spliced(req.rid, state, splice, prefix, full_len, self.counters):
            self._emit(state, line)
        self._next_block(req, state, prefix + n)

    def _emit(self, state: RequestState, line: str) -> None:
        """Log a splice line now, or, for a splice made on the waiting queue, once the request is
        admitted: an undone splice must leave no line (the accounting sums them)."""
        if state.direct is None:
            self._log(line)
        else:
            state.held_lines = [*(state.held_lines or []), line]

    def _guard(self, req, state: RequestState, old_start: int, prefix: int, n: int) -> bool:
        guard = self.policy.splice_guard(state.outcome, old_start, n, req.origin_input_ids[prefix:prefix + n])
        if not guard.ok:
            self.counters.stolen += 1
            self._log(lines.slot_stolen(req.rid, state, old_start, n, guard.owner, guard.ids_match,
                                        self.counters.stolen))
        return guard.ok

    def _attach(self, req, state: RequestState, slots, n: int, direct: bool) -> None:
        """Append the filled slots to the request's prefix (§7.5 step 7)."""
        req.prefix_indices = torch.cat([req.prefix_indices.to(torch.int64), slots.to(torch.int64)])
        # SGLang counts the spliced rows again in prepare_for_extend: the authors' double count.
        req.cached_tokens += n
        if not state.outcome.config.relocated_in_tree:
            req.skip_radix_cache_insert = state.outside_tree = True
        state.moved += n
        state.blocks += 1
        self.counters.spliced(n)
        if direct:
            state.direct = (slots, n)

    def _next_block(self, req, state: RequestState, prefix: int) -> None:
        """§7.5 step 9: cut at the next block's stop and stay in phase 1 (a forced middle chunk, so
        nothing is sampled there, also after a splice on the waiting queue), or read the rest."""
        num_blocks = len(state.cursor.blocks)
        following = state.cursor.after_splice()
        if following.stop is not None:
            self._cut(req, state, following.stop)
            state.phase1 = True
            return self._emit(state, lines.next_block(req.rid, following, num_blocks, prefix))
        if following.abandoned:
            self._log(lines.next_block(req.rid, following, num_blocks, prefix))
        self._read_rest(req, state)

    def _alloc(self, n: int):
        """Fresh KV slots, with the authors' evict-then-retry once (§10.3)."""
        slots = self.allocator.alloc(n)
        if slots is not None or not self.config.evict_on_alloc_fail:
            return slots
        tree, avail = self.scheduler.tree_cache, self.allocator.available_size()
        evictable = tree.full_evictable_size() if hasattr(tree, "full_evictable_size") else tree.evictable_size()
        floor = evict_floor(self.allocator.size, self.config.evict_floor_frac)
        wanted = evict_amount(n, avail, evictable, floor, self.config.evict_margin)
        if wanted is None:
            self._log(lines.format_line("evict_declined", avail=avail, evictable=evictable, need=n, floor=floor))
            return None
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        tree.evict(EvictParams(num_tokens=wanted))
        evicted = self.allocator.available_size() - avail
        slots = self.allocator.alloc(n)
        counts = self.counters
        counts.evict_retries += 1
        counts.evict_retries_ok += slots is not None
        self._log(lines.format_line("evict_retry", requested=wanted, evicted=evicted, retry="OK" if slots is not None
                                    else "FAIL", ok=counts.evict_retries_ok, total=counts.evict_retries))
        return slots

    def add_one_req(self, original, adder, req, *args, **kwargs):
        """H8: a phase-1 request must be the round's chunked request, and owns the round."""
        from sglang.srt.managers.schedule_policy import AddReqResult

        state = self._reqs.get(req.rid)
        if getattr(adder, FORCED, False):
            # A waiting-queue splice of a request that is not admitted now gives its slots back.
            if state is not None and state.direct is not None:
                self._contain("undo_direct", req, state, self._undo_direct_splice, req, state)
            return AddReqResult.OTHER
        in_phase1 = state is not None and state.cursor is not None and state.phase1
        has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
        if in_phase1 and (has_chunked or adder.new_chunked_req is not None):
            self._abort(req, state, "another request is already chunked", restore_lengths=True)
            in_phase1 = False
        result = original(adder, req, *args, **kwargs)
        if state is not None:
            admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
            self._contain("admit_round", req, state, self._after_add, adder, req, state, admitted, in_phase1)
        return result

    def _after_add(self, adder, req, state: RequestState, admitted: bool, in_phase1: bool) -> None:
        if state.direct is not None:
            if not admitted:
                return self._undo_direct_splice(req, state)
            state.direct = None
            for line in state.held_lines or ():
                self._log(line)
            state.held_lines = None
        if in_phase1 and admitted and state.cursor is not None:
            chunk_free = adder.new_chunked_req is None or adder.new_chunked_req is req
            reason = chunk_admission(req.extend_range.end, state.cursor.stop, chunk_free)
            if reason is not None:
                return self._abort(req, state, reason)
            adder.new_chunked_req = req
            setattr(adder, FORCED, True)

    def _undo_direct_splice(self, req, state: RequestState, replan: bool = True) -> None:
        """The request waits another round: return the slots, plan again at its next pass. Everything
        the splice set is undone: prefix, cached count, tree exclusion, a cut at a second stop."""
        slots, n = state.direct
        state.held_lines = None
        self.allocator.free(slots)
        req.prefix_indices = req.prefix_indices[: state.radix_n0]
        req.cached_tokens -= n
        req.skip_radix_cache_insert = False
        state.direct, state.outside_tree = None, False
        self._read_rest(req, state)
        state.moved -= n
        state.blocks -= 1
        self.counters.spliced(n, sign=-1)
        state.cursor = new_cursor(state) if replan else None
        self._log(f"[kvreuse] kv6 rid={req.rid} direct splice undone (not admitted this round)", debug=True)

    def add_chunked_req(self, original, adder, req):
        """H9: phase 1 stays the chunked request until its stop, even when the cut array was read."""
        state = self._reqs.get(req.rid)
        if state is None or not state.keeps_chunk(len(req.prefix_indices)):
            return original(adder, req)
        original(adder, req)
        setattr(adder, FORCED, True)
        return req

    def after_prefill(self, result, processor, batch, *args, **kwargs):
        """H4: the state snapshot at prefill end (§9.2)."""
        for req in batch.reqs:
            state = self._reqs.get(req.rid)
            if state is not None and snapshot_at_prefill_end(
                    self.config, self.tensors.shadow is not None, state, req.finished(), req.mamba_pool_idx is not None):
                self._contain("save_state", req, state, self._save_state, req, state, req.extend_range.end)
        return result

    def _save_state(self, req, state: RequestState, n_tokens: int) -> None:
        """§9.2: the request's recurrent state -> the shadow row of its session's side slot."""
        slot, acquired = self.policy.snapshot_slot(state.sid)
        if slot is None:
            return
        if acquired:
            self._trace("side_acq", slot=slot, sid=state.sid, free=self.policy.num_free_slots)
        index = int(req.mamba_pool_idx)
        faults.check("scr.save_state", req.rid)
        self.tensors.save_state(slot, index)
        self.policy.snapshot_taken(state.sid, n_tokens)
        state.state_saved = True
        self._trace("ssm_save", rid=req.rid, sid=state.sid, slot=slot, midx=index, n=n_tokens)

    def _restore_state(self, req, state: RequestState, slot: int) -> None:
        """§9.4 (fork): overwrite the request's state with the previous prompt's saved state."""
        # Nothing staged may overwrite the restored state at the next forward (spec §9.6); what was
        # staged (a copy-on-write from the matched node, or a clear) comes back if the restore fails.
        staged = (req.mamba_cow_src_index, req.mamba_needs_clear)
        req.mamba_cow_src_index, req.mamba_needs_clear = None, False
        index, trace = int(req.mamba_pool_idx), self.config.trace
        before = self.tensors.state_sum(index) if trace else 0.0
        try:
            faults.check("scr.restore_state", req.rid)
            self.tensors.restore_state(slot, index)
        except Exception:
            req.mamba_cow_src_index, req.mamba_needs_clear = staged
            raise
        if trace:  # the checksums read the state back (a device sync on GPU): only when traced
            self._trace("ssm_restore", rid=req.rid, slot=slot, midx=index, sid=state.sid, before=round(before, 3),
                        shadow=round(self.tensors.state_sum(slot=slot), 3),
                        after=round(self.tensors.state_sum(index), 3))

    def on_release(self, req, tree_cache=None, *args, **kwargs) -> None:
        """H2: store the turn's rows in the side buffer, write the request's event."""
        state = self._reqs.get(req.rid)
        if state is None:
            return
        if not req.finished():
            # Retracted or preempted: SGLang frees every row of the request (spliced ones too) and
            # queues it again; it is read again without relocation, and released again at its end.
            state.retracted()
            req.skip_radix_cache_insert = False
            logger.warning(FALLBACK_LOG, req.rid, "retract", "plain_read", "retracted or preempted")
            return
        del self._reqs[req.rid]
        if state.sid is not None:
            self._contain("store", req, state, self._store, req, state)
        self._contain("event", req, None, self._write_event, req, state)

    def _store(self, req, state: RequestState) -> None:
        """§5.2: copy the rows that changed into the session's side slot (or drop the session).
        A failure while copying drops the session's private data (its slot may be half written)."""
        if req.req_pool_idx is None:
            return self.policy.count_out(state.sid)
        kv_len = req.effective_kv_committed_len()
        store = self.policy.store_turn(state.sid, (list(req.origin_input_ids) + list(req.output_ids))[:kv_len])
        if store.slot is not None:
            if store.acquired:
                self._trace("side_acq", slot=store.slot, sid=state.sid, free=self.policy.num_free_slots)
            if store.end > store.keep:
                try:
                    faults.check("scr.side_store", req.rid)
                    self.tensors.store(store.slot, req.req_pool_idx, kv_len, store.keep, store.end)
                except Exception:
                    self._trace_dropped(self.policy.drop_private(state.sid))
                    raise
            self._trace("snap", sid=state.sid, slot=store.slot, keep=store.keep, n=store.end, prev=store.prev)
        if store.dropped is not None:
            self._log(f"[kvreuse] {state.sid} side store skipped ({store.reason})", debug=True)
            self._trace_dropped(store.dropped)
        action = state_at_release(state.outcome.config, self.tensors.shadow is not None, store.slot is not None,
                                  req.mamba_pool_idx is not None, state.state_saved)
        if action == "save":
            self._save_state(req, state, kv_len)
        elif action == "drop":
            self.policy.drop_state(state.sid)
            self._log(lines.format_line("ssm_dropped", rid=req.rid, sid=state.sid))

    def _write_event(self, req, state: RequestState) -> None:
        if self.events is None:
            return
        prompt = len(req.origin_input_ids)
        reused, read = accounting(prompt, req.cached_tokens, state.moved)
        self.events.write(RequestEvent(
            rid=req.rid, policy=self.policy.name, prompt_tokens=prompt, prefix_reused=reused, moved=state.moved,
            read=read, decode_tokens=len(req.output_ids), cache_salt=req.extra_key, plan_resume=None,
            finish_reason=finish_type(req.finished_reason), queued_ts=state.queued_ts, finished_ts=time.time(),
            blocks=state.blocks, fallback=state.fallback, retractions=state.retractions,
            match_cap=match_cap(req, prompt)))

    def on_abort(self, scheduler, recv_req) -> None:
        """BEFORE ``Scheduler.abort_request``: a request popped from the waiting queue never reaches
        ``release_kv_cache``; count it out of its session (nothing stored, no event: it read nothing)
        and give back a splice made on the waiting queue."""
        for rid in aborted_waiting(scheduler, recv_req):
            state = self._reqs.pop(rid, None)
            if state is not None and state.direct is not None:
                self.allocator.free(state.direct[0])
            if state is not None and state.sid is not None:
                self._contain("abort", None, None, self.policy.count_out, state.sid, True)

    def on_idle(self, scheduler, *args, **kwargs) -> None:
        """Drop requests the idle scheduler no longer has (aborted before admission), then check."""
        if not scheduler.is_fully_idle():
            return
        if self._reqs:
            logger.error(STALE_LOG, len(self._reqs), sorted(self._reqs)[:5])
            for state in self._reqs.values():
                if state.sid is not None:
                    self.policy.count_out(state.sid, if_present=True)
            self._reqs.clear()
        try:
            self.policy.check()
        except AssertionError:
            # An inconsistent session table is a bug to see, not a reason to stop serving.
            logger.exception("[kvreuse] scr invariant check failed")
