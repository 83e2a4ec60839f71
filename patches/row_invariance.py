"""Small matrix products computed row by row, so a row's bits do not depend on its batch (``exact`` on CPU).

Why: on CPU an fp32 ``F.linear``/``matmul`` takes another code path (GEMV vs blocked GEMM) for
one row than for several, so row 0 of a 2..4-row product has other bits than the same row alone.
A warm request decoded in one batch with others would then differ from the cold read decoded
alone, and ``exact`` promises bit-identity. Prefill is not affected: ``exact`` prefills one
request at a time (``--prefill-max-requests 1``) in pieces of the same sizes in the warm and the
cold read (the piece grid). So only decode batches need care: while a decode forward runs, each
row of a product is computed as a one-row product, exactly what a request decoded alone computes.

Hooks (AROUND, installed by ``patches.plugin`` for ``--cache-policy exact`` without CUDA):

| target                                             | what it does                               |
|----------------------------------------------------|--------------------------------------------|
| ``ModelRunner.forward``                            | marks a decode forward (``_DECODING``)     |
| ``UnquantizedLinearMethod.apply``                  | splits every linear layer's rows in decode |
| ``LogitsProcessor._compute_lm_head``               | splits the LM head's rows in decode        |

Why row-wise products and not one-request-at-a-time decode: decode of B requests then takes B
one-row products per layer instead of one B-row product, but the B requests still share every
scheduler step, and on a CPU the step overhead dominates. Measured (``python -m
eval.bench_batch_invariance``, tiny model, 2-core CPU, 64 decode tokens per request, median of 3,
one run): exact / radix wall time 1.37 with 1 request (exact's own per-request work), 0.90 with 2
and 1.06 with 4, within the noise of a shared box. Serial decode would multiply the time by about
B. The row-wise cost grows with the width of the matrices, so it is larger for a real model on CPU.

Everything else on the decode path is per row already (attention runs per request in the
torch-native backend; norms, the GDN recurrence and the conv are row-wise elementwise or per
batch element). The engine test that decodes a warm request beside 1 and 3 others and compares it
with the cold solo read bit for bit is the check (``tests/engine/test_exact_server.py``). On a
GPU SGLang's ``--enable-deterministic-inference`` gives batch-invariant kernels instead.
"""

from __future__ import annotations

import torch

FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
LINEAR = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"

_DECODING = {"on": False}  # one scheduler thread runs the forwards (overlap scheduling is off)


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)``; during a decode forward, a 2-D ``x`` of several rows goes one row at a time."""
    if not _DECODING["on"] or x.dim() != 2 or x.shape[0] < 2:
        return fn(x)
    return torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])], dim=0)


def install(register) -> None:
    def forward(original, runner, forward_batch, *args, **kwargs):
        _DECODING["on"] = bool(forward_batch.forward_mode.is_decode())
        try:
            return original(runner, forward_batch, *args, **kwargs)
        finally:
            _DECODING["on"] = False

    def linear(original, method, layer, x, bias=None, *args, **kwargs):
        return rowwise(lambda rows: original(method, layer, rows, bias, *args, **kwargs), x)

    def lm_head(original, processor, hidden_states, head, *args, **kwargs):
        return rowwise(lambda rows: original(processor, rows, head, *args, **kwargs), hidden_states)

    register(FORWARD, forward, "around")
    register(LINEAR, linear, "around")
    register(LM_HEAD, lm_head, "around")
