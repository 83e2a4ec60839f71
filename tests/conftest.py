"""Shared fixtures. Test tiers by folder:

| folder              | needs                                    | typical cost        |
|---------------------|------------------------------------------|---------------------|
| tests/unit          | stdlib (+ torch for the kernel units)     | milliseconds        |
| tests/reference     | torch on CPU                             | < 1 s each          |
| tests/integration   | SGLang imported on CPU, no model served  | seconds             |
| tests/kernels       | SGLang's Triton kernels, interpreted     | seconds each        |
| tests/engine        | SGLang serving the tiny model on CPU     | 20-40 s per server  |
"""

from __future__ import annotations

import os

# The suite is the CPU suite, also on a GPU box: with a GPU visible, SGLang and torch take their
# CUDA paths (the CPU platform support stays off) and the CPU expectations fail. So hide GPUs
# here, before anything below imports torch, and from every server and child process the tests
# start (they inherit os.environ). Assigned, not setdefault: a GPU user usually has it set
# already. scripts/test.sh does the same; the GPU check is scripts/gpu_check.sh.
SEE_GPU_ENV = "CACHE_POLICY_TESTS_SEE_GPU"
if os.environ.get(SEE_GPU_ENV) != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from eval.tiny_model import cached_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny hybrid model, built once per content of its builder and reused across runs."""
    return cached_build(ARTIFACTS)
