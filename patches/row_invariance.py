"""Small matrix products computed row by row in decode, so a row's bits do not depend on its batch.

Why (``exact`` on CPU, docs/exact.md §5.10): an fp32 ``F.linear``/``matmul`` takes another code
path for one row (GEMV) than for several (blocked GEMM), so a warm request decoded beside others
would differ from the cold read decoded alone. Prefill needs no row-by-row products: ``exact``
prefills one request at a time, every forward on the 64-token grid or the same cold and warm (its
rows' products are then bit-identical, ``tests/reference/test_split_invariance.py``), with its
attention in tiles from position 0 (``patches/cpu/attention.py``). Everything else on the decode path is per row
already (torch-native attention per request, norms, the GDN recurrence, the conv) or per
sequence by construction (the GDN gates, ``patches/cpu/kernels._decode_sequences``: an
elementwise op's SIMD body and scalar tail round differently). On a GPU
SGLang's ``--enable-deterministic-inference`` gives batch-invariant kernels instead.

Cost: B one-row products per layer instead of one B-row product, but the B requests still share
every scheduler step, which dominates on a CPU. Measured (``python -m eval.bench_batch_invariance``,
tiny model, 2-core CPU, 64 decode tokens per request, median of 3): exact / radix wall time 1.37
with 1 request, 0.90 with 2, 1.06 with 4; serial decode would multiply it by about B. The check is
``tests/engine/test_exact_server.py`` (a warm request decoded beside 1 and 3 others, bit for bit).
Hooks (AROUND): ``FORWARD`` marks a decode forward, during which ``LINEAR`` and ``LM_HEAD`` go row by row.
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
