"""The exact tree's read-only walk and its keys (patches/exact_tree.py ``ExactRadixCache.walk``,
``keyed``) on SGLang 0.5.16's own ``RadixKey``, over a stand-in tree of nodes (no pools, no
server): the walk returns the depth of the longest cached prefix and the depths of the state
snapshots on that path, stopping inside a node, at an evicted child, or at the key's end; the
keys are the policy's (``CachePolicy.tree_keys``) with the key's namespace and limit kept."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration

exact_tree = pytest.importorskip("patches.exact_tree")
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402 - after the skip
from sglang.srt.mem_cache.unified_cache_components import ComponentType  # noqa: E402

Cache = exact_tree.ExactRadixCache


class Node:
    def __init__(self, tokens, state: bool = False, evicted: bool = False, extra_key=None):
        self.key = RadixKey(array("q", tokens), extra_key)
        self.children: dict = {}
        self.evicted = evicted
        self.component_data = {ComponentType.MAMBA: SimpleNamespace(value=[7] if state else None)}

    def add(self, child: "Node") -> "Node":
        self.children[child.key.child_key(1)] = child
        return child


def tree(evicted: bool = False) -> SimpleNamespace:
    """root -> [1 2 3 4] (state) -> [5 6] -> [7 8 9] (state); root -> [20 21] (state, maybe evicted)."""
    root = Node([])
    first = root.add(Node([1, 2, 3, 4], state=True))
    first.add(Node([5, 6])).add(Node([7, 8, 9], state=True))
    root.add(Node([20, 21], state=True, evicted=evicted))
    return SimpleNamespace(root_node=root, page_size=1)


def walk(cache, tokens) -> tuple[int, tuple[int, ...]]:
    return Cache.walk(cache, RadixKey(array("q", tokens)))


@pytest.mark.parametrize("tokens, expected", [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], (9, (4, 9))),  # through three nodes, on past the tree
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], (9, (4, 9))),  # the key ends where the tree does
    ([1, 2, 3, 4, 5, 99], (5, (4,))),  # diverges inside a node: its depth counts, its state does not
    ([1, 2], (2, ())),  # inside the first node
    ([20, 21, 22], (2, (2,))),
    ([42, 1], (0, ())),  # no child
    ([], (0, ())),
])  # fmt: skip
def test_the_walk_returns_the_match_and_the_states_on_its_path(tokens, expected):
    assert walk(tree(), tokens) == expected


def test_the_walk_stops_at_an_evicted_child():
    assert walk(tree(evicted=True), [20, 21, 22]) == (0, ())
    assert walk(tree(evicted=True), [1, 2, 3, 4, 5]) == (5, (4,))


def test_the_keys_are_the_policys_with_the_namespace_and_limit_kept():
    key = RadixKey(array("q", [1, 2, 3]), "tenant", limit=2)
    policy_keys = SimpleNamespace(executor=SimpleNamespace(tree_keys=lambda req, ids: [ids[0] * 10, 20, 30]))
    keyed = Cache.keyed(policy_keys, object(), key)
    assert (list(keyed.token_ids), keyed.extra_key, keyed.limit, keyed.is_bigram) == ([10, 20, 30], "tenant", 2, False)
    token_ids = SimpleNamespace(executor=SimpleNamespace(tree_keys=lambda req, ids: None))
    assert Cache.keyed(token_ids, object(), key) is key  # the grid rule: the token ids are the keys
