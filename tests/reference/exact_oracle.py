"""What ``--cache-policy exact`` must reuse for each prompt of a sequence: the spec's rules as a
brute force over token positions, for checking the server and ``exact_cache.replay``.

Independence: written from the spec's rules (docs/exact.md §5.3 and docs/exact.md §5.4),
importing nothing from the repo. Every quantity is found by trying every position, not by
arithmetic on the grid, so a rounding or off-by-one shortcut in the product code has nothing here
to agree with:

* cuts: the positions ``d`` with ``0 < d < |P|`` and ``d % B == 0`` (never the prompt end);
* matched depth ``m``: the longest prefix of ``P[0 : |P|-1]`` (or of ``P[0 : cap]``) that is a
  prefix of some cached text;
* bound ``A``: the largest cut ``<= m`` (0 if none), one piece lower when ``S = 1``, never below 0;
* resume point ``c*``: the deepest ``d <= A`` whose prefix ``P[0:d]`` holds a snapshot (0 if none);
* keep points: multiples of ``R`` in ``(c*, |P|)``, the prompt end ``e`` (largest cut) and
  ``e - S*B``, the junction ``J = A`` and ``J - S*B`` when ``A > c*``; only those ``> c*``;
  each leaves a snapshot of ``P[0:q]`` and the text ``P[0:q]`` cached.
No eviction: the oracle holds everything, so it is an upper bound under a memory budget.
"""

from __future__ import annotations


class ExactOracle:
    def __init__(self, piece: int, retain_every: int, spec_drop: int = 0):
        if spec_drop not in (0, 1):
            raise ValueError("spec_drop is 0 or 1")
        self.piece, self.retain_every, self.spec_drop = piece, retain_every, spec_drop
        self.texts: list[tuple] = []
        self.snapshots: set[tuple] = set()

    def matched(self, head: tuple) -> int:
        best = 0
        for depth in range(len(head) + 1):
            if any(len(text) >= depth and text[:depth] == head[:depth] for text in self.texts):
                best = depth
        return best

    def serve(self, prompt, cap: int | None = None) -> tuple[int, list[int]]:
        """Serve one prompt: ``(c*, keep points)``, and remember what its read leaves behind."""
        prompt = tuple(prompt)
        n, B, S = len(prompt), self.piece, self.spec_drop
        visible = n - 1 if cap is None else min(cap, n - 1)
        m = self.matched(prompt[:visible])
        cuts = [d for d in range(1, n) if d % B == 0]
        bound = max([c for c in cuts if c <= m], default=0)
        bound = max(bound - S * B, 0)
        resume = max([d for d in range(1, bound + 1) if prompt[:d] in self.snapshots], default=0)
        end = max(cuts, default=0)
        keep = {d for d in range(1, n) if d % self.retain_every == 0} | {end, end - S * B}
        if bound > resume:
            keep |= {bound, bound - S * B}
        kept = sorted(d for d in keep if d > resume)
        for depth in kept:
            self.snapshots.add(prompt[:depth])
            self.texts.append(prompt[:depth])
        return resume, kept


def expected_reuse(prompts, *, piece: int, retain_every: int, spec_drop: int = 0, caps=None) -> list[int]:
    """The resume point ``c*`` (= the server's ``cached_tokens``) of each prompt, served in order."""
    oracle = ExactOracle(piece, retain_every, spec_drop)
    caps = list(caps) if caps is not None else [None] * len(prompts)
    return [oracle.serve(prompt, cap)[0] for prompt, cap in zip(prompts, caps, strict=True)]
