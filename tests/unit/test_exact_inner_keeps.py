"""``patches.exact_inner_keeps.InnerKeeps`` around a forward, on stand-ins for the tree, its pools and
the executor: which slots a forward's keeps get, what the GDN layers are told, and that a failure
before the forward drops the keeps (named in the request's event) instead of reaching SGLang."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from patches import state_keeps
from patches.exact_inner_keeps import InnerKeeps
from patches.state_keeps import StateKeep


class Allocator:
    def __init__(self, free):
        self.free_slots = torch.tensor(free, dtype=torch.int64)

    def alloc(self, count):
        if count > len(self.free_slots):
            return None
        slots, self.free_slots = self.free_slots[:count], self.free_slots[count:]
        return slots

    def free(self, slots):
        self.free_slots = torch.cat([self.free_slots, slots.view(-1)])


class Executor:
    def __init__(self, points, fail=False):
        self.points, self.fail, self.dropped = points, fail, []

    def inner_keeps(self, req, start, end):
        if self.fail:
            raise RuntimeError("the plan is gone")
        return [p for p in self.points.get(req.rid, []) if start < p[0] < end]

    def keep_dropped(self, req, position, reason):
        self.dropped.append((req.rid, position, reason))


def tree(executor, free=(7, 8, 9)):
    pool = SimpleNamespace(mamba_allocator=Allocator(list(free)), translate_mamba_indices=lambda slots: slots + 100)
    return SimpleNamespace(executor=executor, req_to_token_pool=pool, evict=lambda params: None)


def req(rid, start, end):
    return SimpleNamespace(rid=rid, prefix_indices=list(range(start)), get_fill_ids=lambda: list(range(end)))


@pytest.fixture(autouse=True)
def no_pending():
    yield
    state_keeps.clear()


def test_a_forwards_keeps_get_slots_and_offsets_from_each_sequences_start():
    executor = Executor({"a": [(192, "message"), (256, "periodic")], "b": [(64, "junction")]})
    keeps = InnerKeeps(tree(executor))
    keeps.arm([req("a", 128, 300), req("b", 0, 100)])
    assert state_keeps.pending() == (StateKeep(0, 64, 107), StateKeep(0, 128, 108), StateKeep(1, 64, 109))
    assert [(p, k, int(s)) for p, k, s in keeps.armed["a"]] == [(192, "message", 7), (256, "periodic", 8)]
    assert executor.dropped == []


def test_keeps_without_a_free_slot_are_dropped_and_named():
    executor = Executor({"a": [(192, "message"), (256, "periodic")]})
    keeps = InnerKeeps(tree(executor, free=(7,)))
    keeps.arm([req("a", 128, 300)])
    assert state_keeps.pending() == () and keeps.armed == {}
    assert executor.dropped == [("a", 192, "no free state slot")]


def test_a_failure_before_the_forward_drops_that_requests_keeps_only():
    executor = Executor({}, fail=True)
    keeps = InnerKeeps(tree(executor))
    keeps.arm([req("a", 128, 300)])
    assert state_keeps.pending() == () and keeps.armed == {}
    assert executor.dropped == [("a", None, "RuntimeError: the plan is gone")]


def test_slots_of_keeps_never_committed_go_back():
    executor = Executor({"a": [(192, "message")]})
    stand_in = tree(executor)
    keeps = InnerKeeps(stand_in)
    keeps.arm([req("a", 128, 300)])
    keeps.drop_all()
    assert keeps.armed == {} and sorted(stand_in.req_to_token_pool.mamba_allocator.free_slots.tolist()) == [7, 8, 9]
