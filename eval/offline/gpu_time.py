"""The time at stake: an estimate of GPU seconds per call, from published measurements.

PFLOPs count work; a GPU's time also depends on how the work is cut. Exact reads in 832-token
pieces, and every forward re-reads the weights and the whole context's KV and states, so the same
tokens read in more, smaller forwards cost more (so does ``cut=kept``, which reads in the server's
chunks but ends a forward at each of its keep points: the floored prompt end, message ends,
junctions; with ``keeps=inside`` it ends none there); and attention over a long context costs more per token than over a short one. This module fits one curve to the measurements the exact cache's lab
published for a 27B Qwen hybrid (Gated DeltaNet + attention) on one GPU (``PUBLISHED``; restated in
``docs/exact.md`` §3 and issue 34) and charges every prefill forward with it::

    seconds(forward reading p tokens after a tokens of context)
        = c_forward + c_token * p + c_attention * p * (a + p / 2) + c_context * a

``c_forward``: per-forward work (weights, launches); ``c_token``: per-token work of every layer;
``c_attention``: attention over the context (the integral of the context length over the tokens
read); ``c_context``: per-forward reading of the context's KV. ``fit`` solves them by least squares
on relative error over the five cold reads (reading n tokens from nothing, in the server's
4,096-token pieces or exact's 832-token pieces); the curve reproduces them within 1 % and the
window probe's other cold reads (8K, 60K, 200K and 250K in 4,096-token pieces, not fitted) within
3 % (``tests/unit/test_gpu_time.py``). Decoding is charged at the published rate, 88.5-89.7
tokens/s (``DECODE_RATE``, their midpoint; the lab's window probe shows it falling at long
contexts, 99 tokens/s at 30K and 48 at 120K, so write times are low there).

What the curve does not model: per-request work outside the forwards. The lab's repeated 30K
prompt answered its first token in 0.8 s, where the curve gives 0.48 s for the tokens it reads
(from 29,120 on, one 832-token block dropped for drafting) plus 0.01 s for one decoded token; that
0.3 s is paid per call alike by every policy and is left out. Relocating rows (scr) is charged
nothing. It is an estimate, not a measurement: ``eval.offline`` prints it as one, with these sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

SOURCE = ("cold reads of a 27B Qwen hybrid on one GPU, the exact cache's lab (docs/exact.md §3; issue 34): "
          "30K 9.8 s in 4,096-token pieces / 11.4 s in 832-token pieces, 120K 55 / 69.6 s, 200K 152 s in 832-token "
          "pieces; decoding 88.5-89.7 tokens/s")


@dataclass(frozen=True)
class ColdRead:
    """A prompt of ``tokens`` read from nothing in forwards of ``piece`` tokens took ``seconds``."""

    tokens: int
    piece: int
    seconds: float


PUBLISHED = (ColdRead(30_000, 4096, 9.8), ColdRead(30_000, 832, 11.4), ColdRead(120_000, 4096, 55.0),
             ColdRead(120_000, 832, 69.6), ColdRead(200_000, 832, 152.0))
# Not fitted, the curve's check: the lab's window probe (4,096-token pieces) and the same text again.
WINDOW_PROBE = (ColdRead(8_192, 4096, 2.4), ColdRead(60_000, 4096, 22.0), ColdRead(200_000, 4096, 114.0),
                ColdRead(250_000, 4096, 161.0))
GPU_CHUNK = 8192  # SGLang's chunked-prefill size on an 80 GB GPU: how radix and scr read on one, and cut=kept's B
REPEATED_30K = (30_000, 29_120, 0.8)  # context, where the repeated prompt resumed, first token (s)
DECODE_RATE = (88.5 + 89.7) / 2  # tokens/s
FIT_TOLERANCE, CHECK_TOLERANCE = 0.01, 0.03  # relative: the fitted points, the window probe


def forwards(spans: Iterable[tuple[int, int]], chunk: int) -> list[tuple[int, int]]:
    """(context before, tokens read) of each forward reading ``spans`` in pieces of at most
    ``chunk`` tokens (a span already cut into pieces, as exact's are, stays as it is)."""
    out = []
    for start, end in spans:
        for at in range(start, end, chunk):
            out.append((at, min(chunk, end - at)))
    return out


def features(passes: Iterable[tuple[int, int]]) -> list[float]:
    """The curve's four terms summed over forwards (context, tokens)."""
    total = [0.0, 0.0, 0.0, 0.0]
    for context, tokens in passes:
        total[0] += 1
        total[1] += tokens
        total[2] += tokens * (context + tokens / 2)
        total[3] += context
    return total


@dataclass(frozen=True)
class Curve:
    """Fitted coefficients: per forward, per token, attention, per-forward context."""

    coefficients: tuple[float, float, float, float]

    def seconds(self, passes: Iterable[tuple[int, int]]) -> float:
        return sum(c * f for c, f in zip(self.coefficients, features(passes)))

    def cold_read(self, point: ColdRead) -> float:
        return self.seconds(forwards([(0, point.tokens)], point.piece))


def fit(points: Sequence[ColdRead] = PUBLISHED) -> Curve:
    """Least squares on relative error; ``ValueError`` if a coefficient comes out negative (the
    terms would not mean what they say)."""
    import numpy as np

    rows = np.array([features(forwards([(0, p.tokens)], p.piece)) for p in points], dtype=float)
    seconds = np.array([p.seconds for p in points], dtype=float)
    solution, *_ = np.linalg.lstsq(rows / seconds[:, None], np.ones(len(points)), rcond=None)
    if (solution < 0).any():
        raise ValueError(f"the fit gave a negative coefficient: {solution}")
    return Curve(tuple(float(c) for c in solution))


def decode_seconds(tokens: int, rate: float = DECODE_RATE) -> float:
    return tokens / rate


def read_seconds(curve: Curve, spans_per_call: Iterable[Sequence[tuple[int, int]]], chunk: int) -> float:
    """Prefill seconds of every call's read spans, each cut into forwards of at most ``chunk``."""
    return sum(curve.seconds(forwards(spans, chunk)) for spans in spans_per_call)
