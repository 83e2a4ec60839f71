"""Shared fixtures. Test tiers by folder:

| folder              | needs                                    | typical cost        |
|---------------------|------------------------------------------|---------------------|
| tests/unit          | stdlib (+ torch for the kernel units)     | milliseconds        |
| tests/reference     | torch on CPU                             | < 1 s each          |
| tests/integration   | SGLang imported on CPU, no model served  | seconds             |
| tests/engine        | SGLang serving the tiny model on CPU     | 20-40 s per server  |
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny hybrid model, built once per content of its builder and reused across runs."""
    sources = [ROOT / "scripts" / "make_tiny_model.py", ROOT / "scripts" / "tiny_chat_template.jinja"]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    target = ARTIFACTS / f"tiny-model-{digest}"
    if not (target / "config.json").exists():
        scratch = ARTIFACTS / f"tiny-model-{digest}.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        _load_script("make_tiny_model").build(scratch)
        scratch.rename(target)
    return target
