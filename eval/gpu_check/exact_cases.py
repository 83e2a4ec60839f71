"""The prompts of the exact step: the engine tests' case shapes, copied (the check imports nothing
from ``tests/``), with the reuse each prompt must get.

``expected`` is what ``tests/reference/exact_oracle.py`` (the spec's rules, brute force) says the
server reuses when the prompts are served in order on an empty cache; ``tests/unit/
test_gpu_check.py`` recomputes it with the oracle, so a change of the rules cannot leave a stale
number here. Prompt ids are drawn in [10, 400), clear of the tiny tokenizer's special tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DECODE_TOKENS = 6  # generated per warm/cold comparison, as the engine tests
NEIGHBOUR_WARM_TOKENS = 24  # the warm request beside its neighbours
NEIGHBOUR_TOKENS = 4 * NEIGHBOUR_WARM_TOKENS  # the neighbours decode longer, so the warm one decodes beside them


def prompt_ids(seed: int, length: int) -> list[int]:
    """Deterministic token ids (the same draw as the engine tests' prompts)."""
    rng = random.Random(seed)
    return [rng.randrange(10, 400) for _ in range(length)]


def edited(base: list[int], start: int, end: int, filler_seed: int = 101) -> list[int]:
    """``base`` with ``[start, end)`` replaced by the same number of other tokens."""
    return base[:start] + prompt_ids(filler_seed, end - start) + base[end:]


@dataclass(frozen=True)
class Case:
    """Prompts served in order on a flushed cache; ``expected[i]`` is prompt i's reused tokens."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    expected: tuple[int, ...]
    quick: bool = False  # also run under --quick


def _case(name: str, prompts: list[list[int]], expected: tuple[int, ...], quick: bool = False) -> Case:
    return Case(name, tuple(tuple(p) for p in prompts), expected, quick)


@dataclass(frozen=True)
class PieceSetup:
    """One exact server: its settings and what it is asked."""

    piece_tokens: int
    retain_every: int
    cases: tuple[Case, ...]
    neighbour_prompt_len: int  # long enough to reuse at least one piece
    turns: bool  # run the three-turn conversation (piece 64 only, as the engine tests)
    cut: str = "grid"  # the exact setting cut=...: grid (pieces of B), or kept (forwards end at chunk ends and keep points)
    keeps: str = "ends"  # cut=kept's keeps=...: ends (keep points end forwards) or inside (states kept mid-forward)

    @property
    def kept(self) -> bool:
        return self.cut == "kept"


_BASE = prompt_ids(seed=100, length=600)

PIECE_64 = PieceSetup(64, 256, (
    _case("repeat", [_BASE, _BASE], (0, 576), quick=True),
    _case("tail_replaced", [_BASE, _BASE[:560] + prompt_ids(102, 40)], (0, 512)),
    _case("append", [_BASE, _BASE + prompt_ids(103, 90)], (0, 576), quick=True),
    _case("middle_delete", [_BASE, _BASE[:200] + _BASE[330:]], (0, 0), quick=True),
    _case("same_edit_twice", [_BASE, edited(_BASE, 300, 340), edited(_BASE, 300, 340)], (0, 256, 576)),
    _case("cut_just_before_a_piece_boundary", [_BASE, edited(_BASE, 319, 330)], (0, 256)),
    _case("edit_just_after_a_periodic_state", [_BASE, edited(_BASE, 260, 270)], (0, 256)),
    _case("length_an_exact_multiple_of_B", [_BASE[:512], _BASE[:512], _BASE[:512] + prompt_ids(104, 64)],
          (0, 448, 448)),
    _case("two_interleaved_conversations",
          [_BASE, prompt_ids(105, 400), _BASE + prompt_ids(106, 30), prompt_ids(105, 400) + prompt_ids(107, 70)],
          (0, 0, 576, 384), quick=True),
), neighbour_prompt_len=300, turns=True)

_BASE_832 = prompt_ids(seed=170, length=1700)

PIECE_832 = PieceSetup(832, 6656, (
    _case("edits_at_1000_and_1200",
          [_BASE_832, edited(_BASE_832, 1000, 1010, filler_seed=171), edited(_BASE_832, 1200, 1210, filler_seed=172)],
          (0, 0, 832), quick=True),
    _case("repeat", [_BASE_832, _BASE_832], (0, 1664)),
    _case("append", [_BASE_832, _BASE_832 + prompt_ids(173, 200)], (0, 1664)),
), neighbour_prompt_len=1000, turns=False)

# The kept rule (cut=kept, docs/exact.md §5.13), as tests/engine/test_exact_kept.py: forwards end at
# the 128-token chunk ends and at keep points only, so a warm read resumed at a kept point runs other
# forwards than the cold read: an append resumes at 576 (the first read's prompt end, floored to the
# 64 grid), where no cold read of the longer prompt ends a forward; an edit leaves a junction at 320
# that the next edit resumes at. Reuse is the same as piece 64's (the kept rule also cuts every 64).
# With keeps=inside (docs/exact.md §5.14) the states are kept inside the forwards, by the GPU's own
# GDN kernels writing fp32 states at the keep points: what the CPU can only show under the interpreter.
_PIECE_64_CASES = {case.name: case for case in PIECE_64.cases}
KEPT = PieceSetup(128, 256, (
    *(_PIECE_64_CASES[name] for name in ("repeat", "append", "middle_delete")),
    _case("edit_off_the_chunk_grid", [_BASE, edited(_BASE, 330, 340)], (0, 256)),
    _case("resume_at_a_junction", [_BASE, edited(_BASE, 330, 335), edited(_BASE, 330, 340)], (0, 256, 320), quick=True),
    _case("turns", [_BASE[:300], _BASE[:300] + prompt_ids(111, 80), _BASE[:300] + prompt_ids(111, 80) + prompt_ids(112, 70)],
          (0, 256, 320)),
), neighbour_prompt_len=300, turns=False, cut="kept", keeps="inside")

SETUPS = {"64": PIECE_64, "832": PIECE_832, "kept": KEPT}  # by the step's name, exact-<key>

# The three-turn conversation (piece 64): each turn appends the answer and 80 new tokens; the
# reuse is fixed by the piece grid whatever the answer is.
TURN_FIRST = (110, 300)  # (seed, length) of the first message
TURN_SEEDS = (111, 112, 113)  # the 80-token message after each answer
TURN_EXPECTED = (0, 256, 384)


def neighbour_prompts(setup: PieceSetup, neighbours: int) -> tuple[list[int], list[list[int]]]:
    """The warm request's prompt and its neighbours' (each neighbour in its own namespace)."""
    prompt = prompt_ids(seed=150 + neighbours, length=setup.neighbour_prompt_len)
    others = [prompt_ids(seed=160 + n, length=200) for n in range(neighbours)]
    return prompt, others


def cases_for(setup: PieceSetup, quick: bool) -> tuple[Case, ...]:
    return tuple(c for c in setup.cases if c.quick) if quick else setup.cases
