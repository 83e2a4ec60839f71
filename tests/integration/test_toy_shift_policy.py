"""The toy policy that relocates (``tests/unit/toy_shift_policy.py``, written from docs/ARCHITECTURE.md
"How to add a policy") through the code that serves SCR, with no executor change: the ``enqueue``
hook set's executor (``patches.hook_sets.enqueue_executor``), the engine port
(``patches/scr_runtime.py``) and its tensors (``patches/scr_tensors.py``, ``patches/rope.py``), on
SGLang's objects reduced to the fields they read and write (as ``scr_fake_engine.py`` does).

The fake model writes each key as RoPE of a per-token vector at its position, computed here in
float64 from the rotary's frequencies; the model's cos/sin table the port re-rotates with is the
same rotary rounded to float32. A relocated row must then hold the key a cold read writes at its
new position (to float32 rounding), and its value and unrotated channels bit for bit."""

from __future__ import annotations

import types

import pytest
import torch

from patches import hook_sets, scr_tensors
from policy.events import read_events
from serving.event_writer import EventWriter
from tests.integration.scr_fake_engine import Alloc
from tests.unit.toy_shift_policy import ShiftConfig, ShiftPolicy

NS = types.SimpleNamespace
LAYERS, HEADS, HEAD_DIM, ROTARY_DIM = (3, 7), 2, 16, 8
POOL, CONTEXT = 2048, 512
INV_FREQ = 1.0 / (1e4 ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float64) / ROTARY_DIM))


def table(rows: int) -> torch.Tensor:
    """The model's cos ‖ sin table (SGLang's layout), in float32."""
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * INV_FREQ[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32)


def vector(token: int, layer: int, which: int) -> torch.Tensor:
    """The pre-RoPE key (``which`` 0) or the value (1) of ``token`` at ``layer``: fixed per token."""
    g = torch.Generator().manual_seed(token * 1009 + layer * 17 + which)
    return torch.randn(HEADS, HEAD_DIM, generator=g, dtype=torch.float64)


def key_at(token: int, layer: int, position: int) -> torch.Tensor:
    """RoPE (NeoX halves of the first ``ROTARY_DIM`` channels) of the token's key at ``position``,
    in float64: what a cold read writes, computed without the port's table or code."""
    k = vector(token, layer, 0)
    half = ROTARY_DIM // 2
    cos, sin = (position * INV_FREQ).cos(), (position * INV_FREQ).sin()
    first, second = k[:, :half], k[:, half:ROTARY_DIM]
    return torch.cat([first * cos - second * sin, second * cos + first * sin, k[:, ROTARY_DIM:]], dim=-1)


class KVPool:
    full_attention_layer_id_mapping = {layer: i for i, layer in enumerate(LAYERS)}

    def __init__(self):
        self.kv = {layer: (torch.zeros(POOL + 1, HEADS, HEAD_DIM), torch.zeros(POOL + 1, HEADS, HEAD_DIM))
                   for layer in LAYERS}

    def get_kv_buffer(self, layer):
        return self.kv[layer]


class Finished:
    def to_json(self):
        return {"type": "length"}


class Req:
    def __init__(self, rid, ids, extra_key=None):
        self.rid, self.origin_input_ids, self.output_ids, self.extra_key = rid, list(ids), [], extra_key
        self.finished_reason = self.to_finish = None
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.full_untruncated_fill_ids, self.extend_range = list(ids), None
        self.cached_tokens, self.kv_committed = 0, 0
        self.skip_radix_cache_insert = False
        self.req_pool_idx = self.mamba_pool_idx = None

    def finished(self):
        return self.finished_reason is not None

    def set_extend_range(self, start, end):
        self.extend_range = NS(start=start, end=end)

    def effective_kv_committed_len(self):
        return self.kv_committed

    def set_finish_with_abort(self, message):
        raise AssertionError(f"refused: {message}")


class Server:
    """One scheduler with the toy's executor, and the scheduling points a request passes."""

    def __init__(self, tmp_path, monkeypatch, **config):
        monkeypatch.setattr(scr_tensors, "text_rotary", lambda *args, **kwargs: NS(cos_sin_cache=table(CONTEXT)))
        self.pool = KVPool()
        self.alloc = Alloc(self.pool, POOL)
        self.req_to_token = torch.zeros((8, CONTEXT), dtype=torch.int32)
        self.scheduler = NS(
            token_to_kv_pool_allocator=self.alloc, req_to_token_pool=NS(req_to_token=self.req_to_token),
            model_config=NS(hf_text_config=None, context_len=CONTEXT), tp_worker=NS(model_runner=NS(model=None)),
            tokenizer=None, chunked_req=None, waiting_queue=[], is_fully_idle=lambda: True,
            ps=NS(tp_rank=0, tp_size=1), tp_cpu_group=None, tree_cache=NS(full_evictable_size=lambda: 0))
        self.policy = ShiftPolicy(ShiftConfig(**config))
        self.events_path = str(tmp_path / "events.jsonl")
        self.executor = hook_sets.enqueue_executor(self.scheduler, self.policy, EventWriter(self.events_path), True)
        self.rows = 0

    def enqueue(self, req):
        self.executor.on_enqueue(self.scheduler, req)

    def match(self, req, slots: torch.Tensor):
        """A waiting-queue pass: the tree serves ``slots`` (the first ``len(slots)`` tokens)."""
        if req.req_pool_idx is None:
            req.req_pool_idx, self.rows = self.rows, self.rows + 1

        def original(r, tree_cache, cow_mamba, *args, **kwargs):
            r.prefix_indices = slots.clone()
            r.full_untruncated_fill_ids = r.origin_input_ids + r.output_ids
            r.set_extend_range(len(slots), len(r.full_untruncated_fill_ids))

        self.executor.init_round(original, req, self.scheduler.tree_cache, None)

    def admit(self, req, admitted: bool = True):
        adder = NS(can_run_list=[], new_chunked_req=None)

        def original(a, r, *args, **kwargs):
            if admitted:
                a.can_run_list.append(r)

        self.executor.add_one_req(original, adder, req, has_chunked_req=False)

    def forward(self, req):
        """Read ``[len(prefix), extend_end)``: fresh slots, each key RoPE'd at its position. SGLang
        counts the prefix in ``cached_tokens`` (relocated rows a second time)."""
        start, end = len(req.prefix_indices), req.extend_range.end
        row = self.req_to_token[req.req_pool_idx]
        row[:start] = req.prefix_indices.to(torch.int32)
        new = self.alloc.alloc(end - start)
        row[start:end] = new.to(torch.int32)
        for slot, position in zip(new.tolist(), range(start, end)):
            token = req.origin_input_ids[position]
            for layer, (keys, values) in self.pool.kv.items():
                keys[slot] = key_at(token, layer, position).to(torch.float32)
                values[slot] = vector(token, layer, 1).to(torch.float32)
        req.prefix_indices = row[:end].to(torch.int64)
        req.cached_tokens += start
        req.kv_committed = end
        self.executor.after_prefill(None, None, NS(reqs=[req]))

    def release(self, req, decoded: int = 3):
        req.output_ids = [1_000_000 + i for i in range(decoded)]
        req.kv_committed = len(req.origin_input_ids) + decoded - 1
        req.finished_reason = Finished()
        self.executor.on_release(req, self.scheduler.tree_cache)

    def serve(self, req, tree: torch.Tensor):
        self.enqueue(req)
        self.match(req, tree)
        self.admit(req)
        self.forward(req)
        self.release(req)

    def slots_of(self, req, end: int) -> torch.Tensor:
        return self.req_to_token[req.req_pool_idx, :end].to(torch.int64)

    def event(self, rid):
        return next(e for e in read_events(self.events_path) if e.rid == rid)


def tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(50_000, generator=g)[:n].add(100).tolist()


FIRST = tokens(1, 64)
AT, OFFSET = 20, 4
# The second turn drops FIRST[20:24]: FIRST[24:] moves 4 positions back to [20, 60), then 10 new tokens.
SECOND = FIRST[:AT] + FIRST[AT + OFFSET:] + tokens(2, 10)
ROWS = len(FIRST) - AT - OFFSET  # 40


def assert_cold_keys_and_values(server, req, positions):
    """The rows at ``positions`` of ``req`` hold what a cold read of its prompt writes there."""
    slots = server.slots_of(req, len(req.origin_input_ids))
    for layer, (keys, values) in server.pool.kv.items():
        for position in positions:
            token, slot = req.origin_input_ids[position], int(slots[position])
            assert torch.allclose(keys[slot].double(), key_at(token, layer, position), atol=1e-5, rtol=0), position
            assert torch.equal(values[slot], vector(token, layer, 1).to(torch.float32)), position


def finish_cold_equal(server, req) -> None:
    """Admit ``req``, read the rest of its prompt, release it; every row of its prompt then holds
    what a cold read writes there."""
    server.admit(req)
    server.forward(req)
    server.release(req)
    assert_cold_keys_and_values(server, req, range(len(req.origin_input_ids)))


def first_turn(server) -> Req:
    first = Req("t.1", FIRST)
    server.serve(first, torch.empty(0, dtype=torch.int64))
    return first


def test_the_plan_relocates_the_rows_after_the_gap():
    policy = ShiftPolicy(ShiftConfig())
    policy.kept(FIRST + [1_000_000, 1_000_001], None)
    from policy.api import Arrival, Read, Relocate

    plan = policy.plan(Arrival("t.2", tuple(SECOND), None, 0))
    assert plan.steps == (Read(0, AT), Relocate(AT, ROWS, AT + OFFSET, 0), Read(AT + ROWS, len(SECOND)))
    assert plan.resume_limit == AT and plan.admission.kind == "relocate"
    elsewhere = policy.plan(Arrival("t.3", tuple(SECOND), "another key", 0))
    assert elsewhere.relocations() == [] and elsewhere.admission.kind == "read"


def test_relocated_rows_hold_the_keys_a_cold_read_writes_at_their_new_positions(tmp_path, monkeypatch):
    server = Server(tmp_path, monkeypatch)
    first = first_turn(server)
    stored_key_rows = {layer: keys[server.slots_of(first, len(FIRST))].clone() for layer, (keys, _) in server.pool.kv.items()}
    second = Req("t.2", SECOND)
    server.enqueue(second)
    server.match(second, server.slots_of(first, AT))  # the tree holds the first turn's prefix
    assert len(second.prefix_indices) == AT + ROWS and second.skip_radix_cache_insert  # relocated before admission
    finish_cold_equal(server, second)  # reads only [60, 70)
    # The rotary rule is what makes them right: without re-rotation a moved key keeps its old position.
    moved = server.slots_of(second, AT + ROWS)[AT:]
    for layer, (keys, _) in server.pool.kv.items():
        unrotated = stored_key_rows[layer][AT + OFFSET:]
        assert (keys[moved] - unrotated)[..., :ROTARY_DIM].abs().max() > 0.1
        assert torch.equal(keys[moved][..., ROTARY_DIM:], unrotated[..., ROTARY_DIM:])
    event = server.event("t.2")
    assert (event.prefix_reused, event.moved, event.read, event.blocks) == (AT, ROWS, len(SECOND) - AT - ROWS, 1)
    assert (event.fallback, server.executor._tracked) == (None, {})


def test_a_request_not_admitted_gives_the_slots_back_and_relocates_at_its_next_pass(tmp_path, monkeypatch):
    server = Server(tmp_path, monkeypatch)
    first = first_turn(server)
    second = Req("t.2", SECOND)
    server.enqueue(second)
    free = server.alloc.available_size()
    server.match(second, server.slots_of(first, AT))
    assert server.alloc.available_size() == free - ROWS
    server.admit(second, admitted=False)
    assert server.alloc.available_size() == free and len(second.prefix_indices) == AT
    assert not second.skip_radix_cache_insert and second.cached_tokens == 0
    server.match(second, server.slots_of(first, AT))
    finish_cold_equal(server, second)
    assert (server.event("t.2").moved, server.event("t.2").prefix_reused) == (ROWS, AT)


def test_side_rows_replaced_since_the_plan_are_not_moved_and_the_prompt_is_read(tmp_path, monkeypatch):
    server = Server(tmp_path, monkeypatch)
    first = first_turn(server)
    second = Req("t.2", SECOND)
    server.enqueue(second)
    server.serve(Req("other", tokens(3, 64)), torch.empty(0, dtype=torch.int64))  # its rows replace the slot's
    server.match(second, server.slots_of(first, AT))
    assert len(second.prefix_indices) == AT
    finish_cold_equal(server, second)
    event = server.event("t.2")
    assert (event.prefix_reused, event.moved, event.read) == (AT, 0, len(SECOND) - AT)


@pytest.mark.parametrize("tree_hit", [0, AT - 1])
def test_a_match_short_of_the_gap_reads_the_prompt_from_there(tmp_path, monkeypatch, tree_hit):
    """The tree lost part of the prefix (evicted): the carrier moves nothing, the rest is read."""
    server = Server(tmp_path, monkeypatch)
    first = first_turn(server)
    second = Req("t.2", SECOND)
    server.enqueue(second)
    server.match(second, server.slots_of(first, tree_hit))
    assert len(second.prefix_indices) == tree_hit
    finish_cold_equal(server, second)
    assert (server.event("t.2").moved, server.event("t.2").read) == (0, len(SECOND) - tree_hit)
