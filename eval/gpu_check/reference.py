"""The fp32 reference of the tiny model (transformers on CPU) and the tolerance a served answer gets.

Why two tolerances. The engine tests compare the CPU server's logprobs with an fp32 reference
within 1e-4 (measured ~1e-6): both sides compute in fp32, only the order of sums differs. A GPU
serves the checkpoint in bf16: every activation and matrix output is rounded to an 8-bit
significand (relative 2^-8 = 0.4 %), eight layers deep, so the logprobs move by far more than
1e-4. Measured with transformers on this model (bf16 vs fp32, same bf16 weights, 5 prompts of
300-1,700 tokens, 3,600 positions): max |Δ logprob| of the fp32 argmax token 0.10-0.14, mean
0.02, argmax agreeing at 98 % of positions. ``BF16_TOL`` = 0.5 leaves that about 3.5x (GPU
kernels order their fp32 accumulations differently again); it still catches a kernel that is
wrong rather than rounded (a wrong rotation or recurrent state moves logprobs by O(1)).

Bit-for-bit comparisons (exact's warm = cold) need no tolerance on any device: both answers come
from the same server and kernels, so they are compared with ``==``.

One of the check's two modules that import torch in the check's own process (with ``rotary.py``):
the layering rule keeps torch out of ``eval/`` otherwise (``tests/unit/test_import_rules.py``).
"""

from __future__ import annotations

from pathlib import Path

FP32_TOL = 1e-4  # a fp32 server (CPU) against the fp32 reference, as tests/engine
BF16_TOL = 0.5  # a bf16 server (GPU) against the fp32 reference (see the module docstring)


def tolerance(cuda: bool) -> float:
    return BF16_TOL if cuda else FP32_TOL


class Reference:
    """transformers' ``Qwen3_5ForConditionalGeneration`` in fp32 on CPU, loaded on first use."""

    def __init__(self, model_dir: Path):
        self.model_dir = Path(model_dir)
        self._model = None

    def model(self, dtype=None, device: str = "cpu"):
        import torch
        from transformers import Qwen3_5ForConditionalGeneration

        dtype = dtype or torch.float32
        if dtype == torch.float32 and device == "cpu" and self._model is not None:
            return self._model
        model = Qwen3_5ForConditionalGeneration.from_pretrained(self.model_dir, dtype=dtype,
                                                                local_files_only=True).eval().to(device)
        if dtype == torch.float32 and device == "cpu":
            self._model = model
        return model

    def log_softmax(self, ids: list[int], model=None):
        """``[len(ids), vocab]`` float64 log-probabilities of the next token at each position."""
        import torch

        model = model or self.model()
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=device)).logits[0]
        return logits.double().log_softmax(-1).cpu()


def served_distance(reference: Reference, prompt: list[int], output_ids: list[int],
                    logprobs: list[float]) -> tuple[float, float]:
    """A served answer against the fp32 reference teacher-forced with the served ids:
    (max |served logprob − reference logprob|, max shortfall of the served token's reference
    logprob below the reference's best token: 0 when greedy picked the reference argmax)."""
    table = reference.log_softmax(list(prompt) + list(output_ids))
    first = len(prompt) - 1
    delta = shortfall = 0.0
    for step, (token, served) in enumerate(zip(output_ids, logprobs)):
        row = table[first + step]
        delta = max(delta, abs(float(row[token]) - float(served)))
        shortfall = max(shortfall, float(row.max()) - float(row[token]))
    return delta, shortfall


def bf16_distance(reference: Reference, device: str, prompts: list[list[int]]) -> dict:
    """The model in bf16 on ``device`` against the fp32 reference, next-token logprobs of the fp32
    argmax at every position of ``prompts``: max and mean |Δ|, and how often the argmax agrees."""
    import torch

    model = reference.model(torch.bfloat16, device)
    worst = total = 0.0
    count = agree = 0
    for ids in prompts:
        full = reference.log_softmax(ids)
        half = reference.log_softmax(ids, model)
        if not bool(torch.isfinite(half).all()):
            return {"finite": False}
        best = full.argmax(-1)
        diff = (full.gather(-1, best[:, None]) - half.gather(-1, best[:, None])).abs()
        worst, total, count = max(worst, float(diff.max())), total + float(diff.sum()), count + len(ids)
        agree += int((half.argmax(-1) == best).sum())
    return {"finite": True, "max": worst, "mean": total / count, "argmax_agree": agree / count, "positions": count}
