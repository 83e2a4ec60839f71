"""The exact cache's rules as functions of token counts (``docs/exact.md`` §1, §5.3, §5.4).

B = piece size, R = retention interval (a multiple of B), S = spec drop (0 or 1).
Positions are absolute token offsets; ranges are half-open. A prompt's *cuts* are its piece
boundaries strictly inside it, never at its end (a longer prompt would not cut there)::

    grid      |0      B      2B      3B  ...      kB      |P|
               [piece)[piece )[piece )  ...  [tail piece )
              cuts = {jB : 0 < jB < |P|}

    messages  |0  m1 ..<e>|\n<s>m2 ..<e>|\n<s>m3 ..  +B    |..<e>|\n<s>m4 ...    |P|
               [piece     )[piece      )[piece        )[    )[tail piece       )
              a cut right after each message end (P[c-1] = <|im_end|>) whose piece since the
              last cut holds at least ``min_piece`` tokens, and B tokens after the last cut

    kept      |0   64  128 ... every 64-multiple is a cut (a possible resume point)     |P|
               |start (a read's resume point)    start+B         start+2B      |P|
               forwards end at start + jB (the serving chunk, counted from the read's start)
               and (keeps=ends) at the keep points, each floored to the 64-token grid; with
               keeps=inside a keep point inside a forward is kept there without ending it

The kept rule (``cut=kept``, docs/exact.md §5.13) rests on a kernel property, not on the pieces:
when every layer's result for a row is the same whether the forward that read it started or
ended at any 64-multiple (the GDN chunk kernel's grid) or ran beside other sequences, a read
resumed at a 64-multiple is bit-identical to a cold read that never stopped there, whatever
forwards either ran. So the tree's keys are the token ids, and forwards end only where a state is
kept or where the serving chunk ends. The chunk ends count from the read's start, as SGLang's chunked
prefill does: the start is a resume point, on the 64-token grid, and B is a multiple of 64, so every
``start + jB`` is on the grid too, and by the same split invariance the rows do not depend on
which grid points the forwards end at (a cold read ending at 8,192 and a warm one resumed at 128
ending at 8,320 give the same bits). With ``keeps=inside`` the engine keeps a state at a 64-aligned
point inside a forward (the GDN layers write it there mid-forward), so keep points end no forward
at all: forwards end at the chunk ends and the prompt end only, and each keep point is kept by the
forward that crosses or ends at it (``keeps_within``). Where the kernels lack the property the
rule must not be served (the launcher's guard).

The grid and message rules decide a cut c from ``P[0 : c]`` alone, the tokens before it. So two prompts that share
``[0, d)`` have the same cuts at every position up to d, including d itself: a cold read and a
resumed read run the same pieces. The piece around d may still end elsewhere in each prompt, so
under the message rule the tree's key of a token also names its piece end (``piece_keys``), and
a KV row is shared only between prompts that read it in the same piece (docs/exact.md §2.1;
for variable pieces docs/exact.md §5.3). A rule that
looked at ``P[c]`` (a cut *at* ``<|im_start|>``) would not do: a prompt that diverges exactly at
c would cut there and the cached one would not, and the tree would hand the new prompt rows that
the old one read in a longer piece (measured: warm and cold logprobs one ulp apart).
The functions that take a cut list (``*_in``) serve both rules; those taking ``piece`` are the
grid rule's shorthands.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from enum import Enum
from typing import Sequence


GRID = 64  # the GDN chunk kernel's grid from position 0: cut=kept puts every boundary on it


class KeepKind(str, Enum):
    PERIODIC = "periodic"
    PROMPT_END = "prompt_end"
    JUNCTION = "junction"
    PROMPT_END_BACK = "prompt_end_back"
    JUNCTION_BACK = "junction_back"
    MESSAGE = "message"


@dataclass(frozen=True)
class CutRule:
    """Where a prompt's pieces end: the B grid (``message_end`` None) or after message ends.

    ``message_end``: the id of the token that ends a message (``<|im_end|>``, looked up in the
    served tokenizer). ``min_piece``: a message end is a cut only when the piece it closes holds at
    least this many tokens, so a short message is read with the one after it (a 10-token nudge
    does not make a 10-token forward); the end of a message that follows a cut by at least this
    many tokens is always a cut. Between cuts, B bounds every piece.
    """

    piece: int
    message_end: int | None = None
    min_piece: int = 1
    kept: bool = False  # cut=kept: any 64-multiple is a cut; forwards end at chunk ends and keep points
    inside: bool = False  # cut=kept, keeps=inside: a keep point ends no forward (kept inside one)

    def __post_init__(self):
        if self.piece <= 0:
            raise ValueError(f"piece={self.piece}: must be positive")
        if self.inside and not self.kept:
            raise ValueError("inside=True (keeps=inside): only under the kept rule")
        if self.kept and self.piece % GRID:
            raise ValueError(f"piece={self.piece}: cut=kept needs a multiple of {GRID}")
        if not 1 <= self.min_piece <= self.piece:
            raise ValueError(f"min_piece={self.min_piece}: must be in [1, piece={self.piece}]")

    def cuts(self, tokens: Sequence[int]) -> list[int]:
        """The prompt's cuts, ascending: where a read may resume and a state may be kept."""
        if self.kept:
            return cuts(len(tokens), GRID)
        if self.message_end is None:
            return cuts(len(tokens), self.piece)
        return message_cuts(tokens, self.piece, self.message_end, self.min_piece)

    def tree_keys(self, prompt: Sequence[int], ids: Sequence[int]) -> list[int] | None:
        """The keys under which the tree stores ``ids`` (a prefix of ``prompt``, or the prompt
        followed by tokens it never caches), or None when the token ids themselves serve (the
        grid rule: every piece the tree holds is a full ``[kB, (k+1)B)``, the same in every prompt)."""
        if self.message_end is None or self.kept:
            return None
        return piece_keys(ids, self.cuts(prompt), self.piece, len(prompt))

    def message_ends(self, tokens: Sequence[int], found: Sequence[int]) -> list[int]:
        """Those of the cuts ``found`` that follow a message end (none under the grid rule); under
        the kept rule each message end floored to the 64-token grid."""
        if self.message_end is None:
            return []
        if self.kept:
            return kept_message_ends(tokens, self.message_end)
        return [c for c in found if tokens[c - 1] == self.message_end]

    def forwards(self, cut_list: Sequence[int], start: int, prompt_len: int, keep) -> list[tuple[int, int]]:
        """The forwards that read ``[start, prompt_len)`` given the read's keep points: one per
        piece (grid, messages), or (kept) ending at ``start + j*B`` (the serving chunk, counted from
        the read's start: a 64-multiple, since start is and B is) and, unless ``inside``, at the
        keep points; nowhere else."""
        if not self.kept:
            return pieces_in(cut_list, start, prompt_len)
        if start % GRID:
            raise ValueError(f"a read starts on the {GRID}-token grid, not at {start}")
        ends = set(range(start + self.piece, prompt_len, self.piece))
        if not self.inside:
            ends |= {k for k in keep if start < k < prompt_len}
        bounds = [start] + sorted(ends) + [prompt_len]
        return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def keeps_within(forward: tuple[int, int], keep) -> list[int]:
    """The keep points a forward ``[start, end)`` keeps, ascending: those with ``start < k <= end``.

    Under every rule but ``keeps=inside`` each keep point ends a forward, so this is ``[end]`` or
    nothing; under ``keeps=inside`` it also holds the keep points the forward crosses, kept inside
    it. A keep point at ``start`` belongs to the forward before (or to the resume point)."""
    start, end = forward
    return sorted(k for k in keep if start < k <= end)


def cuts(prompt_len: int, piece: int) -> list[int]:
    """The grid rule: piece boundaries strictly inside the prompt."""
    return list(range(piece, prompt_len, piece))


def message_cuts(tokens: Sequence[int], piece: int, message_end: int, min_piece: int) -> list[int]:
    """The message rule: a cut at p when ``tokens[p - 1]`` ends a message and ``p - last >= min_piece``,
    or when ``p - last == piece`` (``last``: the previous cut, 0 at first); ``0 < p < len(tokens)``."""
    found: list[int] = []
    last = 0
    after = [p + 1 for p, token in enumerate(tokens) if token == message_end and p + 1 < len(tokens)]
    for position in after + [len(tokens)]:
        while last + piece < position:  # B-grid cuts after the last cut, before this message end
            last += piece
            found.append(last)
        if position < len(tokens) and position - last >= min_piece:
            found.append(position)
            last = position
    return found


def kept_message_ends(tokens: Sequence[int], message_end: int) -> list[int]:
    """The kept rule's message keep points: each position p right after a message end
    (``tokens[p - 1] == message_end``, ``0 < p < len(tokens)``) floored to the 64-token grid,
    ascending, without 0. The state at the floor is exact for any prompt sharing the tokens before
    it, so flooring costs only the re-read of at most 63 tokens of the message."""
    ends = {(p + 1) // GRID * GRID for p, token in enumerate(tokens) if token == message_end and p + 1 < len(tokens)}
    return sorted(e for e in ends if e > 0)


def piece_keys(ids: Sequence[int], cut_list: Sequence[int], piece: int, prompt_len: int) -> list[int]:
    """Each token's tree key under variable pieces: the token and how many tokens are left to the
    end of its piece, packed as ``token * (piece + 1) + left`` (``1 <= left <= piece``).

    Why: a KV row's bits depend on the forward that wrote it, so two prompts may share a row only
    when it was read in the same piece. The cut rule fixes where a piece starts from the tokens
    before it, but not where it ends: a prompt that diverges inside a piece ends that piece
    elsewhere, and its rows before the divergence differ in the last bit (softplus in a SIMD tail
    on CPU). With the piece end in the key, the tree matches such rows only where the piece ends
    agree, and SGLang's insert keeps both versions as branches. Positions past the prompt (a
    retracted request's output, never cached by exact) get ``left = 0``, which no cached key has."""
    keys: list[int] = []
    start, scale = 0, piece + 1
    for end in [c for c in cut_list if c < prompt_len] + [prompt_len]:
        for position in range(start, min(end, len(ids))):
            keys.append(ids[position] * scale + (end - position))
        start = end
    keys.extend(ids[position] * scale for position in range(prompt_len, len(ids)))
    return keys


def floor_cut(position: int, piece: int) -> int:
    """The largest grid cut at or below ``position`` (0 when there is none)."""
    return max(0, position) // piece * piece


def floor_in(cut_list: Sequence[int], position: int) -> int:
    """The largest cut of ``cut_list`` (ascending) at or below ``position`` (0 when there is none)."""
    index = bisect_right(cut_list, position)
    return cut_list[index - 1] if index else 0


def cut_before(cut_list: Sequence[int], position: int) -> int:
    """The largest cut strictly below ``position`` (0 when there is none): one piece back."""
    index = bisect_left(cut_list, position)
    return cut_list[index - 1] if index else 0


def pieces(start: int, prompt_len: int, piece: int) -> list[tuple[int, int]]:
    """The grid rule's forwards that read ``[start, prompt_len)``."""
    if start % piece:
        raise ValueError(f"a read starts at 0 or at a cut, not at {start} (piece {piece})")
    return pieces_in(cuts(prompt_len, piece), start, prompt_len)


def pieces_in(cut_list: Sequence[int], start: int, prompt_len: int) -> list[tuple[int, int]]:
    """The forwards that read ``[start, prompt_len)``: one per piece, the last one the tail."""
    if start and start not in cut_list and start != prompt_len:
        raise ValueError(f"a read starts at 0 or at a cut, not at {start}")
    bounds = [start] + [c for c in cut_list if start < c < prompt_len] + [prompt_len]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def resume_bound(matched: int, prompt_len: int, piece: int, spec_drop: int) -> int:
    """A under the grid rule (``bound_in`` with the grid's cuts)."""
    return bound_in(cuts(prompt_len, piece), matched, prompt_len, spec_drop)


def bound_in(cut_list: Sequence[int], matched: int, prompt_len: int, spec_drop: int) -> int:
    """A: the largest cut <= min(matched, |P| - 1), one piece lower with S = 1 (never below 0).

    At least one prompt token is always read (the last one makes the logits).
    """
    bound = floor_in(cut_list, min(matched, prompt_len - 1))
    return cut_before(cut_list, bound) if spec_drop and bound else bound


def resume_point(bound: int, snapshot_depths, cut_list: Sequence[int] | None = None) -> int:
    """c*: the deepest snapshot on the prompt's path at or below ``bound`` (0 if none).

    ``cut_list``: only depths that are cuts of *this* prompt count. A snapshot at d was taken where
    an earlier prompt cut, and this prompt shares ``[0, d)`` with it; both
    rules decide a cut from the tokens before it, so d is always this prompt's cut too; the filter
    states the requirement rather than trusting it."""
    allowed = None if cut_list is None else set(cut_list)
    return max((d for d in snapshot_depths if 0 < d <= bound and (allowed is None or d in allowed)), default=0)


def keep_points(
    prompt_len: int, resume: int, bound: int, piece: int, retain_every: int, spec_drop: int
) -> dict[int, KeepKind]:
    """Keep points under the grid rule (``keep_points_in`` with the grid's cuts)."""
    return keep_points_in(cuts(prompt_len, piece), prompt_len, resume, bound, retain_every, spec_drop)


def keep_points_in(
    cut_list: Sequence[int], prompt_len: int, resume: int, bound: int, retain_every: int, spec_drop: int,
    message_ends: Sequence[int] = (), message_keeps: int = 0,
) -> dict[int, KeepKind]:
    """Where this read snapshots its recurrent state: position -> kind, only positions > resume.

    * the first cut at or above each multiple of R below |P| (periodic; under the grid rule the
      multiple itself);
    * e = the largest cut (prompt end), and the cut before it with S = 1;
    * J = A when A > c* (junction: P leaves cached text that had no snapshot), and the cut before
      it with S = 1;
    * the message ends among the cuts above c*, all of them or (``message_keeps`` > 0) the
      deepest ``message_keeps``: edits land near the end, so the most recent are kept first.
    A position with several kinds takes the first in ``KeepKind`` order.
    """
    found: dict[int, KeepKind] = {}

    def add(position: int, kind: KeepKind) -> None:
        if position > resume and position not in found:
            found[position] = kind

    for multiple in range(retain_every, prompt_len, retain_every):
        index = bisect_left(cut_list, multiple)
        if index < len(cut_list):
            add(cut_list[index], KeepKind.PERIODIC)
    end = cut_list[-1] if cut_list else 0
    junction = bound if bound > resume else 0
    add(end, KeepKind.PROMPT_END)
    add(junction, KeepKind.JUNCTION)
    if spec_drop:
        add(cut_before(cut_list, end) if end else 0, KeepKind.PROMPT_END_BACK)
        if junction:
            add(cut_before(cut_list, junction), KeepKind.JUNCTION_BACK)
    fresh = [p for p in message_ends if p > resume]
    for position in fresh[-message_keeps:] if message_keeps else fresh:
        add(position, KeepKind.MESSAGE)
    return dict(sorted(found.items()))


def snapshot_dump_name(rid: str, position: int, tp_rank: int = 0) -> str:
    """File name of a dumped snapshot (setting ``dump_snapshots``): ``<rid>-<position>.pt``, with
    ``-tp<rank>`` before the suffix on tensor-parallel ranks above 0, whose shards would otherwise
    overwrite rank 0's in the shared directory (docs/tensor_parallel.md §3)."""
    return f"{rid}-{position}{f'-tp{tp_rank}' if tp_rank else ''}.pt"
