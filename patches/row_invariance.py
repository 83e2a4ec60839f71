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

Prefill (``keeps=inside``, docs/exact.md §5.14): an fp32 product of at most a few rows takes the
GEMV path too, so a forward's last rows read in a short forward of their own ([448, 450) after a
resume) and the same rows at the end of a longer one ([384, 450) cold) differ in the last bit.
Measured on the tiny model's linears (``tests/reference/test_split_invariance.py``): rows in a
product of 1 or 2 rows (up to 5 with K = 128) differ; from 6 rows on, and for any product padded to
64 rows, they have the bits of the same rows in a longer product. So a prefill product of fewer than
``PREFILL_ROWS`` rows runs padded with zero rows to ``PREFILL_ROWS``. (Under ``keeps=ends`` no prompt
tail is ever read in two different forwards: the floored prompt end ends one, cold and warm.)

Cost: B one-row products per layer instead of one B-row product, but the B requests still share
every scheduler step, which dominates on a CPU. Measured (``python -m eval.bench_batch_invariance``,
tiny model, 2-core CPU, 64 decode tokens per request, median of 3): exact / radix wall time 1.37
with 1 request, 0.90 with 2, 1.06 with 4; serial decode would multiply it by about B. The check is
``tests/engine/test_exact_server.py`` (a warm request decoded beside 1 and 3 others, bit for bit).
Hooks (AROUND): ``FORWARD`` marks a decode or prefill forward, during which ``LINEAR`` and ``LM_HEAD``
go row by row (decode) or at least ``PREFILL_ROWS`` rows at a time (prefill).
"""

from __future__ import annotations

import torch

FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
LINEAR = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"

PREFILL_ROWS = 64  # a prefill product has at least this many rows (the short ones padded)
_FORWARD = {"mode": None}  # "decode", "prefill" or None; one scheduler thread runs the forwards (no overlap)


def rowwise(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)``; during a decode forward a 2-D ``x`` of several rows goes one row at a time, during
    a prefill forward one of fewer than ``PREFILL_ROWS`` rows goes padded with zero rows."""
    mode = _FORWARD["mode"]
    if x.dim() != 2:
        return fn(x)
    if mode == "decode" and x.shape[0] >= 2:
        return torch.cat([fn(x[i:i + 1]) for i in range(x.shape[0])], dim=0)
    if mode == "prefill" and x.shape[0] < PREFILL_ROWS:
        padded = torch.cat([x, x.new_zeros(PREFILL_ROWS - x.shape[0], x.shape[1])])
        return fn(padded)[:x.shape[0]]
    return fn(x)


def install(register) -> None:
    def forward(original, runner, forward_batch, *args, **kwargs):
        mode = forward_batch.forward_mode
        _FORWARD["mode"] = "decode" if mode.is_decode() else "prefill" if mode.is_extend() else None
        try:
            return original(runner, forward_batch, *args, **kwargs)
        finally:
            _FORWARD["mode"] = None

    def linear(original, method, layer, x, bias=None, *args, **kwargs):
        return rowwise(lambda rows: original(method, layer, rows, bias, *args, **kwargs), x)

    def lm_head(original, processor, hidden_states, head, *args, **kwargs):
        return rowwise(lambda rows: original(processor, rows, head, *args, **kwargs), hidden_states)

    register(FORWARD, forward, "around")
    register(LINEAR, linear, "around")
    register(LM_HEAD, lm_head, "around")
