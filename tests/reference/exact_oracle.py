"""What ``--cache-policy exact`` must reuse for each prompt of a sequence: the spec's rules as a
brute force over token positions, for checking the server and ``exact_cache.replay``.

Independence: written from the spec's rules (docs/exact.md §5.3 and docs/exact.md §5.4),
importing nothing from the repo. Every quantity is found by trying every position, not by
arithmetic on the grid, so a rounding or off-by-one shortcut in the product code has nothing here
to agree with:

* cuts: the positions ``d`` with ``0 < d < |P|`` and ``d % B == 0`` (never the prompt end); with
  the message rule (``message_end`` set), walking d upward: ``d`` is a cut when B tokens passed
  since the last cut, or ``P[d-1]`` ends a message and at least ``min_piece`` tokens passed;
* matched depth ``m``: the longest prefix of ``P[0 : |P|-1]`` (or of ``P[0 : cap]``) that is a
  prefix of some cached text; with the message rule a cached position matches only when its
  token *and* the end of the piece that read it agree (a KV row depends on its forward);
* bound ``A``: the largest cut ``<= m`` (0 if none), one piece lower when ``S = 1``, never below 0;
* resume point ``c*``: the deepest cut ``d <= A`` of P whose prefix ``P[0:d]`` holds a snapshot
  (0 if none);
* keep points: for each multiple of ``R`` below |P| the first cut at or above it, the prompt end
  ``e`` (largest cut) and the cut before it when ``S = 1``, the junction ``J = A`` and the cut
  before it when ``A > c*`` and ``S = 1``; with the message rule also every cut where a message
  ends just before (the deepest ``message_keeps`` of them when that is set); only those ``> c*``;
  each leaves a snapshot of ``P[0:q]`` and the text ``P[0:q]`` cached.
* the kept rule (``kept``): every ``d`` with ``0 < d < |P|`` and ``d % 64 == 0`` is a cut, whatever
  B is (B only ends forwards, which do not change what is reused); positions match on their token
  alone; a message keep point is, for each position ``p`` with ``P[p-1]`` a message end and
  ``p < |P|``, the deepest 64-multiple ``d`` with ``0 < d <= p`` (found by trying every d);
  forwards (``forwards``): walking from the resume point ``c*`` one token at a time, a forward ends
  once B tokens have passed since the read's start or the last such chunk end, and (``inside``
  False) at every keep point; with ``inside`` keep points end nothing, and each is kept by the
  forward ``[a, b)`` with ``a < k <= b`` (``snapshots``).
No eviction: the oracle holds everything, so it is an upper bound under a memory budget.
"""

from __future__ import annotations


class ExactOracle:
    GRID = 64

    def __init__(self, piece: int, retain_every: int, spec_drop: int = 0, message_end=None, min_piece: int = 1,
                 message_keeps: int = 0, kept: bool = False):
        self.kept = kept
        if spec_drop not in (0, 1):
            raise ValueError("spec_drop is 0 or 1")
        self.piece, self.retain_every, self.spec_drop = piece, retain_every, spec_drop
        self.message_end, self.min_piece, self.message_keeps = message_end, min_piece, message_keeps
        self.texts: list[tuple] = []
        self.snapshots: set[tuple] = set()

    def matched(self, head: tuple) -> int:
        best = 0
        for depth in range(len(head) + 1):
            if any(len(text) >= depth and text[:depth] == head[:depth] for text in self.texts):
                best = depth
        return best

    def cuts(self, prompt: tuple) -> list[int]:
        if self.kept:
            return [d for d in range(1, len(prompt)) if d % self.GRID == 0]
        if self.message_end is None:
            return [d for d in range(1, len(prompt)) if d % self.piece == 0]
        found, last = [], 0
        for d in range(1, len(prompt)):
            if d - last == self.piece or (prompt[d - 1] == self.message_end and d - last >= self.min_piece):
                found.append(d)
                last = d
        return found

    def labelled(self, prompt: tuple, cuts: list[int]) -> tuple:
        """Each position as (token, end of its piece) under the message rule; the tokens otherwise."""
        if self.message_end is None or self.kept:
            return prompt
        out = []
        for i, token in enumerate(prompt):
            out.append((token, min([c for c in cuts if c > i], default=len(prompt))))
        return tuple(out)

    def message_keep_points(self, prompt: tuple, cuts: list[int]) -> list[int]:
        if self.message_end is None:
            return []
        if not self.kept:
            return [c for c in cuts if prompt[c - 1] == self.message_end]
        found = set()
        for p in range(1, len(prompt)):
            if prompt[p - 1] == self.message_end:
                floors = [d for d in range(1, p + 1) if d % self.GRID == 0]
                if floors:
                    found.add(max(floors))
        return sorted(found)

    def serve(self, prompt, cap: int | None = None) -> tuple[int, list[int]]:
        """Serve one prompt: ``(c*, keep points)``, and remember what its read leaves behind."""
        prompt = tuple(prompt)
        n, S = len(prompt), self.spec_drop
        cuts = self.cuts(prompt)
        seen = self.labelled(prompt, cuts)
        visible = n - 1 if cap is None else min(cap, n - 1)
        m = self.matched(seen[:visible])

        def before(d):
            return max([c for c in cuts if c < d], default=0)

        bound = max([c for c in cuts if c <= m], default=0)
        if S and bound:
            bound = before(bound)
        resume = max([d for d in range(1, bound + 1) if seen[:d] in self.snapshots], default=0)
        assert resume == 0 or resume in cuts, "a state at a depth that is not this prompt's cut"
        end = max(cuts, default=0)
        keep = {min([c for c in cuts if c >= k], default=0) for k in range(self.retain_every, n, self.retain_every)}
        keep |= {end} | ({before(end)} if S and end else set())
        if bound > resume:
            keep |= {bound} | ({before(bound)} if S else set())
        messages = self.message_keep_points(prompt, cuts)
        messages = [c for c in messages if c > resume]
        keep |= set(messages[-self.message_keeps:] if self.message_keeps else messages)
        kept = sorted(d for d in keep if d > resume)
        for depth in kept:
            self.snapshots.add(seen[:depth])
            self.texts.append(seen[:depth])
        return resume, kept


def expected_forwards(piece: int, resume: int, prompt_len: int, keep, inside: bool = False) -> list[tuple[int, int]]:
    """The kept rule's forwards of a read of ``[resume, prompt_len)`` with keep points ``keep``."""
    forwards, start, chunk_from = [], resume, resume
    for p in range(resume + 1, prompt_len):
        chunk_end = p - chunk_from == piece
        if chunk_end:
            chunk_from = p
        if chunk_end or (not inside and p in keep):
            forwards.append((start, p))
            start = p
    return forwards + [(start, prompt_len)] if prompt_len > start else forwards


def expected_snapshots(forwards, keep) -> list[tuple[int, list[int]]]:
    """Per forward, in order, the keep points it keeps: those past its start, up to its end."""
    return [(index, [k for k in sorted(keep) if a < k and k <= b]) for index, (a, b) in enumerate(forwards)]


def expected_reuse(prompts, *, piece: int, retain_every: int, spec_drop: int = 0, caps=None, message_end=None,
                   min_piece: int = 1, message_keeps: int = 0, kept: bool = False) -> list[int]:
    """The resume point ``c*`` (= the server's ``cached_tokens``) of each prompt, served in order."""
    oracle = ExactOracle(piece, retain_every, spec_drop, message_end, min_piece, message_keeps, kept)
    caps = list(caps) if caps is not None else [None] * len(prompts)
    return [oracle.serve(prompt, cap)[0] for prompt, cap in zip(prompts, caps, strict=True)]
