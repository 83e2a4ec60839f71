"""The matrix products of ``--enable-deterministic-inference``: SGLang's batch-invariant ops register
``mm_batch_invariant`` / ``addmm_batch_invariant`` for ``aten::mm`` / ``aten::addmm`` (every linear
layer) and ``log_softmax`` for ``aten::_log_softmax``. Their Triton path is a persistent matmul with
one tile shape per dtype (128 x 128, K in steps of 32 in fp32 and 64 in bf16) whatever M is.

Findings pinned here: M-invariance, a row's product does not depend on how many rows are multiplied
with it, for the products and the log-softmax. Not covered: on a GPU with DeepGEMM (Hopper and
newer, SGLang's default there) ``mm_batch_invariant`` hands bf16 products to DeepGEMM's
``bf16_gemm_nn``, a CUDA kernel (``docs/exact.md`` §6); ``mean_batch_invariant`` refuses CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from patches.kernel_selftest import bit_equal
from tests.kernels.conftest import DTYPES, close_to, dtype_id

K, N = 160, 48  # K spans several K steps, with a ragged last one in fp32 (5 x 32) and bf16 (2.5 x 64)
M_VALUES = (1, 2, 8, 127, 300)  # 300 rows: three row tiles
SOFTMAX_ROWS = (1, 2, 8, 40)  # one program per row, whatever the count


def _operands(dtype):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(max(M_VALUES), K, generator=generator).to(dtype)
    weight = torch.randn(N, K, generator=generator).to(dtype)
    bias = torch.randn(N, generator=generator).to(dtype)
    return x, weight.t(), bias  # a linear layer's operands: the weight transposed, not copied


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_persistent_matmul_computes_the_product(sgl, dtype):
    x, w, bias = _operands(dtype)
    out = sgl.batch_invariant.addmm_batch_invariant(bias, x, w).float()
    ref = x.float() @ w.float() + bias.float()
    assert close_to(ref, out, dtype)


@pytest.mark.parametrize("with_bias", [False, True], ids=["mm", "addmm"])
@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_row_of_the_product_does_not_depend_on_m(sgl, dtype, m, with_bias):
    x, w, bias = _operands(dtype)
    ops = sgl.batch_invariant

    def product(rows):
        return ops.addmm_batch_invariant(bias, rows, w) if with_bias else ops.mm_batch_invariant(rows, w)

    whole = product(x)
    part = product(x[:m])
    assert bit_equal(part, whole[:m])
    row = m // 2
    assert bit_equal(product(x[row:row + 1]), whole[row:row + 1])


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_row_of_the_log_softmax_does_not_depend_on_m(sgl, dtype):
    logits = _operands(dtype)[0][:SOFTMAX_ROWS[-1]]
    whole = sgl.batch_invariant.log_softmax(logits, dim=-1)
    ref = torch.log_softmax(logits.float(), dim=-1)
    assert close_to(ref, whole, dtype)
    for m in SOFTMAX_ROWS:
        assert bit_equal(sgl.batch_invariant.log_softmax(logits[:m], dim=-1), whole[:m])
