"""An offline model of SGLang's hybrid radix tree: where a request may resume, and what it leaves.

Assumed (``docs/sglang.md`` §3.3-3.4): the ``no_buffer`` strategy, which SGLang resolves to with
overlap scheduling off and page size 1 (the paper's serving flags, and every CPU run here). A
request may resume only where the tree holds a recurrent state for the exact token prefix: at the
end of every prefill forward of an earlier request (chunks of ``chunk`` tokens counted from where
that request resumed), at an earlier prompt's end, or at the end of an earlier prompt +
completion[:-1] (the finished request; the last token is never run). At least one prompt token is
always recomputed. The tree is keyed by ``cache_salt``. No eviction (the real measurement comes
from serving).

``radix_prefix_estimate`` is radix's reuse per call (71.9 % offline and served on the default
set); ``StateIndex`` is the tree itself, which the offline scr arm (``eval/offline/scr_arm.py``)
fills with the forward ends of a relocating request.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

DEFAULT_CHUNK = 512  # the paper's serving recipe: --chunked-prefill-size 512 (docs/eval.md §2.4)


def prefix_hashes(ids: np.ndarray) -> np.ndarray:
    """``h[k]`` identifies ``ids[:k]`` among prefixes of length k: sum of (t_j + 1) * P^j mod 2^64.
    Matches are verified token by token, so a collision costs time, never a wrong answer."""
    powers = np.cumprod(np.full(len(ids), 0x9E3779B97F4A7C15, dtype=np.uint64), dtype=np.uint64)
    return np.concatenate([[np.uint64(0)], np.cumsum((ids.astype(np.uint64) + np.uint64(1)) * powers,
                                                    dtype=np.uint64)])


class StateIndex:
    """Recurrent-state checkpoints: (salt, position) -> {prefix hash: the sequence holding it}."""

    def __init__(self):
        self.by_key: dict[tuple, dict[int, int]] = {}
        self.positions: list[int] = []
        self.sequences: list[np.ndarray] = []

    def add(self, salt, ids: np.ndarray, hashes: np.ndarray, positions: Sequence[int]) -> None:
        self.sequences.append(ids)
        for pos in positions:
            key = (salt, pos)
            if key not in self.by_key:
                self.by_key[key] = {}
                bisect.insort(self.positions, pos)
            self.by_key[key].setdefault(int(hashes[pos]), len(self.sequences) - 1)

    def longest(self, salt, ids: np.ndarray, hashes: np.ndarray, limit: int) -> int:
        """The deepest checkpoint at or before ``limit`` whose prefix equals ``ids``' prefix."""
        for pos in reversed(self.positions[:bisect.bisect_right(self.positions, limit)]):
            holder = self.by_key.get((salt, pos), {}).get(int(hashes[pos]))
            if holder is not None and np.array_equal(self.sequences[holder][:pos], ids[:pos]):
                return pos
        return 0


def chunk_ends(start: int, end: int, chunk: int) -> list[int]:
    """Where the prefill forwards reading ``[start, end)`` in ``chunk``-token pieces end."""
    return [*range(start + chunk, end, chunk), end] if end > start else []


def checkpoints(resume: int, prompt_len: int, sequence_len: int, chunk: int) -> list[int]:
    """Where a request leaves recurrent states: every prefill chunk end after its resume point,
    the prompt end, and the end of prompt + completion[:-1]."""
    ends = chunk_ends(resume, prompt_len, chunk) + [prompt_len, sequence_len]
    return sorted(set(p for p in ends if p > 0))


def as_ids(tokens: Sequence[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def sequence_of(call) -> np.ndarray:
    """prompt + completion[:-1]: what a finished call leaves in the tree."""
    return np.concatenate([as_ids(call.prompt_ids), as_ids(call.completion_ids[:-1])])


def resume_point(index: StateIndex, call) -> int:
    """Where ``call`` resumes in the tree ``index`` holds (at most its prompt length - 1)."""
    prompt = as_ids(call.prompt_ids)
    return index.longest(call.cache_salt, prompt, prefix_hashes(prompt), len(prompt) - 1)


def radix_prefix_estimate(calls, chunk: int = DEFAULT_CHUNK) -> list[int]:
    """Prompt tokens SGLang's hybrid radix cache would reuse for each call, replayed in order
    (the module docstring says what is assumed)."""
    index, reused = StateIndex(), []
    for call in calls:
        resume = resume_point(index, call)
        reused.append(resume)
        sequence = sequence_of(call)
        index.add(call.cache_salt, sequence, prefix_hashes(sequence),
                  checkpoints(resume, len(call.prompt_ids), len(sequence), chunk))
    return reused
