"""The KV-cache formats a policy may name at start-up: full precision, or a quantized format.

Both policies move or compare KV rows bit for bit, so both refuse a quantized KV cache, each with
its own reason; the list of SGLang 0.5.16's full-precision ``--kv-cache-dtype`` choices lives here
once. SGLang's choices: ``auto`` (the model's dtype), ``bf16`` and ``bfloat16`` (one format, two
spellings: its pool configurator maps both to ``torch.bfloat16``), and the quantized ``fp8_e5m2``,
``fp8_e4m3``, ``mxfp8``, ``nvfp4``, ``fp4_mx_block16``, ``fp4_e2m1``. Standard library only.
"""

from __future__ import annotations

# None: the setting is absent (a settings mapping built without it); "auto": the model's dtype.
FULL_PRECISION_KV_DTYPES = (None, "auto", "bf16", "bfloat16")


def quantized_kv_problem(settings, consequence: str) -> str | None:
    """A refusal naming ``--kv-cache-dtype`` when ``settings`` ask for a quantized KV cache;
    ``consequence`` says what the policy would get wrong. None for a full-precision cache."""
    kv = settings.get("kv_cache_dtype")
    if kv in FULL_PRECISION_KV_DTYPES:
        return None
    return f"--kv-cache-dtype {kv}: {consequence}; use --kv-cache-dtype auto (or bf16)"
