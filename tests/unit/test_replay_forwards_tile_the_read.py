"""exact_cache/replay.py ``ReplayTree.pieces``: the forwards of each read tile ``[resume, |P|)``:
the first starts at the resume point, each starts where the one before ended, none is empty, the
last ends at the prompt's end; under every cut rule (grid, messages, kept with keeps=ends and keeps=inside).

Why: ``eval/bench_cuts.py`` prices each forward (a fixed cost per forward plus its tokens), so
an empty forward at the resume cut costs a launch that the server never makes, and a forward that
starts before the resume point reads tokens the server reused. The policy's own plan is checked
against these forwards elsewhere (``test_exact_kept_cuts.py``) only under the kept rule."""

from __future__ import annotations

import random

import pytest

from exact_cache.replay import ReplayTree

B, R, M = 8, 16, 9  # grid and message rules
KB, KR = 128, 256  # the kept rule needs 64-multiples


def tiles(forwards: list[tuple[int, int]], resume: int, length: int) -> bool:
    return (bool(forwards) and forwards[0][0] == resume and forwards[-1][1] == length
            and all(a < b for a, b in forwards) and all(x[1] == y[0] for x, y in zip(forwards, forwards[1:])))


def test_a_warm_read_starts_its_first_forward_at_the_resume_cut():
    tree = ReplayTree(B, R)
    first = [1] * 20
    assert tree.serve(first) == (0, {16: "periodic"})  # cold: keeps the state at 16
    resume, _ = tree.serve(first + [2] * 10)
    assert resume == 16
    assert tree.pieces == [[(0, 8), (8, 16), (16, 20)], [(16, 24), (24, 30)]]


def test_a_resume_at_a_message_end_starts_the_first_forward_there():
    tree = ReplayTree(B, R, message_end=M, min_piece=1)
    first = [1, 1, 1, M, 1, 1, 1, 1, 1, M, 1, 1]  # cuts after each M: 4, 10
    tree.serve(first)
    resume, _ = tree.serve(first[:10] + [2] * 9)
    assert resume == 10
    assert tree.pieces[-1] == [(10, 18), (18, 19)]


def conversation(rng: random.Random, scale: int) -> list[list[int]]:
    """Turns that grow, get edited and sometimes restart: enough resumes at and between cuts."""
    prompts, current = [], []
    for _ in range(8):
        roll = rng.random()
        if roll < 0.6 or not current:
            current = current + [rng.choice([0, 1, 2, M]) for _ in range(rng.randint(1, 3 * scale))]
        elif roll < 0.9:
            cut = rng.randrange(len(current))
            current = current[:cut] + [rng.choice([0, 1, M]) for _ in range(rng.randint(1, scale))]
        else:
            current = [rng.choice([0, 1]) for _ in range(rng.randint(1, 2 * scale))]
        prompts.append(list(current))
    return prompts


@pytest.mark.parametrize("rule", ["grid", "messages", "kept", "kept inside"])
def test_every_read_is_tiled_by_its_forwards(rule):
    rng = random.Random(7)
    warm = 0
    for _ in range(60):
        if rule.startswith("kept"):
            tree, scale = ReplayTree(KB, KR, message_end=M, kept=True, inside=rule == "kept inside"), 120
        else:
            tree, scale = ReplayTree(B, R, message_end=M if rule == "messages" else None), 8
        for prompt in conversation(rng, scale):
            resume, _ = tree.serve(prompt)
            assert tiles(tree.pieces[-1], resume, len(prompt)), (rule, resume, len(prompt), tree.pieces[-1])
            warm += resume > 0
    assert warm > 50  # most checks are of warm reads, where the resume cut is not 0
