"""SCR inside a scheduler process: the hooks that run ``ScrPolicy``'s decisions on SGLang 0.5.16.

The decisions are pure (``scr/``); this module moves tensors and SGLang request fields. Hook map
(``scr_spec.md`` §3.2; H numbers are the spec's):

| SGLang call                                              | kind   | method            | spec    |
|----------------------------------------------------------|--------|-------------------|---------|
| ``Scheduler._add_request_to_queue``                      | BEFORE | ``on_enqueue``    | H7, §4  |
| ``Req.init_next_round_input``                            | AROUND | ``init_round``    | H10, §7 |
| ``PrefillAdder.add_one_req``                             | AROUND | ``add_one_req``   | H8      |
| ``PrefillAdder.add_chunked_req``                         | AROUND | ``add_chunked_req``| H9     |
| ``SchedulerBatchResultProcessor.process_batch_result_prefill`` | AFTER | ``after_prefill`` | H4, §9.2 |
| ``mem_cache.common.release_kv_cache``                    | BEFORE | ``on_release``    | H2, §5.2 |
| ``Scheduler.on_idle``                                    | BEFORE | ``on_idle``       | (checks) |

A relocation, for block i with rows at new positions ``[stop_i, stop_i + rows_i)``::

    prompt |0 .. radix_n0|radix_n0 .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| .. tail|
            from the tree  phase 1 (chunked)  splice 1       phase 1 again        splice 2  read

Phase 1 runs as SGLang's chunked request with the token array cut at the stop, so no token is
sampled there; the splice happens on the chunked-request pass that finds the prefix exactly at
the stop. Where this port differs from the authors' code, and why:

* relocated rows never enter the shared radix tree (the authors' README design; their code
  inserts the request, spliced rows included, when it is cached): after the first splice the
  request is marked ``skip_radix_cache_insert``, so the tree keeps what phase 1 read exactly
  (``[0, stop_1)``) and SGLang frees the request's own rows, relocated ones included, at release;
* the state restore at block 1 is a direct copy at the splice; on the same-round "direct splice"
  (a radix match ending exactly at the stop, before admission) SGLang's staged copy-on-write from
  the matched node is cancelled first, so it cannot overwrite the restored state (spec §9.6), and
  the splice is undone if the request is not admitted that round;
* a request re-queued by preemption is not admitted to its session a second time, and a request
  retracted or preempted after a splice gives every slot back (SGLang frees the request's rows)
  and is read again without relocation (its event says so in ``fallback``);
* an exception inside any SCR step is contained (``_contain``): the request falls back to a plain
  read (or, when its recurrent state can no longer be trusted, is aborted), a line says why, and
  its event carries the reason; the scheduler keeps serving;
* keys are re-rotated with the language model's rotary table, found on its full-attention layers
  and checked against the text config at start-up (``patches.rope.text_rotary``).

Per-request state lives in one dict keyed by rid, released in ``on_release`` (``on_idle`` drops
what the idle scheduler no longer has, logged).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import sglang
import torch

from patches.events import EventWriter
from patches.executor import aborted_waiting, finish_type, match_cap
from patches import faults
from patches.rope import rerotate_keys_from_cache, text_rotary
from patches.scr_store import SideBuffer, StateShadow
from policy.events import RequestEvent
from scr import log_lines
from scr.config import AUTHORS_DEFAULTS, ENV_VARS, ScrConfig, UnsupportedKnob
from scr.cursor import Splice, SpliceCursor
from scr.gates import Gate, ssm_ready
from scr.intercept import Intercept
from scr.policy import ScrPolicy

logger = logging.getLogger(__name__)

FORCED = "_scr_forced_chunk"  # set on a PrefillAdder whose round belongs to a phase-1 request
STALE_LOG = "scr: dropped state of %d request(s) the idle scheduler no longer has: %s"
# One line per contained failure; ``step`` names the SCR step, ``outcome`` what the request got.
FALLBACK_LOG = "[kvreuse] scr fallback: rid=%s step=%s outcome=%s reason=%s"


@dataclass
class _Request:
    rid: str
    sid: str | None
    outcome: Intercept
    queued_ts: float
    cursor: SpliceCursor | None = None  # a plan waiting for its decision or being executed
    gate: Gate | None = None
    phase1: bool = False  # reading up to ``cursor.stop`` as the chunked request
    radix_n0: int = 0
    moved: int = 0  # rows relocated into the prefix
    blocks: int = 0  # blocks spliced
    state_saved: bool = False  # a prefill-end state snapshot was taken for this request
    outside_tree: bool = False  # spliced: keep the request out of the radix tree
    direct: tuple | None = None  # (slots, rows) spliced on the waiting queue, not yet admitted
    cut: bool = False  # the token array is cut at a stop (restore the full length on a fallback)
    retractions: int = 0  # times SGLang retracted or preempted the request after admission
    fallback: str | None = None  # why a step fell back to a plain read (for the event)
    held_lines: list | None = None  # splice lines of a waiting-queue splice, logged once it is admitted


class ScrRuntime:
    """Owns the side buffer, the state shadow and per-request plan state of one scheduler."""

    def __init__(self, policy: ScrPolicy, scheduler, events: EventWriter | None, leader: bool):
        self.policy, self.config = policy, policy.config
        self.scheduler = scheduler
        self.events = events
        self.leader = leader
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.req_to_token = scheduler.req_to_token_pool.req_to_token
        kv_pool = self.allocator.get_kvcache()
        mapping = getattr(kv_pool, "full_attention_layer_id_mapping", None)
        self.layers = sorted(mapping) if mapping else list(range(kv_pool.start_layer, kv_pool.end_layer))
        self.pool_kv = [kv_pool.get_kv_buffer(layer) for layer in self.layers]
        self.side = SideBuffer(self.pool_kv, self.config.side_sessions, self.config.side_tokens)
        mamba_pool = getattr(scheduler.req_to_token_pool, "mamba_pool", None)
        self.state = mamba_pool.mamba_cache if mamba_pool is not None else None
        self.shadow = (StateShadow(self.state.conv, self.state.temporal, self.config.side_sessions)
                       if self.state is not None and self.config.ssm else None)
        model_config = scheduler.model_config
        # Raises RotaryMismatch (the plugin turns it into a refusal to start, exit 2).
        self.rotary = text_rotary(scheduler.tp_worker.model_runner.model, self.layers,
                                  model_config.hf_text_config, getattr(model_config, "context_len", None))
        self.tokenizer = getattr(scheduler, "tokenizer", None)
        self._reqs: dict[str, _Request] = {}
        self.spliced_blocks = 0
        self.spliced_tokens = 0
        self.aborts = 0
        self.evict_retries = 0  # evict-then-retry attempts (§10.3), and how many then allocated
        self.evict_retries_ok = 0
        self.stolen = 0
        self._log(log_lines.scr_start_line(self.config.enabled, sglang.__version__, authors_env(self.config)))
        self._log(log_lines.site_banner(self.config, os.getpid()))
        self._log(log_lines.side_buffer_line(self.side.sessions, self.side.tokens, self.side.bytes_per_token))
        if self.shadow is not None:
            gib = (sum(c.numel() * c.element_size() for c in self.shadow.conv)
                   + self.shadow.temporal.numel() * self.shadow.temporal.element_size()) / 2**30
            self._log(log_lines.format_line("ssm_shadow", sessions=self.config.side_sessions, gib=gib))
        self._log(log_lines.format_line(
            "init", full_attn_layers=len(self.layers), rotary=self.rotary is not None, layers=self.layers[:8],
            pool_slots=int(self.allocator.size), snapshot_budget=self.config.side_sessions * self.config.side_tokens,
            evict_floor=int(self.allocator.size * self.config.evict_floor_frac),
        ))

    # ------------------------------------------------------------------ logging

    def _log(self, line: str, debug: bool = False) -> None:
        if not self.leader or (debug and not self.config.debug):
            return
        logger.info(line)

    def _trace(self, ev: str, **fields) -> None:
        if self.config.trace:
            self._log(log_lines.format_line("trace", ev=ev, fields=fields))

    # ------------------------------------------------------------------ H7: admission to a session

    def on_enqueue(self, scheduler, req, is_retracted: bool = False, *args, **kwargs) -> None:
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
            self._reqs[req.rid] = _Request(rid=req.rid, sid=None, outcome=Intercept("off", self.config),
                                           queued_ts=time.time(), fallback=f"admit: {exc}")
            return
        state = _Request(rid=req.rid, sid=outcome.sid, outcome=outcome, queued_ts=time.time())
        self._reqs[req.rid] = state
        self._contain("plan", req, state, self._arm_plan, req, state, outcome, tokens)

    def _arm_plan(self, req, state: _Request, outcome: Intercept, tokens) -> None:
        """Trace the admission and, for a plan, evaluate the state gate and build its cursor."""
        admission = outcome.admission
        if admission is None:
            return
        session = admission.session
        self._trace_request(req, outcome, tokens)
        for dropped in admission.evicted:
            self._trace_dropped(dropped)
        if outcome.kind == "passthrough":
            self._log(log_lines.format_line("passthrough", sid=session.sid, kept=outcome.kept,
                                            deleted=outcome.deleted, inserted=outcome.inserted), debug=True)
        if outcome.kind != "plan":
            return
        cfg = outcome.config
        state.gate = ssm_ready(
            mode=cfg.ssm_mode, rows=outcome.kept, has_mamba=self.state is not None,
            shadow_ready=self.shadow is not None,
            has_snapshot=outcome.side_slot is not None and outcome.side_slot < cfg.side_sessions,
            ssm_tokens=session.ssm_tokens,
        )
        state.cursor = _new_cursor(state)
        if len(outcome.blocks) > 1:
            self._log(log_lines.format_line(
                "multiblock_plan", rid=req.rid, num_blocks=len(outcome.blocks),
                stops=[b.new_start for b in outcome.blocks], reloc=[b.num_rows for b in outcome.blocks],
                kext=cfg.min_extend, maxb=cfg.max_blocks, cands=len(outcome.blocks), live=len(tokens),
            ), debug=True)

    def _trace_request(self, req, outcome: Intercept, tokens) -> None:
        if not self.config.trace:
            return  # the tag decodes tokens: not worth it for a line nobody prints
        admission = outcome.admission
        text = ""
        if self.tokenizer is not None:
            try:
                text = self.tokenizer.decode(list(tokens[:48]))
            except Exception:  # noqa: BLE001 - the tag is cosmetic
                text = ""
        self._log(log_lines.format_line(
            "trace_req", rid=req.rid, sid=admission.session.sid, slot=admission.session.side_slot,
            n_new=len(tokens), n_old=outcome.n_old, nsess=admission.num_sessions, tag=log_lines.trace_tag(text),
        ))

    def _trace_dropped(self, dropped) -> None:
        self._trace("drop_private", sid=dropped.sid, slot=dropped.side_slot, n_side=dropped.n_side)
        if dropped.side_slot is not None:
            self._trace("side_rel", slot=dropped.side_slot, sid=dropped.sid)

    # ------------------------------------------------------------------ H10: decide, phase 1, splice

    # ------------------------------------------------------------------ containment

    def _contain(self, step: str, req, state: _Request | None, fn, *args):
        """Run one SCR step; an exception ends in a plain read of this request, never a dead scheduler.

        SGLang's own code is never run in here (the AROUND hooks call ``original`` outside), so only
        failures of the policy are caught. The request keeps what is still correct (rows spliced
        before the failing step, when the forward after them already ran) and reads the rest."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - containment is the point
            logger.exception("[kvreuse] scr step %s failed for rid=%s", step, getattr(req, "rid", None))
            if state is not None:
                outcome = self._fall_back(req, state, f"{step}: {type(exc).__name__}: {exc}")
                logger.error(FALLBACK_LOG, req.rid, step, outcome, state.fallback)
            return None

    def _fall_back(self, req, state: _Request, reason: str) -> str:
        """Stop executing the plan and read the rest of the prompt normally; returns what happened."""
        state.fallback = state.fallback or reason
        state.cursor, state.phase1 = None, False
        if state.direct is not None:
            self._undo_direct_splice(req, state, replan=False)
        if state.cut and not req.finished():
            self._uncut(req)
        state.cut = False
        return "plain_read"

    @staticmethod
    def _uncut(req) -> None:
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids  # SGLang's array("q")
        if req.extend_range is not None:
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))

    # ------------------------------------------------------------------ H10: decide, phase 1, splice

    def init_round(self, original, req, tree_cache=None, cow_mamba=None, *args, **kwargs):
        state = self._reqs.get(req.rid)
        if state is not None and state.outside_tree and tree_cache is None:
            self._contain("advance_prefix", req, state, self._advance_prefix, req)
        result = original(req, tree_cache, cow_mamba, *args, **kwargs)
        if state is None or state.cursor is None:
            return result
        self._contain("round", req, state, self._round, req, state, tree_cache is not None)
        return result

    def _round(self, req, state: _Request, waiting_queue: bool) -> None:
        faults.check("scr.round", req.rid)
        if not state.phase1:
            if waiting_queue:
                self._decide(req, state)
            return
        self._continue_phase1(req, state, via="waiting queue" if waiting_queue else "chunked path")

    def _advance_prefix(self, req) -> None:
        """SGLang's stash skips a request marked ``skip_radix_cache_insert`` and so leaves its
        prefix at the previous chunk's start (sglang_internals §6.4): move it to the chunk's end."""
        end = req.extend_range.end
        if req.req_pool_idx is not None and end > len(req.prefix_indices):
            req.prefix_indices = self.req_to_token[req.req_pool_idx, :end].to(torch.int64)

    def _decide(self, req, state: _Request) -> None:
        """§7.2 at a waiting-queue pass, after SGLang's own prefix match."""
        radix_n0 = len(req.prefix_indices)
        chunked = self.scheduler.chunked_req
        decision = state.cursor.decide(radix_n0, chunked is not None and chunked is not req, state.gate.allow)
        if decision.action == "retry":
            self._log(log_lines.format_line("deferred_retry", rid=req.rid, attempt=state.cursor.retries,
                                            max_attempts=state.cursor.splice_retry))
            return
        if decision.action in ("drop", "gated"):
            reason = decision.reason or f"ssm gate: {state.gate.reason}"
            self._log(f"[kvreuse] kv6 rid={req.rid} plan not run ({decision.action}: {reason})", debug=True)
            state.cursor = None
            return
        if decision.action == "direct_splice":
            # The radix match ends exactly at the first stop: splice before admission (§7.2 step 8).
            state.radix_n0 = radix_n0
            self._splice(req, state, state.cursor.at_prefix(radix_n0), direct=True)
            return
        state.phase1, state.radix_n0 = True, radix_n0
        stop = state.cursor.stop
        self._cut(req, state, stop)
        block = state.cursor.blocks[0]
        cfg = state.outcome.config
        self._log(log_lines.format_line(
            "phase1", rid=req.rid, radix_n0=radix_n0, chunk1=stop - radix_n0, n_c=block.n_c,
            total=len(req.origin_input_ids), ssm_restore=state.gate.restore, ssm_mode=cfg.ssm_mode,
            ssm_na=self.state is None, ssm_obj=self.shadow is not None,
        ))

    @staticmethod
    def _cut(req, state: _Request, end: int) -> None:
        """Make the request end at ``end`` for this round (SGLang rebuilds the full array at the next)."""
        req.full_untruncated_fill_ids = req.full_untruncated_fill_ids[:end]
        req.set_extend_range(len(req.prefix_indices), end)
        state.cut = True

    def _continue_phase1(self, req, state: _Request, via: str) -> None:
        """§7.4: the request's prefix grew; read on, splice at the stop, or give up past it."""
        prefix = len(req.prefix_indices)
        step = state.cursor.at_prefix(prefix)
        if step == "read":
            self._cut(req, state, state.cursor.stop)
            self._log(f"[kvreuse] kv6 rid={req.rid} phase1 re-entry ({via}): prefix={prefix} "
                      f"stop={state.cursor.stop}", debug=True)
            return
        if step == "abort" or via == "waiting queue":
            self._abort(req, state, f"re-entered with prefix {prefix} beyond |A|+|B'| {state.cursor.stop}"
                        if step == "abort" else f"prefix {prefix} reached the stop on the waiting queue")
            return
        self._splice(req, state, step)

    def _abort(self, req, state: _Request, reason: str, restore_lengths: bool = False) -> None:
        """§10.2. The fallback state rule keeps the request's own state: block 1's restore is only
        armed inside its splice (a direct copy), so before it the own state covers A + B', and
        blocks >= 2 carry none (the authors' single-phase case, which arms a restore here, is not
        ported)."""
        if restore_lengths:
            self._uncut(req)
            state.cut = False
        state.cursor, state.phase1 = None, False
        self.aborts += 1
        self._log(log_lines.format_line("phase1_aborted", reason=reason, aborts=self.aborts))

    def _splice(self, req, state: _Request, splice: Splice, direct: bool = False) -> None:
        """§7.5: relocate one block's rows to the end of the prefix, then arm the next block.

        ``direct``: on the waiting queue, before admission; ``add_one_req`` undoes it if the
        request is not admitted this round (SGLang matches it again at the next pass).

        Order: allocate, guard, copy + re-rotate into the fresh slots, restore the state (block 1,
        fork), and only then attach the slots to the request, so a failure before the attach
        leaves the request exactly as phase 1 left it (a plain read of the rest is then exact)."""
        block, prefix = splice.block, len(req.prefix_indices)
        n = block.num_rows
        full_len = len(req.origin_input_ids) + len(req.output_ids)
        slot = state.outcome.side_slot
        if n <= 0 or slot is None or full_len - prefix - n < 1:
            self._give_up(req, state, f"nothing to splice (rows={n} slot={slot} left={full_len - prefix - n})")
            return
        if splice.arm_restore and (self.shadow is None or req.mamba_pool_idx is None):
            self._give_up(req, state, "no state slot to restore into")
            return
        if not self._guard(req, state, block, prefix):
            self._give_up(req, state, "side slot guard")
            return
        slots = self._alloc(n)
        if slots is None:
            self._log(log_lines.format_line("alloc_failed", n=n))
            self._give_up(req, state, "allocation failed")
            return
        cfg = state.outcome.config
        try:
            faults.check("scr.place_rows", req.rid)
            self._place_rows(slot, block.old_start, prefix, slots, rerotate=not cfg.no_rerotate)
            if splice.arm_restore:
                self._restore_state(req, state, slot)
        except Exception as exc:
            logger.error("[kvreuse] v6 splice failed (%s); freeing %d slots", exc, n)
            self.allocator.free(slots)
            raise
        self._attach(req, state, slots, n, direct)
        left = full_len - prefix - n
        self._emit(state, log_lines.format_line(
            "phase2", rid=req.rid, prefilled_chunk1=block.new_start - state.radix_n0 if splice.index == 1 else 0,
            reused_tail=n, extend2=left, total=full_len, rot_delta=prefix - block.old_start))
        self._emit(state, log_lines.format_line(
            "splice_ok", rid=req.rid, sid=state.sid, slot=slot, stop=prefix, relocated=n, extend=left,
            live=full_len, spliced=self.spliced_blocks, spliced_tokens=self.spliced_tokens, block=splice.index,
            num_blocks=len(state.cursor.blocks)))
        self._next_block(req, state, prefix + n)

    def _emit(self, state: _Request, line: str) -> None:
        """Log a splice line now, or, for a splice made on the waiting queue, once the request is
        admitted: an undone splice must leave no line (the accounting sums them)."""
        if state.direct is None:
            self._log(line)
        else:
            state.held_lines = [*(state.held_lines or []), line]

    def _guard(self, req, state: _Request, block, prefix: int) -> bool:
        """§7.5 step 5, made strict: the session must still hold the very side-slot acquisition the
        plan pinned (owner, slot and generation: a slot released and re-acquired since, by anyone,
        may hold another tenant's rows), and the stored ids must be the destination's ids."""
        n = block.num_rows
        slot = state.outcome.side_slot
        sessions = self.policy.sessions
        session = sessions.get(state.sid)
        pinned = sessions.holds(state.sid, slot, state.outcome.slot_generation)
        stored = tuple(session.side_ids[block.old_start:block.old_start + n]) if session is not None else ()
        ids_match = stored == tuple(req.origin_input_ids[prefix:prefix + n])
        if pinned and (ids_match or not state.outcome.config.t6_guard):
            return True
        self.stolen += 1
        self._log(log_lines.format_line(
            "slot_stolen", rid=req.rid, slot=slot, owner=sessions.owner(slot), sess=state.sid,
            row_start=block.old_start, row_end=block.old_start + n, ids_match=ids_match, stolen=self.stolen))
        return False

    def _attach(self, req, state: _Request, slots, n: int, direct: bool) -> None:
        """Append the filled slots to the request's prefix (§7.5 step 7)."""
        req.prefix_indices = torch.cat([req.prefix_indices.to(torch.int64), slots.to(torch.int64)])
        # SGLang counts the spliced rows again in prepare_for_extend: the authors' double count.
        req.cached_tokens += n
        if not state.outcome.config.relocated_in_tree:
            req.skip_radix_cache_insert = True
            state.outside_tree = True
        state.moved += n
        state.blocks += 1
        self.spliced_blocks += 1
        self.spliced_tokens += n
        if direct:
            state.direct = (slots, n)

    def _next_block(self, req, state: _Request, prefix: int) -> None:
        """§7.5 step 9: cut at the next block's stop and stay in phase 1 (a forced middle chunk,
        so nothing is sampled there, also after a splice on the waiting queue), or read the rest."""
        cursor = state.cursor
        remaining = len(cursor.blocks) - cursor.index - 1
        following = cursor.spliced_block()
        if following is not None:
            block = cursor.blocks[cursor.index]
            self._cut(req, state, following)
            state.phase1 = True
            self._emit(state, log_lines.format_line(
                "multiblock_next", rid=req.rid, block=cursor.index + 1, num_blocks=len(cursor.blocks),
                start=prefix, end=following, rows=block.num_rows))
            return
        if remaining > 0:
            block = cursor.blocks[cursor.index + 1]
            self._log(log_lines.format_line(
                "multiblock_drop", rid=req.rid, block=cursor.index + 2, num_blocks=len(cursor.blocks),
                stop=block.new_start, prefix=prefix, abandoned=remaining))
        state.cursor, state.phase1 = None, False
        if state.cut:
            self._uncut(req)
            state.cut = False

    def _give_up(self, req, state: _Request, reason: str) -> None:
        """A block could not be spliced: read the rest of the prompt normally (§7.5 steps 1-5)."""
        self._log(f"[kvreuse] kv6 rid={req.rid} block {state.cursor.index + 1} not spliced ({reason}) "
                  "-> normal prefill of the tail", debug=True)
        state.cursor, state.phase1 = None, False
        if state.cut:
            self._uncut(req)
            state.cut = False

    def _alloc(self, n: int):
        """Fresh KV slots, with the authors' evict-then-retry once (§10.3)."""
        slots = self.allocator.alloc(n)
        if slots is not None or not self.config.evict_on_alloc_fail:
            return slots
        tree = self.scheduler.tree_cache
        avail = self.allocator.available_size()
        evictable = tree.full_evictable_size() if hasattr(tree, "full_evictable_size") else tree.evictable_size()
        floor = int(self.allocator.size * self.config.evict_floor_frac)
        if evictable + avail < n + floor:
            self._log(log_lines.format_line("evict_declined", avail=avail, evictable=evictable, need=n, floor=floor))
            return None
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        wanted = n - avail + self.config.evict_margin
        tree.evict(EvictParams(num_tokens=wanted))
        evicted = self.allocator.available_size() - avail
        slots = self.allocator.alloc(n)
        self.evict_retries += 1
        self.evict_retries_ok += slots is not None
        self._log(log_lines.format_line("evict_retry", requested=wanted, evicted=evicted,
                                        retry="OK" if slots is not None else "FAIL", ok=self.evict_retries_ok,
                                        total=self.evict_retries))
        return slots

    def _place_rows(self, slot: int, old_start: int, new_start: int, dst: torch.Tensor, rerotate: bool) -> None:
        """§5.3 + §8.3: side rows -> fresh pool slots; keys re-rotated from old to new positions."""
        n = dst.numel()
        device = dst.device
        rows = torch.arange(old_start, old_start + n, device=device)
        self.side.load(slot, rows, self.pool_kv, dst)
        if not rerotate or old_start == new_start:
            return
        new = torch.arange(new_start, new_start + n, device=device)
        table = self.rotary.cos_sin_cache
        for keys, _values in self.pool_kv:
            keys[dst] = rerotate_keys_from_cache(keys[dst], rows, new, table)

    # ------------------------------------------------------------------ H8, H9: keep phase 1 chunked

    def add_one_req(self, original, adder, req, *args, **kwargs):
        from sglang.srt.managers.schedule_policy import AddReqResult

        state = self._reqs.get(req.rid)
        if getattr(adder, FORCED, False):
            # A phase-1 request owns this round; a splice made on the waiting queue for this
            # request must give its slots back (it is matched and planned again next round).
            if state is not None and state.direct is not None:
                self._contain("undo_direct", req, state, self._undo_direct_splice, req, state)
            return AddReqResult.OTHER
        in_phase1 = state is not None and state.cursor is not None and state.phase1
        has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
        if in_phase1 and (has_chunked or adder.new_chunked_req is not None):
            self._abort(req, state, "another request is already chunked", restore_lengths=True)
            in_phase1 = False
        result = original(adder, req, *args, **kwargs)
        if state is None:
            return result
        admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
        self._contain("admit_round", req, state, self._after_add, adder, req, state, admitted, in_phase1)
        return result

    def _after_add(self, adder, req, state: _Request, admitted: bool, in_phase1: bool) -> None:
        if state.direct is not None:
            if not admitted:
                self._undo_direct_splice(req, state)
                return
            state.direct = None
            for line in state.held_lines or ():
                self._log(line)
            state.held_lines = None
        if in_phase1 and admitted and state.cursor is not None:
            if req.extend_range.end > state.cursor.stop:
                self._abort(req, state, f"admitted extend ends at {req.extend_range.end} > |A|+|B'| {state.cursor.stop}")
            elif adder.new_chunked_req is None or adder.new_chunked_req is req:
                adder.new_chunked_req = req  # a middle chunk: nothing is sampled at the stop
                setattr(adder, FORCED, True)
            else:
                self._abort(req, state, "another request became the chunked request")

    def _undo_direct_splice(self, req, state: _Request, replan: bool = True) -> None:
        """The request waits another round: return the slots, plan again at its next pass.

        Everything the splice set is undone: prefix, cached count, tree exclusion, and a cut at a
        second block's stop (the next match rebuilds the full array anyway)."""
        slots, n = state.direct
        state.held_lines = None
        self.allocator.free(slots)
        req.prefix_indices = req.prefix_indices[: state.radix_n0]
        req.cached_tokens -= n
        req.skip_radix_cache_insert = False
        state.direct, state.outside_tree, state.phase1 = None, False, False
        if state.cut:
            self._uncut(req)
            state.cut = False
        state.moved -= n
        state.blocks -= 1
        self.spliced_blocks -= 1
        self.spliced_tokens -= n
        state.cursor = _new_cursor(state) if replan else None
        self._log(f"[kvreuse] kv6 rid={req.rid} direct splice undone (not admitted this round)", debug=True)

    def add_chunked_req(self, original, adder, req):
        state = self._reqs.get(req.rid)
        if state is None or state.cursor is None or not state.phase1 or len(req.prefix_indices) >= state.cursor.stop:
            return original(adder, req)
        original(adder, req)
        setattr(adder, FORCED, True)
        return req  # stays the chunked request even when the cut array was read to its end

    # ------------------------------------------------------------------ H4: state snapshot at prefill end

    def after_prefill(self, result, processor, batch, *args, **kwargs):
        if self.shadow is None or self.config.ssm_snap != "prefill_end":
            return result
        for req in batch.reqs:
            state = self._reqs.get(req.rid)
            if (state is None or state.sid is None or state.cursor is not None or req.finished()
                    or req.mamba_pool_idx is None):
                continue
            self._contain("save_state", req, state, self._save_state, req, state, req.extend_range.end)
        return result

    def _save_state(self, req, state: _Request, n_tokens: int) -> None:
        """§9.2: the request's recurrent state -> the shadow row of its session's side slot.

        The count is set to -1 first, so a failed copy leaves no snapshot that claims to be valid."""
        sessions = self.policy.sessions
        sessions.set_state_tokens(state.sid, -1)
        session = sessions.get(state.sid)
        had_slot = session.side_slot is not None
        slot = sessions.acquire_slot(state.sid)
        if slot is None:
            return
        if not had_slot:
            self._trace("side_acq", slot=slot, sid=state.sid, free=len(sessions.free_slots))
        index = int(req.mamba_pool_idx)
        faults.check("scr.save_state", req.rid)
        self.shadow.save(slot, self.state.conv, self.state.temporal, index)
        sessions.set_state_tokens(state.sid, n_tokens)
        state.state_saved = True
        self._trace("ssm_save", rid=req.rid, sid=state.sid, slot=slot, midx=index, n=n_tokens)

    def _restore_state(self, req, state: _Request, slot: int) -> None:
        """§9.4 (fork): overwrite the request's state with the previous prompt's saved state.

        The request's own state is kept aside first: if the copy fails half-way, it is put back,
        so the fallback (a plain read from the stop) starts from the state phase 1 left."""
        # Nothing staged may overwrite the restored state at the next forward (spec §9.6); what was
        # staged (a copy-on-write from the matched node, or a clear) comes back if the restore fails.
        staged = (req.mamba_cow_src_index, req.mamba_needs_clear)
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
        index = int(req.mamba_pool_idx)
        own = self.shadow.copy_row(self.state.conv, self.state.temporal, index)
        before = float(self.state.temporal[:, index].abs().sum()) if self.config.trace else 0.0
        try:
            faults.check("scr.restore_state", req.rid)
            self.shadow.restore(slot, self.state.conv, self.state.temporal, index)
        except Exception:
            self.shadow.put_row(own, self.state.conv, self.state.temporal, index)
            req.mamba_cow_src_index, req.mamba_needs_clear = staged
            raise
        if not self.config.trace:
            return
        # The trace's checksums read the state back (a device sync on GPU): only when traced.
        after = float(self.state.temporal[:, index].abs().sum())
        shadow = float(self.shadow.temporal[:, slot].abs().sum())
        self._trace("ssm_restore", rid=req.rid, slot=slot, midx=index, sid=state.sid,
                    before=round(before, 3), shadow=round(shadow, 3), after=round(after, 3))

    # ------------------------------------------------------------------ H2: side store, events

    def on_release(self, req, tree_cache=None, *args, **kwargs) -> None:
        state = self._reqs.get(req.rid)
        if state is None:
            return
        if not req.finished():
            # Retracted or preempted: SGLang frees every row of the request (spliced ones too) and
            # queues it again; it is read again without relocation, and released again at its end.
            self._contain("retract", req, state, self._retracted, req, state)
            return
        del self._reqs[req.rid]
        if state.sid is not None:
            self._contain("store", req, state, self._store, req, state)
        self._contain("event", req, None, self._write_event, req, state)

    def _retracted(self, req, state: _Request) -> None:
        state.retractions += 1
        if state.cursor is not None or state.moved:
            state.fallback = state.fallback or "retracted: read again without relocation"
        state.cursor, state.phase1, state.direct, state.cut = None, False, None, False
        state.outside_tree = False
        req.skip_radix_cache_insert = False
        logger.warning(FALLBACK_LOG, req.rid, "retract", "plain_read", "retracted or preempted")

    def _store(self, req, state: _Request) -> None:
        """§5.2: copy the rows that changed into the session's side slot (or drop the session).

        A failure while copying drops the session's private data (its slot may be half written)."""
        sessions = self.policy.sessions
        if req.req_pool_idx is None:
            sessions.finish(state.sid, (), store=False)
            return
        kv_len = req.effective_kv_committed_len()
        committed = (list(req.origin_input_ids) + list(req.output_ids))[:kv_len]
        had_slot = sessions.get(state.sid).side_slot is not None
        store = sessions.finish(state.sid, committed, store=True)
        if store.slot is not None:
            if not had_slot:
                self._trace("side_acq", slot=store.slot, sid=state.sid, free=len(sessions.free_slots))
            if store.end > store.keep:
                src = self.req_to_token[req.req_pool_idx, :kv_len].to(torch.int64)
                try:
                    faults.check("scr.side_store", req.rid)
                    self.side.store(store.slot, self.pool_kv, src, store.keep, store.end)
                except Exception:
                    self._trace_dropped(sessions.drop_private(state.sid))
                    raise
            self._trace("snap", sid=state.sid, slot=store.slot, keep=store.keep, n=store.end, prev=store.prev)
        if store.dropped is not None:
            self._log(f"[kvreuse] {state.sid} side store skipped ({store.reason})", debug=True)
            self._trace_dropped(store.dropped)
        cfg = state.outcome.config
        if (cfg.ssm_snap == "release" and cfg.ssm_mode != "strict" and self.shadow is not None
                and store.slot is not None and req.mamba_pool_idx is not None):
            self._save_state(req, state, kv_len)
        elif not state.state_saved:
            # Finished on its first token (or never read its prompt through): an older state
            # must not pair with this turn's K/V.
            sessions.set_state_tokens(state.sid, -1)
            self._log(log_lines.format_line("ssm_dropped", rid=req.rid, sid=state.sid))

    def _write_event(self, req, state: _Request) -> None:
        """The raw accounting: ``prefix_reused = cached_tokens - 2 * moved`` (SGLang counts each
        relocated row twice), with no clamping, so check I1 sees any error in the rule."""
        if self.events is None:
            return
        prompt = len(req.origin_input_ids)
        reused = req.cached_tokens - 2 * state.moved
        self.events.write(RequestEvent(
            rid=req.rid, policy=self.policy.name, prompt_tokens=prompt, prefix_reused=reused,
            moved=state.moved, read=prompt - reused - state.moved, decode_tokens=len(req.output_ids),
            cache_salt=req.extra_key, plan_resume=None, finish_reason=finish_type(req.finished_reason),
            queued_ts=state.queued_ts, finished_ts=time.time(), blocks=state.blocks,
            fallback=state.fallback, retractions=state.retractions, match_cap=match_cap(req, prompt),
        ))

    def on_abort(self, scheduler, recv_req) -> None:
        """BEFORE ``Scheduler.abort_request``: a request popped from the waiting queue never reaches
        ``release_kv_cache``; count it out of its session (nothing stored, no event: it read nothing)
        and give back a splice made on the waiting queue."""
        for rid in aborted_waiting(scheduler, recv_req):
            state = self._reqs.pop(rid, None)
            if state is None:
                continue
            if state.direct is not None:
                slots, _ = state.direct
                self.allocator.free(slots)
            if state.sid is not None and self.policy.sessions.get(state.sid) is not None:
                self._contain("abort", None, None, self.policy.sessions.finish, state.sid, (), False)

    # ------------------------------------------------------------------ idle

    def on_idle(self, scheduler, *args, **kwargs) -> None:
        if not scheduler.is_fully_idle():
            return
        if self._reqs:
            # Requests aborted before admission never reach release_kv_cache.
            logger.error(STALE_LOG, len(self._reqs), sorted(self._reqs)[:5])
            for state in self._reqs.values():
                if state.sid is not None and self.policy.sessions.get(state.sid) is not None:
                    self.policy.sessions.finish(state.sid, (), store=False)
            self._reqs.clear()
        try:
            self.policy.check()
        except AssertionError:
            # An inconsistent session table is a bug to see, not a reason to stop serving.
            logger.exception("[kvreuse] scr invariant check failed")


def _new_cursor(state: _Request) -> SpliceCursor:
    """The plan's execution from its first block (at admission, or again after an undone splice)."""
    outcome = state.outcome
    return SpliceCursor(outcome.blocks, outcome.lead_new_end, outcome.config.splice_retry, state.gate.restore)


def authors_env(config: ScrConfig) -> dict[str, str]:
    """The authors' ``config.DEFAULTS`` keys as this server runs them (for their ``[scr]`` line):
    our settings where a field exists, the process environment for the dead ones."""
    values = {var: getattr(config, name) for name, var in ENV_VARS.items() if var in AUTHORS_DEFAULTS}
    text = {var: ("1" if v else "0") if isinstance(v, bool) else str(v) for var, v in values.items()}
    return {**os.environ, **text}
