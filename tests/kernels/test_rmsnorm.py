"""RMSNorm kernels: the gated RMSNorm on every GDN layer's output (``fla.layernorm_gated``, the
model's ``RMSNormGated``: per value head, ``norm(x) * silu(z)``), and the batch-invariant plain
RMSNorm (``batch_invariant_ops.rms_norm``) that ``--enable-deterministic-inference`` puts behind
SGLang's ``RMSNorm`` and ``aten::rms_norm``. Qwen3.5/3.6's other norms are ``GemmaRMSNorm``, which on
CUDA is sgl_kernel's CUDA kernel (not Triton, and not replaced by the deterministic mode): outside
this tier (``docs/exact.md`` §6).

Findings pinned here: a row's bits do not depend on how many rows share the call, with the
deterministic mode's fixed row block and with the default's SM-count-derived one (under the
interpreter every row's sum runs over its own row; on a GPU the block shape is what the
deterministic mode fixes).
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, close_to, dtype_id

HEAD_V = 32
ROWS = (1, 4, 9, 300, 600)  # tokens x value heads; above 264 rows the default mode groups rows per program
PLAIN_ROWS = (1, 4, 9, 40)  # the plain norm runs one program per row, whatever the count


def _rows(n, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, HEAD_V, generator=generator).to(dtype), torch.randn(n, HEAD_V, generator=generator).to(dtype)


def _weight(dtype):
    return (1 + 0.1 * torch.randn(HEAD_V, generator=torch.Generator().manual_seed(2))).to(dtype)


def gated(sgl, x, z, dtype):
    """``RMSNormGated.forward`` on CUDA: ``layernorm_fn(..., norm_before_gate=True, is_rms_norm=True)``."""
    return sgl.layernorm_gated.rms_norm_gated(x=x, weight=_weight(dtype), bias=None, z=z, eps=1e-6,
                                              norm_before_gate=True, is_rms_norm=True, activation="swish")


@pytest.fixture(params=[True, False], ids=["deterministic", "default"])
def mode(sgl, request, monkeypatch):
    """SGLang's batch-invariant flag as the interpreted kernels read it (no aten override is installed)."""
    monkeypatch.setattr(sgl.batch_invariant, "_batch_invariant_MODE", request.param)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_gated_norm_computes_norm_times_silu_of_the_gate(sgl, dtype):
    x, z = _rows(9, dtype)
    out = gated(sgl, x, z, dtype).float()
    x, z = x.float(), z.float()
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * _weight(dtype).float() * torch.nn.functional.silu(z)
    assert close_to(ref, out, dtype)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_row_of_the_gated_norm_does_not_depend_on_the_other_rows(sgl, mode, dtype, rows):
    x, z = _rows(max(ROWS), dtype)
    whole = gated(sgl, x[:rows], z[:rows], dtype)
    for i in {0, rows // 2, rows - 1}:
        assert bit_equal(whole[i:i + 1], gated(sgl, x[i:i + 1], z[i:i + 1], dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_batch_invariant_plain_norm(sgl, dtype):
    x, _ = _rows(PLAIN_ROWS[-1], dtype)
    weight = _weight(dtype)
    whole = sgl.batch_invariant.rms_norm_batch_invariant(x, weight, eps=1e-6)
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    assert close_to(ref, whole, dtype)
    for rows in PLAIN_ROWS:
        part = sgl.batch_invariant.rms_norm_batch_invariant(x[:rows], weight, eps=1e-6)
        assert bit_equal(part, whole[:rows])
