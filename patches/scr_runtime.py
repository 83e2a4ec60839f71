"""SCR's engine port on SGLang 0.5.16 (``scr.steps.Engine``): the orders SCR's step carrier gives,
carried out on SGLang's objects.

The one executor (``patches/executor.py``) receives SGLang's calls and asks the step carrier; the
carrier decides and orders through this port: answer questions about a request (prefix length,
prompt, does it hold a recurrent-state slot), cut the token array, attach or detach slots, allocate
and evict, and the tensor copies of ``scr_tensors``. Nothing here decides what a request gets.
Built by the ``enqueue`` hook set (``patches/hook_sets.py``).
"""
# Spec: docs/scr.md

from __future__ import annotations

import logging
import os
from functools import partial

import sglang
import torch

from patches.scr_tensors import ScrTensors
from policy.api import RequestFacts
from patches.tp_rows import all_gather_rows

logger = logging.getLogger(__name__)


class ScrEngine:
    """One scheduler's SGLang objects, as the step carrier sees them (``scr.steps.Engine``)."""

    def __init__(self, policy, scheduler):
        self.policy, self.scheduler = policy, scheduler
        self.allocator = scheduler.token_to_kv_pool_allocator
        self.tensors = t = ScrTensors(scheduler, policy)
        self.tokenizer = getattr(scheduler, "tokenizer", None)
        self.has_state_pool, self.has_shadow = t.state is not None, t.shadow is not None
        self.pool_size = int(self.allocator.size)
        # Port methods SGLang's allocator and the tensors have as they are.
        self.alloc, self.free, self.available = self.allocator.alloc, self.allocator.free, self.allocator.available_size
        self.place, self.store_rows = t.place, t.store
        self.exchange = partial(all_gather_rows, size=scheduler.ps.tp_size, group=scheduler.tp_cpu_group)
        self.steps = None  # the carrier, for its trace lines (``started``)

    def started(self, steps) -> None:
        """The carrier exists: it prints the start-up lines (the authors' order)."""
        self.steps = steps
        t = self.tensors
        steps.start(sglang.__version__, os.getpid(), os.environ,
                    bytes_per_token=t.memory.kv_bytes_per_token if t.side is not None else None,
                    shadow_gib=t.memory.shadow_bytes / 2**30 if self.has_shadow else None, layers=t.layers,
                    rotary=t.rotary is not None, pool_slots=self.pool_size)

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
            self.steps.trace("ssm_restore", rid=req.rid, slot=side_slot, midx=index, sid=sid, before=round(before, 3),
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

    def decode(self, tokens) -> str:
        try:
            return self.tokenizer.decode(list(tokens)) if self.tokenizer is not None else ""
        except Exception:  # noqa: BLE001 - the tag is cosmetic
            return ""
