"""The ``exact`` policy inside SGLang 0.5.16: a ``UnifiedRadixCache`` that executes its plans.

Registered as radix-cache backend ``exact`` (the launcher adds ``--radix-cache-backend exact`` with
``ExactPolicy.server_settings``). SGLang's no_buffer strategy already copies the recurrent state
bit for bit at every forward end and inserts it with the KV read so far; this class only decides
where that is allowed: ``match_prefix`` resumes where the plan resumes (stock: at the deepest state on
the path), ``cache_unfinished_req`` inserts only at the plan's keep points (stock: at every forward
end; elsewhere the KV stays request-owned), ``cache_finished_req`` inserts nothing (stock: prompt,
output and final state). Design: docs/exact.md §5.4, §5.5, §5.11; hooks: docs/ARCHITECTURE.md.

The cache asks for the plan itself (``PolicyExecutor.plan_in_tree``): it needs what only the tree
walk knows, the tree match and the snapshot depths on that path. Every prefill forward is
checked against the plan's pieces (``PolicyExecutor.piece_done``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache_components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.distributed.parallel_state import get_tp_group
from sglang.srt.runtime_context import get_parallel

from patches import process
from patches.exact_inner_keeps import InnerKeeps
from patches.request_book import piece_shortfall
from patches.tp_rows import all_gather_rows
from policy.ranks import failed_ranks, own_row

BACKEND_NAME = "exact"


class ExactRadixCache(UnifiedRadixCache):
    """No policy logic here: where to resume and what to keep come from the executor's plan."""

    executor = None  # this tree's executor, set on the instance by ``attach`` once it exists
    inner = None  # its ``InnerKeeps`` (states kept inside a forward), set by ``attach``

    def match_prefix(self, params: MatchPrefixParams):
        req = params.req
        if req is None or self.executor is None or self.disable:
            return super().match_prefix(params)  # internal re-matches after an insert
        key = self.keyed(req, params.key)
        tree_match, states = self.walk(key)
        try:
            resume = self.executor.plan_in_tree(req, tree_match, states).resume
        except Exception as exc:  # noqa: BLE001 - not even a cold read could be planned: end the request
            self.executor.abort(req, "plan", exc)
            resume = 0
        limited = RadixKey(key.token_ids, key.extra_key, limit=resume, is_bigram=key.is_bigram)
        result = super().match_prefix(MatchPrefixParams(key=limited, cow_mamba=params.cow_mamba, req=req))
        if len(result.device_indices) != resume:
            # Resuming anywhere but the plan's resume breaks bit-identity: end this request, not the server.
            problem = AssertionError(
                f"exact: {req.rid} planned to resume at {resume}, the tree served "
                f"{len(result.device_indices)} (snapshot depths on the path: {states})")
            self.executor.abort(req, "match", problem)
        return result

    def keyed(self, req, key: RadixKey) -> RadixKey:
        """``key`` under the tree's keys for ``req`` (``CachePolicy.tree_keys``; exact with cut=messages
        each token also names the end of the piece that reads it, so rows read by another piece
        never match); unchanged under the grid rule."""
        keys = self.executor.tree_keys(req, key.token_ids)
        if keys is None:
            return key
        return RadixKey(keys, key.extra_key, limit=key.limit, is_bigram=key.is_bigram)

    def walk(self, key: RadixKey) -> tuple[int, tuple[int, ...]]:
        """The tree match of ``key`` (the depth of its longest cached prefix) and the snapshot depths
        along it.

        A read-only walk (no node splits, no LRU updates): the real match follows.
        """
        node, depth, states = self.root_node, 0, []
        remaining = key
        while len(remaining) > 0:
            child = node.children.get(remaining.child_key(self.page_size))
            if child is None or child.evicted:
                break
            shared = child.key.match(remaining, page_size=self.page_size)
            depth += shared
            if shared < len(child.key):
                break
            node = child
            if node.component_data[ComponentType.MAMBA].value is not None:
                states.append(depth)
            remaining = remaining[shared:]
        return depth, tuple(states)

    def cache_unfinished_req(self, req, chunked: bool = False, **kwargs) -> None:
        if self.executor is None or self.disable:
            return super().cache_unfinished_req(req, chunked=chunked, **kwargs)
        end = len(req.get_fill_ids())
        kind = self.executor.piece_done(req, end)
        same_on_every_rank(req.rid, end, kind)
        if kind is None:
            # Not a keep point: nothing enters the tree; the request keeps its own KV rows.
            row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :end]
            req.prefix_indices = row.to(dtype=torch.int64, copy=True)
            return None
        keys = self.executor.tree_keys(req, req.get_fill_ids())
        if keys is None:
            super().cache_unfinished_req(req, chunked=chunked, **kwargs)
        else:
            # SGLang builds the insert key from ``req.get_fill_ids()``: the tree's keys for this one call.
            req.get_fill_ids = lambda: keys
            try:
                super().cache_unfinished_req(req, chunked=chunked, **kwargs)
            finally:
                del req.get_fill_ids
        self.kept(req, end, kind)
        return None

    def kept(self, req, position: int, kind: str) -> None:
        """A state of ``req`` entered the tree at ``position`` (at a forward's end, or inside one:
        ``patches/exact_inner_keeps.py``): the request's event, and the dump when asked for."""
        self.executor.snapshot_written(req, position, kind)
        path = self.executor.policy.snapshot_file(req.rid, position, get_parallel().tp_rank)
        if path:
            self.dump_snapshot(req, path)

    def dump_snapshot(self, req, path: str) -> None:
        """Write this rank's shard of the state just kept (every layer's conv window and SSM state)."""
        slot = int(req.last_node.component_data[ComponentType.MAMBA].value[0])
        cache = self.req_to_token_pool.mamba_pool.mamba_cache
        state = {"conv": [conv[:, slot].clone() for conv in cache.conv], "temporal": cache.temporal[:, slot].clone()}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(state, path)

    def cache_finished_req(self, req, is_insert: bool = True, **kwargs) -> None:
        if self.executor is None:
            return super().cache_finished_req(req, is_insert=is_insert, **kwargs)
        # Nothing made while decoding is reused, and the tail piece stays private.
        return super().cache_finished_req(req, is_insert=False, **kwargs)


def same_on_every_rank(rid: str, end: int, kind: str | None) -> None:
    """docs/tensor_parallel.md §3: under TP every rank's forward of ``rid`` ends at ``end`` and keeps
    ``kind`` there, or ``RanksDisagree`` (never contained) stops the server."""
    if (size := get_parallel().tp_size) > 1:
        step = f"piece end={end} keep={kind}"
        failed_ranks(all_gather_rows(own_row(step, rid, False), size, get_tp_group().cpu_group), step, rid)


def whole_piece_budget(original, adder, req):
    """AROUND ``PrefillAdder.add_chunked_req``: a continuation forward covers exactly the plan's next piece.

    SGLang cuts a chunked request's next forward at ``min(chunk budget, free tokens)``. The chunk
    budget is narrowed to the piece (under cut=messages a piece may be shorter than B), and a
    short free-token count must not cut the piece either: stock code already over-commits the
    budget when free tokens reach 0 (it must schedule the chunked request); this extends that to
    a short budget, by the shortfall, for this one call.
    """
    executor = process.executor()
    piece = executor.next_piece_len(req) if executor else None
    shortfall = piece_shortfall(piece, int(adder.rem_total_tokens))
    adder.rem_total_token_offset -= shortfall
    try:
        with chunk_budget(adder, piece):
            return original(adder, req)
    finally:
        adder.rem_total_token_offset += shortfall


def planned_first_piece(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_one_req``: a new request's first forward is the plan's first piece.

    The chunk budget is narrowed to that piece, so SGLang either reads the whole rest (the tail
    piece) or truncates exactly at the next cut; when the step's budget cannot hold the piece,
    the request waits (a piece is never shortened, docs/exact.md §1.5)."""
    executor = process.executor()
    piece = executor.next_piece_len(req) if executor else None
    if piece is not None and adder.rem_chunk_tokens is not None and adder.rem_chunk_tokens < piece:
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.OTHER
    with chunk_budget(adder, piece):
        return original(adder, req, *args, **kwargs)


@contextmanager
def chunk_budget(adder, piece: int | None):
    """Within the block the adder's chunk budget is ``piece`` tokens; after it, the budget it had,
    less what the block used."""
    saved = adder.rem_chunk_tokens
    if piece is None or saved is None:
        yield
        return
    adder.rem_chunk_tokens = piece
    try:
        yield
    finally:
        adder.rem_chunk_tokens = saved - (piece - adder.rem_chunk_tokens)


def exact_cache_factory(ctx):
    """``register_radix_cache_backend`` factory: a FULL + MAMBA tree of ``ExactRadixCache``."""
    if not ctx.is_hybrid_ssm:
        raise ValueError("--cache-policy exact serves hybrid recurrent models (GDN + attention) only")
    if ctx.enable_hierarchical_cache:
        raise ValueError("--cache-policy exact does not support --enable-hierarchical-cache")
    ctx.params.tree_components = (ComponentType.FULL, ComponentType.MAMBA)
    return ExactRadixCache(ctx.params)


def attach(scheduler, executor, spec) -> None:
    """Give the scheduler's exact tree its executor; a scheduler with another tree cannot run exact."""
    if not isinstance(scheduler.tree_cache, ExactRadixCache):
        raise process.fail(f"policy {spec.policy} needs --radix-cache-backend exact, "
                           f"the scheduler built {type(scheduler.tree_cache).__name__}")
    scheduler.tree_cache.executor = executor
    scheduler.tree_cache.inner = InnerKeeps(scheduler.tree_cache)
    # Every forward's length comes from the plan (``planned_first_piece``, ``whole_piece_budget``),
    # so SGLang must not round a first forward to another grid (deterministic mode sets one).
    scheduler.truncation_align_size = None


def run_batch(original, scheduler, batch, *args, **kwargs):
    """AROUND ``Scheduler.run_batch``: the exact tree keeps the states its plans keep inside this
    forward (``InnerKeeps.run``); SGLang's own call while no tree is attached."""
    inner = getattr(scheduler.tree_cache, "inner", None)
    if inner is None:
        return original(scheduler, batch, *args, **kwargs)
    return inner.run(original, scheduler, batch, *args, **kwargs)


def register_backend() -> None:
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, exact_cache_factory)
