"""A fake engine for SCR's path through the one executor (``patches/executor.py`` with SCR's step
carrier over ``patches/scr_runtime.py``): SGLang's objects reduced to the fields they
read and write (requests, the KV pool and allocator, the recurrent-state pool, the prefill
adder), driven through fixed scenarios: one and two blocks, waiting-queue relocations (kept and
undone), retraction, a busy chunked slot, phase 1 past its stop, evict-then-retry, aborts,
injected faults, a stolen side slot.

``transcript()`` returns what the runtime printed and did, one line per event, normalised (no pids,
no times). ``test_scr_runtime_replay.py`` compares it with a transcript recorded before the
runtime's decisions moved into ``scr/`` (tinygrad's "process replay" for refactors): any change in
a log line, an event field, a request field or a tensor checksum shows up as a diff.
"""

from __future__ import annotations

import json
import logging
import re
import types

import torch

from patches import hook_sets
from patches import scr_runtime as rt
from patches import scr_tensors
from policy import faults
from scr.policy import ScrPolicy
from scr.settings import ScrConfig

NS = types.SimpleNamespace
OUT: list[str] = []


# The rotary the runtime re-rotates with: SGLang's cos ‖ sin table layout, rotary_dim 8, base 1e4.
_INV_FREQ = 1.0 / (1e4 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
_ANGLES = torch.arange(20000, dtype=torch.float)[:, None] * _INV_FREQ[None, :]
ROT = NS(cos_sin_cache=torch.cat([_ANGLES.cos(), _ANGLES.sin()], dim=-1))

POOL = 30000  # KV slots


class KVPool:
    full_attention_layer_id_mapping = {3: 0, 7: 1}

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.kv = {l: (torch.randn(POOL + 1, 2, 16, generator=g), torch.randn(POOL + 1, 2, 16, generator=g))
                   for l in (3, 7)}

    def get_kv_buffer(self, layer):
        return self.kv[layer]


class Alloc:
    """SGLang's token-to-KV allocator as the engine port uses it: slots 1..size (0 is the padding
    slot), handed out from the front of a free list. Also the toy relocating policy's allocator."""

    def __init__(self, pool, size: int = POOL):
        self.size = size
        self.free_list = list(range(1, size + 1))
        self.pool = pool

    def get_kvcache(self):
        return self.pool

    def alloc(self, n):
        if n > len(self.free_list):
            return None
        out = torch.tensor(self.free_list[:n], dtype=torch.int64)
        del self.free_list[:n]
        return out

    def free(self, t):
        self.free_list.extend(int(x) for x in t.tolist())

    def available_size(self):
        return len(self.free_list)


class Tree:
    def __init__(self, alloc):
        self.alloc = alloc
        self.reserve = []

    def full_evictable_size(self):
        return len(self.reserve)

    def evict(self, params):
        n = min(params.num_tokens, len(self.reserve))
        self.alloc.free_list.extend(self.reserve[:n])
        del self.reserve[:n]


class Req:
    def __init__(self, rid, ids, extra_key=None):
        self.rid, self.origin_input_ids, self.output_ids, self.extra_key = rid, list(ids), [], extra_key
        self.finished_reason = self.to_finish = None
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.full_untruncated_fill_ids = list(ids)
        self.extend_range = None
        self.cached_tokens = 0
        self.skip_radix_cache_insert = False
        self.req_pool_idx = self.mamba_pool_idx = self.mamba_cow_src_index = None
        self.mamba_needs_clear = False
        self.kv_committed = 0

    def finished(self):
        return self.finished_reason is not None

    def set_extend_range(self, s, e):
        self.extend_range = NS(start=s, end=e)

    def effective_kv_committed_len(self):
        return self.kv_committed

    def set_finish_with_abort(self, msg):
        self.finished_reason = NS(to_json=lambda: {"type": "abort"})
        OUT.append(f"ABORT {self.rid} {msg}")


class Events:
    def write(self, ev):
        keep = ("rid", "prompt_tokens", "prefix_reused", "moved", "read", "decode_tokens", "cache_salt",
                "finish_reason", "blocks", "fallback", "retractions", "match_cap")
        OUT.append("EVENT " + json.dumps({k: getattr(ev, k, None) for k in keep}, sort_keys=True))


def make(config):
    pool = KVPool()
    alloc = Alloc(pool)
    g = torch.Generator().manual_seed(1)
    mamba = NS(conv=[torch.randn(2, 32, 4, 3, generator=g)], temporal=torch.randn(2, 32, 2, 4, 4, generator=g))
    sched = NS(token_to_kv_pool_allocator=alloc,
               req_to_token_pool=NS(req_to_token=torch.zeros((16, 20000), dtype=torch.int32),
                                    mamba_pool=NS(mamba_cache=mamba)),
               model_config=NS(hf_text_config=None, context_len=20000), tp_worker=NS(model_runner=NS(model=None)),
               tokenizer=None, chunked_req=None, waiting_queue=[], is_fully_idle=lambda: True,
               ps=NS(tp_rank=0, tp_size=1), tp_cpu_group=None)
    sched.tree_cache = Tree(alloc)
    runtime = hook_sets.enqueue_executor(sched, ScrPolicy(config), Events(), True)
    return NS(rt=runtime, sched=sched, alloc=alloc, pool=pool, mamba=mamba, next_pool=[0], next_state=[0])


def snap(env, req, tag):
    OUT.append(f"REQ {tag} {req.rid} prefix={req.prefix_indices.tolist()[-3:]}/{len(req.prefix_indices)} "
               f"cached={req.cached_tokens} skip={req.skip_radix_cache_insert} fill={len(req.full_untruncated_fill_ids)} "
               f"ext={None if req.extend_range is None else (req.extend_range.start, req.extend_range.end)} "
               f"cow={req.mamba_cow_src_index} clear={req.mamba_needs_clear} fin={req.finished()}")


def enqueue(env, req, **kw):
    env.rt.on_enqueue(env.sched, req, **kw)
    snap(env, req, "enq")


def match(env, req, n, slots=None):
    """Waiting-queue pass: the tree serves the first n tokens (``slots``, or fresh ones)."""

    if req.req_pool_idx is None:
        req.req_pool_idx = env.next_pool[0]
        env.next_pool[0] += 1
        req.mamba_pool_idx = torch.tensor([env.next_state[0]])
        env.next_state[0] += 1

    def original(r, tree_cache, cow, *a, **k):
        r.prefix_indices = slots[:n] if slots is not None else torch.arange(20001, 20001 + n, dtype=torch.int64)
        r.full_untruncated_fill_ids = r.origin_input_ids + r.output_ids
        r.set_extend_range(n, len(r.full_untruncated_fill_ids))
        r.mamba_cow_src_index = 5 if n else None

    env.rt.init_round(original, req, env.sched.tree_cache, None)
    snap(env, req, "match")


def admit(env, req, has_chunked=False, forced=False, admit_it=True):
    from patches.executor import FORCED

    adder = NS(can_run_list=[], new_chunked_req=None)
    if forced:
        setattr(adder, FORCED, True)

    def original(a, r, *args, **kw):
        if admit_it:
            a.can_run_list.append(r)
        return "ADDED"

    res = env.rt.add_one_req(original, adder, req, has_chunked_req=has_chunked)
    OUT.append(f"ADD {req.rid} -> {res} chunked={getattr(adder.new_chunked_req, 'rid', None)} "
               f"forced={getattr(adder, FORCED, False)}")
    snap(env, req, "add")
    return adder


def forward(env, req):
    """Compute [len(prefix), extend_end): fresh slots, KV written, the state row advanced."""
    if req.req_pool_idx is None:
        req.req_pool_idx = env.next_pool[0]
        env.next_pool[0] += 1
        req.mamba_pool_idx = torch.tensor([env.next_state[0]])
        env.next_state[0] += 1
    start, end = len(req.prefix_indices), req.extend_range.end
    row = env.sched.req_to_token_pool.req_to_token[req.req_pool_idx]
    row[:start] = req.prefix_indices.to(torch.int32)
    new = env.alloc.alloc(end - start)
    row[start:end] = new.to(torch.int32)
    ids = (req.origin_input_ids + req.output_ids)
    tok = torch.tensor(ids[start:end], dtype=torch.float32)
    pos = torch.arange(start, end, dtype=torch.float32)
    for layer, (k, v) in env.pool.kv.items():
        k[new] = ((tok % 97) * 0.01 + pos * 0.001 + layer)[:, None, None]
        v[new] = ((tok % 89) * 0.02)[:, None, None]
    idx = int(req.mamba_pool_idx)
    env.mamba.temporal[:, idx] += float(sum(ids[start:end]) % 13)
    env.mamba.conv[0][:, idx] += float(end % 7)
    req.kv_committed = end
    env.rt.after_prefill("RESULT", None, NS(reqs=[req]))
    snap(env, req, "fwd")


def chunk_next(env, req):
    """The chunked path: SGLang stashes the chunk, then calls init_next_round_input(None)."""

    def original(r, tree_cache, cow, *a, **k):
        if not r.skip_radix_cache_insert:
            r.prefix_indices = env.sched.req_to_token_pool.req_to_token[r.req_pool_idx, :r.extend_range.end].to(
                torch.int64)
        r.full_untruncated_fill_ids = r.origin_input_ids + r.output_ids
        r.set_extend_range(len(r.prefix_indices), len(r.full_untruncated_fill_ids))

    env.rt.init_round(original, req, None, None)
    snap(env, req, "chunk")
    adder = NS(can_run_list=[], new_chunked_req=None)
    res = env.rt.add_chunked_req(lambda a, r: None, adder, req)
    OUT.append(f"CHUNKED {req.rid} -> {getattr(res, 'rid', res)}")


def decode(env, req, k):
    for t in range(k):
        req.output_ids.append(1000 + t)
    req.kv_committed = len(req.origin_input_ids) + len(req.output_ids) - 1


def release(env, req, finished=True):
    if finished:
        req.finished_reason = NS(to_json=lambda: {"type": "length"})
    env.rt.on_release(req, env.sched.tree_cache)
    snap(env, req, "rel")


def dump(env):
    for s in env.rt.policy.sessions:
        OUT.append(f"SESSION {s.sid} slot={s.side_slot} n_side={s.n_side} ssm={s.state_tokens} inflight={s.inflight}")
    OUT.append(f"POOL {sum(float(k.sum()) + float(v.sum()) for k, v in env.pool.kv.values()):.4f} "
               f"STATE {float(env.mamba.temporal.sum()):.4f} {float(env.mamba.conv[0].sum()):.4f} "
               f"FREE {env.alloc.available_size()}")


def first_turn(env, rid, ids, salt=None):
    r = Req(rid, ids, salt)
    enqueue(env, r)
    match(env, r, 0)
    admit(env, r)
    forward(env, r)
    decode(env, r, 4)
    release(env, r)
    return r


def doc(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 50000, (n,), generator=g).tolist()


def scenario(name, config, body):
    OUT.append(f"=== {name}")
    env = make(config)
    try:
        body(env)
    except Exception as exc:  # noqa: BLE001 - an escaped exception is part of the transcript
        OUT.append(f"EXC {type(exc).__name__}: {exc}")
    finally:
        faults._PLAN = {}
    env.rt.on_idle(env.sched)
    dump(env)


def edited(seed, cuts, tail=50):
    d = doc(seed, 3000)
    new = list(d)
    for a, b in sorted(cuts, reverse=True):
        del new[a:b]
    return d, new + doc(seed + 1, tail)


def one_block(env, match_n=1024, faults_spec=""):
    old, new = edited(5, [(1400, 1600)])
    first_turn(env, "a.1", old)
    faults._PLAN = faults.parse(faults_spec)
    faults._CALLS.clear()
    r = Req("a.2", new)
    enqueue(env, r)
    match(env, r, match_n)
    admit(env, r)
    forward(env, r)
    chunk_next(env, r)
    admit(env, r)
    forward(env, r)
    decode(env, r, 3)
    release(env, r)
    faults._PLAN = {}


def two_blocks(env):
    old, new = edited(7, [(1200, 1300), (2200, 2300)])
    first_turn(env, "b.1", old)
    r = Req("b.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    admit(env, r)
    forward(env, r)
    chunk_next(env, r)
    forward(env, r)
    chunk_next(env, r)
    forward(env, r)
    release(env, r)


def direct(env, admitted=True):
    old, new = edited(9, [(1400, 1600)])
    first_turn(env, "c.1", old)
    r = Req("c.2", new)
    enqueue(env, r)
    match(env, r, 1400)
    admit(env, r, admit_it=admitted)
    if not admitted:
        match(env, r, 1400)
        admit(env, r, forced=True)
        match(env, r, 1400)
        admit(env, r)
    forward(env, r)
    release(env, r)


def retract(env):
    old, new = edited(11, [(1400, 1600)])
    first_turn(env, "d.1", old)
    r = Req("d.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    admit(env, r)
    forward(env, r)
    chunk_next(env, r)
    release(env, r, finished=False)
    enqueue(env, r, is_retracted=True)
    r.prefix_indices = torch.empty(0, dtype=torch.int64)
    match(env, r, 0)
    admit(env, r)
    forward(env, r)
    release(env, r)


def busy_chunk(env):
    old, new = edited(13, [(1400, 1600)])
    first_turn(env, "e.1", old)
    r = Req("e.2", new)
    enqueue(env, r)
    env.sched.chunked_req = NS(rid="other")
    for _ in range(3):
        match(env, r, 1024)
    env.sched.chunked_req = None
    match(env, r, 1024)
    admit(env, r, has_chunked=True)
    forward(env, r)
    release(env, r)


def past_stop(env):
    old, new = edited(15, [(1400, 1600)])
    first_turn(env, "f.1", old)
    r = Req("f.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    r.set_extend_range(1024, 1500)
    adder = admit(env, r)
    forward(env, r)
    chunk_next(env, r)
    release(env, r)


def evict(env, reserve):
    old, new = edited(17, [(1400, 1600)])
    first_turn(env, "g.1", old)
    r = Req("g.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    admit(env, r)
    forward(env, r)
    taken = env.alloc.alloc(env.alloc.available_size() - 100)
    env.sched.tree_cache.reserve = taken.tolist()[:reserve]
    chunk_next(env, r)
    release(env, r)


def aborts(env):
    old, new = edited(19, [(1400, 1600)])
    first_turn(env, "h.1", old)
    r = Req("h.2", new)
    enqueue(env, r)
    match(env, r, 1400)
    env.sched.waiting_queue = [r]
    env.rt.on_abort(env.sched, NS(rid="h.2", abort_all=False))
    r3 = Req("h.3", new)
    enqueue(env, r3)
    enqueue(env, Req("knob", new, "kvreuse:knobs:pin=1"))


def store_fault(env):
    faults._PLAN = faults.parse("scr.side_store@1,scr.save_state@2")
    faults._CALLS.clear()
    old, new = edited(21, [(1400, 1600)])
    first_turn(env, "i.1", old)
    r = Req("i.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    admit(env, r)
    forward(env, r)
    release(env, r)
    faults._PLAN = {}


def stolen(env):
    old, new = edited(23, [(1400, 1600)])
    first_turn(env, "j.1", old)
    r = Req("j.2", new)
    enqueue(env, r)
    match(env, r, 1024)
    admit(env, r)
    env.rt.policy.sessions.drop_private("s000001")
    forward(env, r)
    chunk_next(env, r)
    forward(env, r)
    release(env, r)




class _Capture(logging.Handler):
    def emit(self, record):
        OUT.append(f"LOG {record.levelname} {re.sub(r'pid=[0-9]+', 'pid=X', record.getMessage())}")


def transcript() -> list[str]:
    """Run every scenario; the runtime's rotary lookup is replaced by a fixed table."""
    OUT.clear()
    logger = logging.getLogger(rt.__name__)
    saved = (logger.level, logger.propagate, scr_tensors.text_rotary, faults._PLAN, dict(faults._CALLS))
    handler = _Capture()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    scr_tensors.text_rotary = lambda *args, **kwargs: ROT
    try:
        for name, config, body in SCENARIOS:
            scenario(name, config, body)
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate, scr_tensors.text_rotary, faults._PLAN, calls = saved
        faults._CALLS.clear()
        faults._CALLS.update(calls)
    return list(OUT)


SCENARIOS = [
    ("stolen", ScrConfig(), stolen),
    ("one-block", ScrConfig(), one_block),
    ("one-block-release-snap", ScrConfig(ssm_snap="release"), one_block),
    ("one-block-strict-none", ScrConfig(ssm_mode="none", no_rerotate=True, relocated_in_tree=True), one_block),
    ("one-block-no-debug-trace", ScrConfig(debug=False, trace=False), one_block),
    ("fault-place", ScrConfig(), lambda e: one_block(e, faults_spec="scr.place_rows@1")),
    ("fault-restore", ScrConfig(), lambda e: one_block(e, faults_spec="scr.restore_state@1")),
    ("fault-round", ScrConfig(), lambda e: one_block(e, faults_spec="scr.round@1+")),
    ("fault-round-2", ScrConfig(), lambda e: one_block(e, faults_spec="scr.round@2")),
    ("two-blocks", ScrConfig(), two_blocks),
    ("two-blocks-gap", ScrConfig(mb_min_gap=5000), two_blocks),
    ("direct", ScrConfig(), direct),
    ("direct-undone", ScrConfig(), lambda e: direct(e, admitted=False)),
    ("retract", ScrConfig(), retract),
    ("busy-chunk", ScrConfig(splice_retry=2), busy_chunk),
    ("past-stop", ScrConfig(), past_stop),
    ("evict-ok", ScrConfig(evict_floor_frac=0.0, evict_margin=10), lambda e: evict(e, 3000)),
    ("evict-declined", ScrConfig(), lambda e: evict(e, 10)),
    ("evict-off", ScrConfig(evict_on_alloc_fail=False), lambda e: evict(e, 3000)),
    ("aborts", ScrConfig(), aborts),
    ("store-fault", ScrConfig(), store_fault),
    ("t6-off-one-slot", ScrConfig(side_sessions=1, t6_guard=False), one_block),
]
