"""SCR inside a scheduler process on SGLang 0.5.16: the hooks' entry points and the engine port.

``scr_hooks`` forwards SGLang's calls here; each entry point reads what it needs off SGLang's
objects and calls the pure ``scr.runner.Runner``, which decides and orders. The port methods below
(``scr.runner.Engine``) are the orders carried out on SGLang's objects: cut a request's token array,
attach or detach slots, allocate and evict, and the tensor copies of ``scr_tensors``. Nothing here
decides what a request gets.
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import os
from functools import partial

import sglang
import torch

from serving.request_book import finish_type
from serving.event_writer import EventWriter
from patches.executor import aborted_waiting, match_cap
from patches.scr_tensors import ScrTensors
from patches.tp_rows import all_gather_rows
from scr import lines
from scr.policy import ScrPolicy
from scr.runner import RequestFacts, Runner

logger = logging.getLogger(__name__)

FORCED = "_scr_forced_chunk"  # set on a PrefillAdder whose round belongs to a phase-1 request


class ScrRuntime:
    """The SGLang side of one scheduler's ``Runner`` (``core``), and its ``Engine``."""

    def __init__(self, policy: ScrPolicy, scheduler, events: EventWriter | None, leader: bool):
        self.policy, self.scheduler, self.events = policy, scheduler, events
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.tensors = t = ScrTensors(scheduler, policy.config)
        self.tokenizer = getattr(scheduler, "tokenizer", None)
        self.has_state_pool, self.has_shadow = t.state is not None, t.shadow is not None
        self.pool_size = int(self.allocator.size)
        # Port methods SGLang's allocator, the tensors and the event writer have as they are.
        self.alloc, self.free, self.available = self.allocator.alloc, self.allocator.free, self.allocator.available_size
        self.place, self.store_rows, self.write_event = t.place, t.store, getattr(events, "write", None)
        self.exchange = partial(all_gather_rows, size=scheduler.ps.tp_size, group=scheduler.tp_cpu_group)
        self.core = Runner(policy, self, logger, leader)
        for line in lines.startup_lines(
                policy.config, sglang.__version__, os.getpid(), os.environ,
                bytes_per_token=t.memory.kv_bytes_per_token if t.side is not None else None,
                shadow_gib=t.memory.shadow_bytes / 2**30 if self.has_shadow else None, layers=t.layers,
                rotary=t.rotary is not None, pool_slots=self.pool_size):
            self.core.say(line)

    # ------------------------------------------------------------------ hooks (``patches/scr_hooks.py``)

    def on_enqueue(self, scheduler, req, is_retracted: bool = False, *args, **kwargs) -> None:
        """H7: session match, diff and block plan (``Runner.admit``)."""
        if is_retracted or req.finished() or req.to_finish is not None:
            return
        refusal = self.core.admit(req, req.rid, tuple(req.origin_input_ids), req.extra_key,
                                  getattr(req, "session_id", None))
        if refusal is not None:
            req.set_finish_with_abort(refusal)

    def init_round(self, original, req, tree_cache=None, cow_mamba=None, *args, **kwargs):
        """H10: after SGLang's match (waiting queue) or its chunk stash (chunked path), move the plan on."""
        self.core.before_round(req, req.rid, chunked_path=tree_cache is None)
        result = original(req, tree_cache, cow_mamba, *args, **kwargs)
        chunked = self.scheduler.chunked_req
        self.core.after_round(req, req.rid, tree_cache is not None, chunked is not None and chunked is not req)
        return result

    def add_one_req(self, original, adder, req, *args, **kwargs):
        """H8: a phase-1 request must be the round's chunked request, and owns the round."""
        from sglang.srt.managers.schedule_policy import AddReqResult

        if getattr(adder, FORCED, False):
            self.core.not_admitted(req, req.rid)
            return AddReqResult.OTHER
        has_chunked = kwargs.get("has_chunked_req", args[0] if args else False)
        in_phase1 = self.core.before_admission(req, req.rid, bool(has_chunked or adder.new_chunked_req is not None))
        result = original(adder, req, *args, **kwargs)
        admitted = bool(adder.can_run_list) and adder.can_run_list[-1] is req
        chunk_free = adder.new_chunked_req is None or adder.new_chunked_req is req
        if self.core.after_admission(req, req.rid, admitted, in_phase1, chunk_free):
            adder.new_chunked_req = req
            setattr(adder, FORCED, True)
        return result

    def add_chunked_req(self, original, adder, req):
        """H9: phase 1 stays the chunked request until its stop, even when the cut array was read."""
        if not self.core.keeps_chunk(req.rid, len(req.prefix_indices)):
            return original(adder, req)
        original(adder, req)
        setattr(adder, FORCED, True)
        return req

    def after_prefill(self, result, processor, batch, *args, **kwargs):
        """H4: the state snapshot at prefill end (§9.2)."""
        for req in batch.reqs:
            self.core.after_prefill(req, req.rid)
        return result

    def on_release(self, req, tree_cache=None, *args, **kwargs) -> None:
        """H2: store the turn's rows in the side buffer, write the request's event."""
        self.core.release(req, req.rid, req.finished())

    def on_abort(self, scheduler, recv_req) -> None:
        """BEFORE ``Scheduler.abort_request``: requests it pops from the waiting queue never reach
        ``release_kv_cache``."""
        for req in aborted_waiting(scheduler, recv_req):
            self.core.forget(req.rid)

    def on_idle(self, scheduler, *args, **kwargs) -> None:
        if scheduler.is_fully_idle():
            self.core.idle()

    # ------------------------------------------------------------------ the engine port (``scr.runner.Engine``)

    def facts(self, req) -> RequestFacts:
        return RequestFacts(
            prompt=req.origin_input_ids, prefix_len=len(req.prefix_indices),
            full_len=len(req.origin_input_ids) + len(req.output_ids),
            extend_end=req.extend_range.end if req.extend_range is not None else None, finished=req.finished(),
            has_state_slot=req.mamba_pool_idx is not None)

    def committed(self, req):
        if req.req_pool_idx is None:
            return None
        kv_len = req.effective_kv_committed_len()
        return kv_len, (list(req.origin_input_ids) + list(req.output_ids))[:kv_len], req.req_pool_idx

    def advance_prefix(self, req) -> None:
        """SGLang's stash skips a request marked ``skip_radix_cache_insert`` and so leaves its
        prefix at the previous chunk's start (docs/sglang.md §6.4): move it to the chunk's end."""
        end = req.extend_range.end
        if req.req_pool_idx is not None and end > len(req.prefix_indices):
            req.prefix_indices = self.tensors.prefix_rows(req.req_pool_idx, end)

    def cut(self, req, end: int) -> None:
        req.full_untruncated_fill_ids = req.full_untruncated_fill_ids[:end]
        req.set_extend_range(len(req.prefix_indices), end)

    def uncut(self, req) -> None:
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids  # SGLang's array("q")
        if req.extend_range is not None:
            req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))

    def attach(self, req, slots, rows: int, outside_tree: bool) -> None:
        req.prefix_indices = torch.cat([req.prefix_indices.to(torch.int64), slots.to(torch.int64)])
        # SGLang counts the relocated rows again in prepare_for_extend: the authors' double count.
        req.cached_tokens += rows
        if outside_tree:
            req.skip_radix_cache_insert = True

    def detach(self, req, prefix_len: int, rows: int) -> None:
        req.prefix_indices = req.prefix_indices[:prefix_len]
        req.cached_tokens -= rows
        self.include_in_tree(req)

    def include_in_tree(self, req) -> None:
        req.skip_radix_cache_insert = False

    def evictable(self) -> int:
        tree = self.scheduler.tree_cache
        return tree.full_evictable_size() if hasattr(tree, "full_evictable_size") else tree.evictable_size()

    def evict(self, tokens: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.scheduler.tree_cache.evict(EvictParams(num_tokens=tokens))

    def restore_state(self, req, side_slot: int, sid: str):
        """§9.4 (fork): overwrite the request's state with the previous prompt's saved state. Returns
        its own state and what was staged (a copy-on-write from the matched node, or a clear, which
        must not overwrite the restored state at the next forward: spec §9.6), for ``undo_restore``."""
        index, trace = int(req.mamba_pool_idx), self.policy.config.trace
        kept = (index, self.tensors.shadow.own(index), req.mamba_cow_src_index, req.mamba_needs_clear)
        req.mamba_cow_src_index, req.mamba_needs_clear = None, False
        before = self.tensors.state_sum(index) if trace else 0.0
        try:
            self.tensors.shadow.restore(side_slot, index)
        except Exception:
            self.undo_restore(req, kept)
            raise
        if trace:  # the checksums read the state back (a device sync on GPU): only when traced
            self.core.trace("ssm_restore", rid=req.rid, slot=side_slot, midx=index, sid=sid, before=round(before, 3),
                            shadow=round(self.tensors.state_sum(slot=side_slot), 3),
                            after=round(self.tensors.state_sum(index), 3))
        return kept

    def undo_restore(self, req, kept) -> None:
        """The request's own state and staged copy back, as ``restore_state`` found them."""
        index, own, req.mamba_cow_src_index, req.mamba_needs_clear = kept
        self.tensors.shadow.put_back(index, own)

    def save_state(self, req, side_slot: int) -> int:
        index = int(req.mamba_pool_idx)
        self.tensors.shadow.save(side_slot, index)
        return index

    def event_facts(self, req) -> dict | None:
        if self.events is None:
            return None
        prompt = len(req.origin_input_ids)
        return dict(prompt_tokens=prompt, cached_tokens=req.cached_tokens, decode_tokens=len(req.output_ids),
                    cache_salt=req.extra_key, finish_reason=finish_type(req.finished_reason),
                    match_cap=match_cap(req, prompt))

    def decode(self, tokens) -> str:
        try:
            return self.tokenizer.decode(list(tokens)) if self.tokenizer is not None else ""
        except Exception:  # noqa: BLE001 - the tag is cosmetic
            return ""
