"""What a GPU server must run with for a cached read to be bit-identical to a cold one.

``docs/exact.md`` §2.2 / §5.10 and ``docs/sglang.md`` §5: batch-invariant GEMMs and
norms, an attention kernel whose reduction order does not depend on where the cached prefix
ends, the Triton GDN prefill (whose 64-token grid restarts at each forward, which the 64-aligned
pieces make harmless), an fp32 recurrent state with no lossy checkpoint pools, and exclusive
prefill forwards. On CPU the torch kernels are deterministic and the launcher already forces
exclusive pieces, so only the pool checks apply there.
"""

from __future__ import annotations

from typing import Mapping

from policy.api import CHECKPOINT_QUANTIZATION
from policy.formats import quantized_kv_problem

DETERMINISTIC_ATTENTION = ("triton",)  # tiles keys from absolute position 0 (fa3's invariance is unverified)


# Weight and KV formats whose kernels SGLang 0.5.16's deterministic mode makes batch-invariant
# (its batch-invariant ops cover dense bf16/fp16/fp32 matmuls; fp8/int4/nvfp4 GEMMs pick tiles and
# split-K by batch size, so a cached read would not be bit-identical to a cold one).
UNQUANTIZED = (None, "", "auto", "none")


def weight_format_problems(settings: Mapping[str, object]) -> list[str]:
    """Quantized weights or KV cache, from the command line or the checkpoint's own config
    (``settings[CHECKPOINT_QUANTIZATION]``, which the launcher reads from ``config.json``)."""
    problems = []
    for source, method in (("--quantization", settings.get("quantization")),
                           ("the checkpoint's quantization_config", settings.get(CHECKPOINT_QUANTIZATION))):
        if method not in UNQUANTIZED:
            problems.append(
                f"quantized weights ({source} {method}): their matrix kernels are not batch-invariant, so a "
                "cached read would differ from a cold one; serve a bf16 checkpoint without --quantization")
    kv = quantized_kv_problem(settings, "quantized KV rows are read by kernels outside SGLang's deterministic set")
    if kv:
        problems.append(kv)
    return problems


def prefill_graph_backend(settings: Mapping[str, object]) -> object:
    """The prefill CUDA-graph backend SGLang resolved: ``cuda_graph_config.prefill.backend`` after
    its post-init (which folds ``--disable-cuda-graph`` and the per-phase flags), else the flag;
    SGLang's CUDA default, ``breakable``, when neither says otherwise."""
    config = settings.get("cuda_graph_config")
    prefill = getattr(config, "prefill", None)
    if prefill is not None and getattr(prefill, "backend", None) is not None:
        return prefill.backend
    if settings.get("disable_cuda_graph") or settings.get("disable_prefill_cuda_graph"):
        return "disabled"
    return settings.get("cuda_graph_backend_prefill") or "breakable"


TRITON_ALIGN_ENV = "SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE"
TRITON_ALIGN_DEFAULT = 4096  # SGLang 0.5.16's default under --enable-deterministic-inference


def invariance_problems(
    settings: Mapping[str, object], env: Mapping[str, str], on_cuda: bool, piece_tokens: int
) -> list[str]:
    """Each setting that breaks exactness, as a message naming the flag to change."""
    problems = weight_format_problems(settings)
    ssm_dtype = env.get("SGLANG_MAMBA_SSM_DTYPE") or settings.get("mamba_ssm_dtype")
    if ssm_dtype not in (None, "float32"):
        problems.append(f"the recurrent state must stay fp32: drop --mamba-ssm-dtype / SGLANG_MAMBA_SSM_DTYPE ({ssm_dtype})")
    if settings.get("enable_int8_mamba_checkpoint"):
        problems.append("int8 state checkpoints are lossy: drop --enable-int8-mamba-checkpoint")
    if settings.get("enable_linear_replayssm"):
        problems.append("ReplaySSM lags the donated state behind the live one: drop --enable-linear-replayssm")
    if settings.get("prefill_max_requests") != 1 or settings.get("enable_mixed_chunk"):
        problems.append("prefill forwards must be exclusive: --prefill-max-requests 1 and no --enable-mixed-chunk")
    if not on_cuda:
        return problems
    if not settings.get("enable_deterministic_inference"):
        problems.append("batch-invariant kernels are needed: add --enable-deterministic-inference")
    if settings.get("attention_backend") not in DETERMINISTIC_ATTENTION:
        problems.append(
            f"attention must not depend on the prefix split: use --attention-backend triton "
            f"(got {settings.get('attention_backend')})"
        )
    align = int(env.get(TRITON_ALIGN_ENV, TRITON_ALIGN_DEFAULT))
    if settings.get("attention_backend") == "triton" and piece_tokens % align:
        # Deterministic Triton prefill cuts new requests at multiples of this size; the pieces
        # must stay on that grid (0.5.23 dropped the rule: its kernel tiles keys from position 0).
        problems.append(
            f"piece_tokens={piece_tokens} is not a multiple of {TRITON_ALIGN_ENV}={align}: "
            f"set {TRITON_ALIGN_ENV}=64 (or another divisor of piece_tokens)"
        )
    graph = prefill_graph_backend(settings)
    if graph != "disabled":
        # A captured prefill replays a graph recorded for a padded token count; whether its kernels
        # split a piece the way an eager forward does has not been checked for exact's pieces.
        problems.append(f"prefill CUDA graphs ({graph}) are unverified with exact's pieces: add "
                        "--cuda-graph-backend-prefill disabled (the default serving profile does)")
    if settings.get("linear_attn_prefill_backend") != "triton":
        problems.append(
            "the GDN prefill must be the Triton kernel: add --linear-attn-prefill-backend triton "
            f"(got {settings.get('linear_attn_prefill_backend')})"
        )
    return problems
