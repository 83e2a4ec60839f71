"""Shared fixtures. Test tiers by folder:

| folder              | needs                                    | typical cost        |
|---------------------|------------------------------------------|---------------------|
| tests/unit          | stdlib (+ torch for the kernel units)     | milliseconds        |
| tests/reference     | torch on CPU                             | < 1 s each          |
| tests/integration   | SGLang imported on CPU, no model served  | seconds             |
| tests/engine        | SGLang serving the tiny model on CPU     | 20-40 s per server  |
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eval.tiny_model import cached_build

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny hybrid model, built once per content of its builder and reused across runs."""
    return cached_build(ARTIFACTS)
