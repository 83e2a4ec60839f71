"""Exact's states kept inside a forward (``keeps=inside``, docs/exact.md §5.14): the tree's side.

Around each forward of the scheduler (``Scheduler.run_batch``):

1. ``arm``: for every request of an extend batch, the plan's keep points strictly inside this
   forward (``PolicyExecutor.inner_keeps``) get a Mamba-pool slot each, and the GDN layers are told
   to write the state there (``patches.state_keeps.set_pending``, ``patches/gdn_keep_hooks.py``).
2. the forward runs; the pending keeps are cleared whatever happens.
3. ``commit``: each kept state enters the tree with the KV before its point, ascending, through
   SGLang's own ``cache_unfinished_req`` for the prefix ``[0, point)`` with the request's state slot
   pointed at the kept one for that one call (SGLang copies it into the node's own slot), so the
   node, its lock and the request's protected length are what a forward that ended at the point
   would have left. The request keeps its own rows after the point. This runs before SGLang's
   result processing, whose ``cache_unfinished_req`` then handles the forward's end as before.

A keep that cannot be armed (no free slot even after eviction, or any failure before the forward)
or committed is dropped and counted in the request's event (``fallback``); a dropped keep only means a later prompt resumes
earlier, never other bits.
"""

from __future__ import annotations

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from patches import state_keeps
from patches.state_keeps import StateKeep


class InnerKeeps:
    """The keeps armed for the forward now running: rid -> [(position, kind, slot)], each slot a
    0-d tensor like ``Req.mamba_pool_idx``."""

    def __init__(self, tree):
        self.tree = tree
        self.armed: dict[str, list[tuple[int, str, torch.Tensor]]] = {}

    def run(self, original, scheduler, batch, *args, **kwargs):
        """AROUND ``Scheduler.run_batch``: arm, run the forward, commit."""
        if batch is None or not batch.forward_mode.is_extend() or batch.forward_mode.is_target_verify():
            return original(scheduler, batch, *args, **kwargs)
        self.arm(batch.reqs)
        try:
            result = original(scheduler, batch, *args, **kwargs)
        except BaseException:
            self.drop_all()
            raise
        finally:
            state_keeps.clear()
        self.commit(batch.reqs)
        return result

    def arm(self, reqs) -> None:
        keeps: list[StateKeep] = []
        for sequence, req in enumerate(reqs):
            try:
                keeps += self.arm_request(sequence, req)
            except Exception as exc:  # noqa: BLE001 - a keep not armed is safe; tell the event
                self.tree.executor.keep_dropped(req, None, f"{type(exc).__name__}: {exc}")
        state_keeps.set_pending(keeps)

    def arm_request(self, sequence: int, req) -> list[StateKeep]:
        """Slots for the keep points inside ``req``'s forward (``sequence``: its place in the
        batch), armed for ``commit``; its keeps for the GDN layers."""
        start, end = len(req.prefix_indices), len(req.get_fill_ids())
        points = self.tree.executor.inner_keeps(req, start, end)
        if not points:
            return []
        slots = self.alloc(len(points))
        if slots is None:
            self.tree.executor.keep_dropped(req, points[0][0], "no free state slot")
            return []
        try:
            physical = self.tree.req_to_token_pool.translate_mamba_indices(slots).tolist()
        except BaseException:
            self.tree.req_to_token_pool.mamba_allocator.free(slots)
            raise
        self.armed[req.rid] = [(position, kind, slots[j]) for j, (position, kind) in enumerate(points)]
        return [StateKeep(sequence, position - start, physical[j]) for j, (position, _) in enumerate(points)]

    def alloc(self, count: int) -> torch.Tensor | None:
        allocator = self.tree.req_to_token_pool.mamba_allocator
        slots = allocator.alloc(count)
        if slots is None:
            self.tree.evict(EvictParams(num_tokens=0, mamba_num=count))
            slots = allocator.alloc(count)
        return slots

    def commit(self, reqs) -> None:
        for req in reqs:
            for position, kind, slot in self.armed.pop(req.rid, []):
                try:
                    self.insert(req, position, kind, slot)
                except Exception as exc:  # noqa: BLE001 - a keep not made is safe; tell the event
                    self.tree.executor.keep_dropped(req, position, f"{type(exc).__name__}: {exc}")
                finally:
                    self.tree.req_to_token_pool.mamba_allocator.free(slot.view(-1))
        self.drop_all()

    def drop_all(self) -> None:
        """Free the slots of keeps never committed (the forward failed, or its request is gone)."""
        for entries in self.armed.values():
            for _, _, slot in entries:
                self.tree.req_to_token_pool.mamba_allocator.free(slot.view(-1))
        self.armed.clear()

    def insert(self, req, position: int, kind: str, slot: torch.Tensor) -> None:
        """SGLang's insert of ``[0, position)`` with the state in ``slot``; the request then holds
        the tree's rows before ``position`` and its own after.

        ``req.prefix_indices`` is left as long as before the forward (where it started), with the
        rows the insert may have swapped for the tree's: SGLang caches a chunked request's forward
        only while its prefix is shorter than what it read (``Scheduler.get_new_batch_prefill``),
        and that call is where the forward's end is kept or not."""
        ids = req.get_fill_ids()
        start = len(req.prefix_indices)
        keys = self.tree.executor.tree_keys(req, ids[:position]) or ids[:position]
        own_slot = req.mamba_pool_idx
        req.get_fill_ids, req.mamba_pool_idx = (lambda: keys), slot
        try:
            UnifiedRadixCache.cache_unfinished_req(self.tree, req, chunked=True)
        finally:
            del req.get_fill_ids
            req.mamba_pool_idx = own_slot
        row = self.tree.req_to_token_pool.req_to_token[req.req_pool_idx, :start]
        req.prefix_indices = row.to(dtype=torch.int64, copy=True)
        self.tree.kept(req, position, kind)
