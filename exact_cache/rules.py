"""The exact cache's rules as functions of token counts (``docs/exact.md`` §1, §5.4).

B = piece size, R = retention interval (a multiple of B), S = spec drop (0 or 1).
Positions are absolute token offsets; ranges are half-open::

    prompt  |0      B      2B      3B  ...      kB      |P|
             [piece)[piece )[piece )  ...  [tail piece )
    cuts = {jB : 0 < jB < |P|}   (anchored at 0, never at |P|)
"""

from __future__ import annotations

from enum import Enum


class KeepKind(str, Enum):
    PERIODIC = "periodic"
    PROMPT_END = "prompt_end"
    JUNCTION = "junction"
    PROMPT_END_BACK = "prompt_end_back"
    JUNCTION_BACK = "junction_back"


def cuts(prompt_len: int, piece: int) -> list[int]:
    """Piece boundaries strictly inside the prompt."""
    return list(range(piece, prompt_len, piece))


def floor_cut(position: int, piece: int) -> int:
    """The largest cut at or below ``position`` (0 when there is none)."""
    return max(0, position) // piece * piece


def pieces(start: int, prompt_len: int, piece: int) -> list[tuple[int, int]]:
    """The forwards that read ``[start, prompt_len)``: one per piece, the last one the tail."""
    if start % piece:
        raise ValueError(f"a read starts at 0 or at a cut, not at {start} (piece {piece})")
    return [(a, min(a + piece, prompt_len)) for a in range(start, prompt_len, piece)]


def resume_bound(matched: int, prompt_len: int, piece: int, spec_drop: int) -> int:
    """A: the largest cut <= min(matched, |P| - 1), minus S pieces (never below 0).

    At least one prompt token is always read (the last one makes the logits).
    """
    return max(0, floor_cut(min(matched, prompt_len - 1), piece) - spec_drop * piece)


def resume_point(bound: int, snapshot_depths) -> int:
    """c*: the deepest snapshot on the prompt's path at or below ``bound`` (0 if none)."""
    return max((d for d in snapshot_depths if 0 < d <= bound), default=0)


def keep_points(
    prompt_len: int, resume: int, bound: int, piece: int, retain_every: int, spec_drop: int
) -> dict[int, KeepKind]:
    """Where this read snapshots its recurrent state: position -> kind, only positions > resume.

    * every multiple of R below |P| (periodic);
    * e = the largest cut <= |P| - 1 (prompt end), and e - B with S = 1;
    * J = A when A > c* (junction: P leaves cached text that had no snapshot), and J - B with S = 1.
    A position with several kinds takes the first in ``KeepKind`` order.
    """
    found: dict[int, KeepKind] = {}

    def add(position: int, kind: KeepKind) -> None:
        if position > resume and position not in found:
            found[position] = kind

    for position in range(retain_every, prompt_len, retain_every):
        add(position, KeepKind.PERIODIC)
    end = floor_cut(prompt_len - 1, piece)
    junction = bound if bound > resume else 0
    add(end, KeepKind.PROMPT_END)
    add(junction, KeepKind.JUNCTION)
    if spec_drop:
        add(end - piece, KeepKind.PROMPT_END_BACK)
        if junction:
            add(junction - piece, KeepKind.JUNCTION_BACK)
    return dict(sorted(found.items()))


def snapshot_dump_name(rid: str, position: int, tp_rank: int = 0) -> str:
    """File name of a dumped snapshot (setting ``dump_snapshots``): ``<rid>-<position>.pt``, with
    ``-tp<rank>`` before the suffix on tensor-parallel ranks above 0, whose shards would otherwise
    overwrite rank 0's in the shared directory (docs/tensor_parallel.md §3)."""
    return f"{rid}-{position}{f'-tp{tp_rank}' if tp_rank else ''}.pt"
