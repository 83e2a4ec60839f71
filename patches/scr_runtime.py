"""The engine port of a policy's step carrier on SGLang 0.5.16 (``policy.carrier.EnginePort``):
the orders the carrier gives, carried out on SGLang's objects.

The one executor (``patches/executor.py``) receives SGLang's calls and asks the step carrier; the
carrier decides and orders through this port, in its three parts: allocation (``KvSlots``: fresh
slots, room, eviction), the tree prefix (``RequestPrefix``: what a request has in place, its cut
token array, slots attached or detached) and the stored states (``StoredStates``: the tensor copies
of ``scr_tensors`` between a request and the policy's side slots). Nothing here decides what a
request gets, and nothing of the policy is read but its ``side_stores`` decision. Built by the
``enqueue`` hook set (``patches/hook_sets.py``); SCR is the one policy that uses it today.
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import os
from functools import partial

import sglang
import torch

from patches.scr_tensors import ScrTensors
from patches.tp_rows import all_gather_rows
from policy.carrier import Committed, EngineFacts, RequestFacts, Restored, Room, StepPolicy

logger = logging.getLogger(__name__)


class ScrEngine:
    """One scheduler's SGLang objects, as the step carrier sees them (``policy.carrier.EnginePort``).
    Building it sizes and allocates the policy's side stores (``StepPolicy.side_stores``)."""

    def __init__(self, policy: StepPolicy, scheduler):
        self.scheduler = scheduler
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.tensors = t = ScrTensors(scheduler, policy)
        self.tokenizer = getattr(scheduler, "tokenizer", None)
        self.about = EngineFacts(
            version=sglang.__version__, pid=os.getpid(), environ=os.environ, pool_slots=int(self.allocator.size),
            layers=tuple(t.layers), rotary=t.rotary is not None, state_pool=t.state is not None,
            side_bytes_per_token=t.kv_bytes_per_token if t.side is not None else None,
            shadow_bytes=t.shadow_bytes if t.shadow is not None else None)
        # Port methods SGLang's allocator and the tensors have as they are.
        self.alloc, self.free = self.allocator.alloc, self.allocator.free
        self.place, self.store_rows = t.place, t.store
        self.exchange = partial(all_gather_rows, size=scheduler.ps.tp_size, group=scheduler.tp_cpu_group)

    # ------------------------------------------------------------------ allocation (KvSlots)

    def room(self) -> Room:
        tree = self.scheduler.tree_cache
        evictable = tree.full_evictable_size() if hasattr(tree, "full_evictable_size") else tree.evictable_size()
        return Room(self.about.pool_slots, self.allocator.available_size(), evictable)

    def evict(self, tokens: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.scheduler.tree_cache.evict(EvictParams(num_tokens=tokens))

    # ------------------------------------------------------------------ the tree prefix (RequestPrefix)

    def facts(self, req) -> RequestFacts:
        return RequestFacts(
            prompt=req.origin_input_ids, prefix_len=len(req.prefix_indices),
            full_len=len(req.origin_input_ids) + len(req.output_ids),
            extend_end=req.extend_range.end if req.extend_range is not None else None, finished=req.finished(),
            has_state_slot=req.mamba_pool_idx is not None)

    def committed(self, req) -> Committed | None:
        if req.req_pool_idx is None:
            return None
        kv_len = req.effective_kv_committed_len()
        return Committed(kv_len, (list(req.origin_input_ids) + list(req.output_ids))[:kv_len], req.req_pool_idx)

    def advance_prefix(self, req) -> None:
        """SGLang's stash skips a request marked ``skip_radix_cache_insert`` and so leaves its
        prefix at the previous chunk's start (docs/sglang.md §6.4): move it to the chunk's end."""
        end = req.extend_range.end
        if req.req_pool_idx is not None and end > len(req.prefix_indices):
            req.prefix_indices = self.tensors.prefix_rows(req.req_pool_idx, end)

    def cut(self, req, end: int | None) -> None:
        if end is not None:
            req.full_untruncated_fill_ids = req.full_untruncated_fill_ids[:end]
            req.set_extend_range(len(req.prefix_indices), end)
            return
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

    # ------------------------------------------------------------------ the stored states (StoredStates)

    def restore_state(self, req, side_slot: int, checksums: bool) -> Restored:
        """§9.4 (fork): overwrite the request's state with the previous prompt's saved state. Keeps
        its own state and what was staged (a copy-on-write from the matched node, or a clear, which
        must not overwrite the restored state at the next forward: spec §9.6), for ``undo_restore``.
        The checksums read the state back (a device sync on GPU): only when asked."""
        index = int(req.mamba_pool_idx)
        kept = (index, self.tensors.shadow.own(index), req.mamba_cow_src_index, req.mamba_needs_clear)
        req.mamba_cow_src_index, req.mamba_needs_clear = None, False
        before = self.tensors.state_sum(index) if checksums else 0.0
        try:
            self.tensors.shadow.restore(side_slot, index)
        except Exception:
            self.undo_restore(req, Restored(index, None, kept))
            raise
        sums = (before, self.tensors.state_sum(slot=side_slot), self.tensors.state_sum(index)) if checksums else None
        return Restored(index, sums, kept)

    def undo_restore(self, req, restored: Restored) -> None:
        """The request's own state and staged copy back, as ``restore_state`` found them."""
        index, own, req.mamba_cow_src_index, req.mamba_needs_clear = restored.kept
        self.tensors.shadow.put_back(index, own)

    def save_state(self, req, side_slot: int) -> int:
        index = int(req.mamba_pool_idx)
        self.tensors.shadow.save(side_slot, index)
        return index

    # ------------------------------------------------------------------ the rest of the port

    def decode(self, tokens) -> str:
        try:
            return self.tokenizer.decode(list(tokens)) if self.tokenizer is not None else ""
        except Exception:  # noqa: BLE001 - the tag is cosmetic
            return ""
