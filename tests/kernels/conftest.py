"""The kernel tier: SGLang 0.5.16's own Triton GPU kernels, run on the CPU under the Triton
interpreter (``tests/kernels/interpreted.py``), at tiny shapes, for the properties exact's kept rule
needs (``docs/exact.md`` §6): split invariance (and where it stops: the grid), batch invariance,
M-invariance of the matrix products. No server, no GPU; a few minutes on two cores.

Every test gets the interpreted modules from the fixture ``sgl`` and runs inside
``interpreting()`` (Triton's own library functions interpreted too, bf16 arithmetic on values).
A property that does not hold is pinned as what is (``test_..._changes_bits``), never dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from patches.kernel_selftest import Geometry
from tests.kernels.interpreted import interpreting, load

# The tier's shapes: the kernels' own tiles (64-token GDN chunks, 64-key attention blocks, the
# 32-token decode blocks) with as few heads and dims as the kernels accept.
TINY = Geometry(tokens=170, gdn_k_heads=1, gdn_v_heads=2, gdn_k_dim=64, gdn_v_dim=32,
                attn_q_heads=2, attn_kv_heads=1, attn_head_dim=32)
DTYPES = (torch.float32, torch.bfloat16)
NEIGHBOURS = (1, 3, 8)


# What the interpreter says about SGLang's kernel source on a CPU, not about the properties: fla's
# "no GPU" notice, Triton's deprecation of make_block_ptr (fla uses it), and numpy's notes on masked
# lanes it computes anyway (-inf - -inf in a masked softmax, discarded by the kernel's mask).
EXPECTED_WARNINGS = (
    "ignore:Triton is not supported on current platform:UserWarning",
    "ignore:tl.make_block_ptr is deprecated:UserWarning",
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            for rule in EXPECTED_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(rule))


@pytest.fixture(scope="package")
def sgl():
    return load()


@pytest.fixture(scope="package", autouse=True)
def _interpreted(sgl):
    """The tier's tests (and their module fixtures) run inside ``interpreting()``; the rest of the
    session does not."""
    with interpreting():
        yield


def dtype_id(dtype) -> str:
    return str(dtype).removeprefix("torch.")


RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def close_to(reference, got, dtype) -> bool:
    """``got`` within ``dtype``'s tolerance of ``reference``, relative to the reference's largest
    magnitude. Only the sanity checks use it (a kernel computes what it should, two variants agree
    up to rounding); the properties are compared bit for bit."""
    reference = reference.float()
    error = (got.float().reshape(reference.shape) - reference).abs().max().item()
    return error <= RELATIVE_TOLERANCE[dtype] * reference.abs().max().item()
