"""The tier's own harness (``tests/kernels/interpreted.py``): the interpreted kernels stay out of the
rest of the process, the shims undo themselves, and bf16 arithmetic is real arithmetic."""

from __future__ import annotations

import os
import sys

import torch

from tests.kernels.interpreted import MODULES, autotuner_of, interpreting, load, prefer_configs


def test_load_leaves_the_process_as_it_was(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    before = {name: sys.modules.get(name) for name in MODULES.values()}
    kernels = load()
    assert "TRITON_INTERPRET" not in os.environ
    assert {name: sys.modules.get(name) for name in MODULES.values()} == before
    assert isinstance(kernels.extend_attention._fwd_kernel_unified, InterpretedFunction)
    from sglang.kernels.ops.attention import extend_attention  # what the rest of the process imports

    assert isinstance(extend_attention._fwd_kernel_unified, JITFunction)


def test_interpreting_restores_what_it_found():
    """The autouse fixture has entered ``interpreting()``; a nested block leaves its state intact."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction, interpreter_builder

    state = (tl.sum, tl.sigmoid, dict(vars(interpreter_builder)))
    assert isinstance(tl.sigmoid, InterpretedFunction)
    with interpreting():
        assert tl.sigmoid is state[1]  # one interpreted twin per function
        assert vars(interpreter_builder)["binary_op"] is not state[2]["binary_op"]
    assert (tl.sum, tl.sigmoid, dict(vars(interpreter_builder))) == state


def test_bf16_arithmetic_is_evaluated_on_values(sgl):
    """Shim 5 through a real kernel: a bf16 product (bf16 operands, fp32 accumulation, a bf16
    result) equals torch's within bf16's rounding; on raw 16-bit integers it would be garbage."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.randn(32, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out = sgl.batch_invariant.mm_batch_invariant(x, w).float()
    ref = x.float() @ w.float()
    assert (out - ref).abs().max().item() <= 2 ** -7 * ref.abs().max().item()


def test_prefer_configs_picks_a_config_and_forgets_it(sgl):
    kernel = sgl.chunk_fwd.chunk_gated_delta_rule_fwd_kkt_solve_kernel
    tuner = autotuner_of(kernel)
    with prefer_configs(kernel, lambda config: config.kwargs["BK"] == 64) as chosen:
        assert chosen is tuner and not tuner.cache
    assert not tuner.cache
