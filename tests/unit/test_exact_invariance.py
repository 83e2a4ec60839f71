"""exact_cache.invariance: which server settings break a cached read's bit-identity."""

from __future__ import annotations

import pytest

from exact_cache.invariance import invariance_problems

SAFE_GPU = {
    "prefill_max_requests": 1,
    "enable_mixed_chunk": False,
    "enable_deterministic_inference": True,
    "attention_backend": "triton",
    "linear_attn_prefill_backend": "triton",
    "mamba_ssm_dtype": None,
    "cuda_graph_backend_prefill": "disabled",
}

DETERMINISM = "batch-invariant kernels are needed: add --enable-deterministic-inference"
EXCLUSIVE = "prefill forwards must be exclusive: --prefill-max-requests 1 and no --enable-mixed-chunk"


@pytest.mark.parametrize(
    "changes, env, on_cuda, expected",
    [
        ({}, {}, True, []),
        ({}, {}, False, []),
        ({"enable_deterministic_inference": False}, {}, True, [DETERMINISM]),
        ({"enable_deterministic_inference": False}, {}, False, []),
        ({"attention_backend": "fa3"}, {}, True,
         ["attention must not depend on the prefix split: use --attention-backend triton (got fa3)"]),
        ({"linear_attn_prefill_backend": None}, {}, True,
         ["the GDN prefill must be the Triton kernel: add --linear-attn-prefill-backend triton (got None)"]),
        ({"mamba_ssm_dtype": "bfloat16"}, {}, False,
         ["the recurrent state must stay fp32: drop --mamba-ssm-dtype / SGLANG_MAMBA_SSM_DTYPE (bfloat16)"]),
        ({}, {"SGLANG_MAMBA_SSM_DTYPE": "float16"}, False,
         ["the recurrent state must stay fp32: drop --mamba-ssm-dtype / SGLANG_MAMBA_SSM_DTYPE (float16)"]),
        ({"mamba_ssm_dtype": "float32"}, {}, True, []),
        ({"enable_int8_mamba_checkpoint": True}, {}, False,
         ["int8 state checkpoints are lossy: drop --enable-int8-mamba-checkpoint"]),
        ({"enable_linear_replayssm": True}, {}, False,
         ["ReplaySSM lags the donated state behind the live one: drop --enable-linear-replayssm"]),
        ({"prefill_max_requests": None}, {}, False, [EXCLUSIVE]),
        ({"enable_mixed_chunk": True}, {}, False, [EXCLUSIVE]),
        ({"enable_deterministic_inference": False, "attention_backend": "flashinfer", "prefill_max_requests": 2},
         {}, True,
         [EXCLUSIVE, DETERMINISM,
          "attention must not depend on the prefix split: use --attention-backend triton (got flashinfer)"]),
    ],
    ids=["gpu-safe", "cpu-safe", "gpu-no-determinism", "cpu-needs-no-determinism", "gpu-fa3",
         "gpu-gdn-prefill-unset", "bf16-state-flag", "fp16-state-env", "fp32-explicit", "int8-ckpt",
         "replayssm", "shared-prefill", "mixed-chunk", "several"],
)
def test_invariance_problems(changes, env, on_cuda, expected):
    env = {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64", **env}
    assert invariance_problems({**SAFE_GPU, **changes}, env, on_cuda, piece_tokens=832) == expected


@pytest.mark.parametrize(
    "env, piece, expected",
    [
        ({}, 832, ["piece_tokens=832 is not a multiple of SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE=4096: "
                   "set SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE=64 (or another divisor of piece_tokens)"]),
        ({}, 8192, []),
        ({"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}, 832, []),
        ({"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "256"}, 832,
         ["piece_tokens=832 is not a multiple of SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE=256: "
          "set SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE=64 (or another divisor of piece_tokens)"]),
    ],
    ids=["default-4096", "piece-multiple-of-4096", "env-64", "env-256"],
)
def test_deterministic_triton_truncation_grid(env, piece, expected):
    assert invariance_problems(SAFE_GPU, env, True, piece_tokens=piece) == expected


@pytest.mark.parametrize("changes, refused", [({}, False), ({"tp_size": 2}, False),
                                              ({"tp_size": 2, "enable_dp_attention": True}, True)])
def test_the_policy_refuses_dp_attention_but_not_tensor_parallelism(changes, refused):
    """TP ranks check they agree after every forward (docs/tensor_parallel.md §3); with dp-attention
    the ranks of one TP group serve different requests, so that check cannot hold."""
    from exact_cache.config import ExactConfig
    from exact_cache.policy import ExactPolicy

    problems = ExactPolicy(ExactConfig(piece_tokens=832)).startup_problems({**SAFE_GPU, **changes}, {}, True)
    assert sum(p.startswith("--enable-dp-attention: the ranks of one TP group") for p in problems) == refused


@pytest.mark.parametrize("changes, expected", [
    ({}, []),
    ({"quantization": "fp8"}, ["quantized weights (--quantization fp8)"]),
    ({"checkpoint_quantization": "fp8"}, ["quantized weights (the checkpoint's quantization_config fp8)"]),
    ({"checkpoint_quantization": "awq", "quantization": "awq_marlin"},
     ["quantized weights (--quantization awq_marlin)", "quantized weights (the checkpoint's quantization_config awq)"]),
    ({"kv_cache_dtype": "fp8_e4m3"}, ["--kv-cache-dtype fp8_e4m3: quantized KV rows"]),
    ({"kv_cache_dtype": "bfloat16", "quantization": None, "checkpoint_quantization": None}, []),
    ({"kv_cache_dtype": "bf16"}, []),
    ({"kv_cache_dtype": "nvfp4"}, ["--kv-cache-dtype nvfp4: quantized KV rows"]),
], ids=["bf16", "fp8-flag", "fp8-checkpoint", "both", "fp8-kv", "explicit-bf16", "bf16-alias", "fp4-kv"])
@pytest.mark.parametrize("on_cuda", [True, False], ids=["cuda", "cpu"])
def test_quantized_formats_are_refused_on_every_device(changes, expected, on_cuda):
    env = {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}
    problems = invariance_problems({**SAFE_GPU, "kv_cache_dtype": "auto", **changes}, env, on_cuda, piece_tokens=832)
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected):
        assert problem.startswith(start)


class _Phase:
    def __init__(self, backend):
        self.backend = backend


class _GraphConfig:  # the shape of SGLang's resolved CudaGraphConfig
    def __init__(self, prefill):
        self.prefill = _Phase(prefill)


@pytest.mark.parametrize("changes, refused", [
    ({"cuda_graph_backend_prefill": None}, "breakable"),  # SGLang's CUDA default
    ({"cuda_graph_backend_prefill": "tc_piecewise"}, "tc_piecewise"),
    ({"cuda_graph_backend_prefill": None, "disable_cuda_graph": True}, None),
    ({"cuda_graph_backend_prefill": None, "disable_prefill_cuda_graph": True}, None),
    ({"cuda_graph_config": _GraphConfig("full")}, "full"),  # the resolved value wins over the flag
    ({"cuda_graph_backend_prefill": None, "cuda_graph_config": _GraphConfig("disabled")}, None),
])
def test_prefill_cuda_graphs_are_refused_on_cuda(changes, refused):
    env = {"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE": "64"}
    problems = invariance_problems({**SAFE_GPU, **changes}, env, True, piece_tokens=832)
    assert problems == ([f"prefill CUDA graphs ({refused}) are unverified with exact's pieces: add "
                         "--cuda-graph-backend-prefill disabled (the default serving profile does)"] if refused else [])
    assert invariance_problems({**SAFE_GPU, **changes}, env, False, piece_tokens=832) == []
