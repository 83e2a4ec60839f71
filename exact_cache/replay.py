"""``replay``: what the exact cache reuses for each prompt of a sequence, without eviction.

A model of the server's tree, independent of SGLang: for each served prompt P it holds
  * KV for ``P[0:d]`` where d is P's deepest keep point (the server inserts at keep points only;
    that is ``[0, floor(|P|/B)·B)`` unless |P| is a multiple of B, whose last piece has no snapshot);
  * a recurrent-state snapshot at each keep point of P's read.
The server's per-request reused length (``cached_tokens``, events) must equal it.
"""

from __future__ import annotations

from typing import Sequence

from exact_cache.rules import keep_points, resume_bound, resume_point
from policy.tokens import common_prefix_len


class ReplayTree:
    """Cached texts and snapshots as plain token tuples (small inputs: tests and traces)."""

    def __init__(self, piece: int, retain_every: int, spec_drop: int = 0):
        self.piece, self.retain_every, self.spec_drop = piece, retain_every, spec_drop
        self.texts: list[tuple[int, ...]] = []  # KV held: each a prefix of a served prompt
        self.snapshots: set[tuple[int, ...]] = set()  # the token prefix before each snapshot

    def serve(self, prompt: Sequence[int], cap: int | None = None) -> tuple[int, dict]:
        """Serve one prompt: returns (c*, keep points) and records what the read leaves behind.

        ``cap``: SGLang matched no further than this (a request asking for prompt logprobs from
        ``logprob_start_len``; the event's ``match_cap``)."""
        prompt = tuple(prompt)
        head = prompt[: len(prompt) - 1 if cap is None else min(cap, len(prompt) - 1)]
        matched = max((common_prefix_len(head, text) for text in self.texts), default=0)
        bound = resume_bound(matched, len(prompt), self.piece, self.spec_drop)
        depths = [d for d in range(self.piece, bound + 1, self.piece) if prompt[:d] in self.snapshots]
        resume = resume_point(bound, depths)
        keep = keep_points(len(prompt), resume, bound, self.piece, self.retain_every, self.spec_drop)
        for depth in keep:
            self.snapshots.add(prompt[:depth])
        if keep:
            self.texts.append(prompt[: max(keep)])
        return resume, keep


def replay(prompts: Sequence[Sequence[int]], *, piece: int, retain_every: int, spec_drop: int = 0,
           caps: Sequence[int | None] | None = None) -> list[int]:
    """Serve ``prompts`` in order (no eviction) and return the resume point c* of each.

    ``caps``: per prompt, the prefix-match cap SGLang applied (events' ``match_cap``; None: none)."""
    tree = ReplayTree(piece, retain_every, spec_drop)
    caps = list(caps) if caps is not None else [None] * len(prompts)
    if len(caps) != len(prompts):
        raise ValueError(f"{len(caps)} caps for {len(prompts)} prompts")
    return [tree.serve(prompt, cap)[0] for prompt, cap in zip(prompts, caps)]
