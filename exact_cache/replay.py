"""``replay``: what the exact cache reuses for each prompt of a sequence (no eviction unless a model budget is given).

A model of the server's tree, independent of SGLang: for each served prompt P it holds
  * KV for ``P[0:d]`` where d is P's deepest keep point (the server inserts at keep points only;
    under the grid rule that is ``[0, floor(|P|/B)·B)`` unless |P| is a multiple of B, whose last
    piece has no snapshot);
  * a recurrent-state snapshot at each keep point of P's read.
The server's per-request reused length (``cached_tokens``, events) must equal it. Every cut rule
(``exact_cache.rules.CutRule``): build the tree with ``ReplayTree.for_config`` or pass
``message_end`` (None: the grid) and ``kept`` (with ``inside``: ``keeps=inside``, where keep points
end no forward; the states kept, and so the reuse, are the same, only ``pieces`` differ).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from exact_cache.rules import CutRule, bound_in, keep_points_in, resume_point
from policy.tokens import common_prefix_len


class ReplayTree:
    """Cached texts and snapshots as plain token tuples (small inputs: tests and traces)."""

    def __init__(self, piece: int, retain_every: int, spec_drop: int = 0, *, message_end: int | None = None,
                 min_piece: int = 1, message_keeps: int = 0, max_snapshots: int = 0, kept: bool = False,
                 inside: bool = False):
        self.rule = CutRule(piece, message_end, min_piece, kept, inside)
        self.piece, self.retain_every, self.spec_drop = piece, retain_every, spec_drop
        self.message_keeps = message_keeps
        self.texts: list[tuple[int, ...]] = []  # KV held: each a prefix of a served prompt's tree keys
        # The token prefix before each snapshot, least recently used first; with ``max_snapshots``
        # the oldest go beyond the budget (a model of SGLang's LRU over state slots: the resumed
        # and the new states are touched, and KV is never evicted; unlike SGLang it does not lock
        # the states of the read in progress, so a budget below one read's keeps is not modelled).
        self.snapshots: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self.max_snapshots = max_snapshots
        self.evicted = 0
        self.pieces: list[list[tuple[int, int]]] = []  # per served prompt: the forwards its read ran
        # (a keep point ends one, except under keeps=inside: rules.keeps_within places it)

    @classmethod
    def for_config(cls, config) -> "ReplayTree":
        """The tree an ``ExactConfig`` builds (its message-end id must be resolved), without eviction:
        the LRU budget is a model for estimates, not SGLang's pool, so predictions never use it."""
        rule = config.cut_rule()
        return cls(config.piece_tokens, config.retain_every, config.spec_drop, message_end=rule.message_end,
                   min_piece=rule.min_piece, message_keeps=config.message_keeps, kept=rule.kept,
                   inside=rule.inside)

    def serve(self, prompt: Sequence[int], cap: int | None = None) -> tuple[int, dict]:
        """Serve one prompt: returns (c*, keep points) and records what the read leaves behind.

        ``cap``: SGLang matched no further than this (a request asking for prompt logprobs from
        ``logprob_start_len``; the event's ``match_cap``)."""
        prompt = tuple(prompt)
        keys = self.rule.tree_keys(prompt, prompt)
        keys = prompt if keys is None else tuple(keys)  # what the server's tree stores (rules.piece_keys)
        head = keys[: len(prompt) - 1 if cap is None else min(cap, len(prompt) - 1)]
        matched = max((common_prefix_len(head, text) for text in self.texts), default=0)
        cut_list = self.rule.cuts(prompt)
        bound = bound_in(cut_list, matched, len(prompt), self.spec_drop)
        depths = [d for d in cut_list if d <= bound and keys[:d] in self.snapshots]
        resume = resume_point(bound, depths, cut_list)
        keep = keep_points_in(cut_list, len(prompt), resume, bound, self.retain_every, self.spec_drop,
                              self.rule.message_ends(prompt, cut_list), self.message_keeps)
        if resume:
            self.snapshots.move_to_end(keys[:resume])
        for depth in keep:
            self.snapshots[keys[:depth]] = None
            self.snapshots.move_to_end(keys[:depth])
        while self.max_snapshots and len(self.snapshots) > self.max_snapshots:
            self.snapshots.popitem(last=False)
            self.evicted += 1
        if keep:
            self.texts.append(keys[: max(keep)])
        self.pieces.append(self.rule.forwards(cut_list, resume, len(prompt), keep))
        return resume, keep


def replay(prompts: Sequence[Sequence[int]], *, piece: int, retain_every: int, spec_drop: int = 0,
           caps: Sequence[int | None] | None = None, message_end: int | None = None, min_piece: int = 1,
           message_keeps: int = 0, kept: bool = False, inside: bool = False) -> list[int]:
    """Serve ``prompts`` in order (no eviction) and return the resume point c* of each.

    ``caps``: per prompt, the prefix-match cap SGLang applied (events' ``match_cap``; None: none).
    ``message_end`` etc.: the message cut rule (``ExactConfig`` keys of the same names)."""
    tree = ReplayTree(piece, retain_every, spec_drop, message_end=message_end, min_piece=min_piece,
                      message_keeps=message_keeps, kept=kept, inside=inside)
    return replay_tree(tree, prompts, caps)


def replay_tree(tree: ReplayTree, prompts: Sequence[Sequence[int]],
                caps: Sequence[int | None] | None = None) -> list[int]:
    """Serve ``prompts`` through ``tree`` in order; the resume point of each."""
    caps = list(caps) if caps is not None else [None] * len(prompts)
    if len(caps) != len(prompts):
        raise ValueError(f"{len(caps)} caps for {len(prompts)} prompts")
    return [tree.serve(prompt, cap)[0] for prompt, cap in zip(prompts, caps)]
