"""``patches/kernel_selftest.py``, the start-up self-test a CUDA server runs before it serves the kept
rule, run here on the interpreted kernels: it passes where the tier says the properties hold, and
names the GDN chunk kernel (only) when asked about splits off the grid, so it can fail; its
``gdn_keeping`` check (states kept inside a forward) passes on ``patches/gdn_keeps_cuda.py`` and
names a keeper that keeps SGLang's bf16 ``h``."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from patches import kernel_selftest
from patches.kernel_selftest import (EXTEND_ATTENTION, GDN_CHUNK, GDN_KEEPING, Geometry, bit_equal,
                                     split_invariance_failures)
from tests.kernels.conftest import TINY

SELFTEST = Geometry(tokens=130, gdn_k_heads=1, gdn_v_heads=2, gdn_k_dim=64, gdn_v_dim=32,
                    attn_q_heads=2, attn_kv_heads=1, attn_head_dim=32)


@pytest.mark.parametrize("dtype", [torch.float32, "bfloat16"], ids=str)  # a dtype or its name
def test_the_grid_holds_for_both_kernels(sgl, dtype):
    assert split_invariance_failures("cpu", dtype, geometry=SELFTEST, cuts=(64,), kernels=sgl) == {}


def test_the_keeping_check_runs_and_names_a_keeper_that_keeps_the_bf16_h(sgl):
    """The check of ``keeps=inside``: the keeping forward runs (once per call, cut 64 on the grid)
    and holds; a keeper that writes SGLang's ``h`` at the offset widened to fp32 (what
    ``extra_buffer`` tracking keeps) keeps other bits than the forward that ended there."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["keeps"])
        return sgl.keeping.chunk_gated_delta_rule_keeping(*args, **kwargs)

    def from_h(*args, keeps, **kwargs):
        out, none, h = sgl.chunk.chunk_gated_delta_rule(*args, **kwargs, head_first=False,
                                                        use_qk_l2norm_in_kernel=True)
        lengths = kwargs["cu_seqlens"].diff().tolist()
        for keep in keeps:
            row = sum(-(-n // 64) for n in lengths[:keep.sequence]) + keep.offset // 64
            kwargs["initial_state"][keep.slot] = h[0, row].float()
        return out, none, h

    for keeper, expected in ((counted, set()), (from_h, {GDN_KEEPING})):
        kernels = SimpleNamespace(chunk=sgl.chunk, keeping=SimpleNamespace(chunk_gated_delta_rule_keeping=keeper))
        failures = split_invariance_failures("cpu", "bfloat16", geometry=SELFTEST, cuts=(64,), kernels=kernels,
                                             checked=(GDN_KEEPING,))
        assert set(failures) == expected
    assert [[(k.sequence, k.offset) for k in keeps] for keeps in calls] == [[(1, 64)]]
    assert failures[GDN_KEEPING].startswith("the state kept at 64 differs in ")


@pytest.mark.parametrize("dtype, cuts", [("float32", (64,)), ("bfloat16", (37,))], ids=["fp32", "off-grid"])
def test_the_keeping_check_is_not_asked_in_fp32_or_off_the_grid(sgl, dtype, cuts):
    """fp32: SGLang's chunk wrapper refuses the dtype, so the served extend never keeps in it; a cut
    off the grid is no keep point."""
    def refuse(*args, **kwargs):
        raise AssertionError("the keeping forward ran")

    kernels = SimpleNamespace(chunk=sgl.chunk, keeping=SimpleNamespace(chunk_gated_delta_rule_keeping=refuse))
    assert split_invariance_failures("cpu", dtype, geometry=SELFTEST, cuts=cuts, kernels=kernels,
                                     checked=(GDN_KEEPING,)) == {}


def test_a_split_off_the_grid_is_reported_for_the_gdn_kernel_only(sgl):
    failures = split_invariance_failures("cpu", "bfloat16", geometry=SELFTEST, cuts=(37,), kernels=sgl)
    assert set(failures) == {GDN_CHUNK}
    assert failures[GDN_CHUNK].startswith("split at 37: output differs in ")


def test_a_failing_attention_kernel_is_named(sgl):
    """The attention check can fail too: a kernel that walks the keys in another order when part of
    them is a cached prefix (all keys still read)."""
    real = sgl.extend_attention

    def forgetful(q, o, k_pool, v_pool, k_scale, v_scale, qo, kv_indptr, kv_indices, prefix_lens, *args, **kwargs):
        return real.extend_attention_fwd_unified(q, o, k_pool, v_pool, k_scale, v_scale, qo, kv_indptr,
                                                 kv_indices.flip(0) if int(prefix_lens[0]) else kv_indices,
                                                 prefix_lens, *args, **kwargs)

    kernels = SimpleNamespace(chunk=sgl.chunk,
                              extend_attention=SimpleNamespace(extend_attention_fwd_unified=forgetful))
    failures = split_invariance_failures("cpu", "float32", geometry=SELFTEST, cuts=(64,), kernels=kernels,
                                         checked=(EXTEND_ATTENTION,))
    assert set(failures) == {EXTEND_ATTENTION} and failures[EXTEND_ATTENTION].startswith("split at 64: output")


def test_the_geometry_of_a_model_is_one_ranks_shapes(tiny_model_dir):
    text = json.loads((tiny_model_dir / "config.json").read_text())
    text = SimpleNamespace(**text.get("text_config", text))
    full = kernel_selftest.model_geometry(tiny_model_dir)
    assert (full.gdn_k_heads, full.gdn_v_heads, full.gdn_k_dim, full.gdn_v_dim) == (
        text.linear_num_key_heads, text.linear_num_value_heads, text.linear_key_head_dim, text.linear_value_head_dim)
    assert (full.attn_q_heads, full.attn_kv_heads, full.attn_head_dim) == (
        text.num_attention_heads, text.num_key_value_heads, text.head_dim)
    half = kernel_selftest.model_geometry(tiny_model_dir, tp_size=2)
    assert (half.gdn_v_heads, half.attn_q_heads, half.attn_kv_heads) == (
        text.linear_num_value_heads // 2, text.num_attention_heads // 2, max(1, text.num_key_value_heads // 2))


def test_bits_are_compared_as_bits():
    zero = torch.zeros(3)
    assert bit_equal(zero, zero.clone()) and not bit_equal(zero, -zero)
    nan = torch.tensor([float("nan"), 1.0])
    assert bit_equal(nan, nan.clone())
    assert not bit_equal(zero, zero.double()) and not bit_equal(zero, torch.zeros(4))
    assert not bit_equal(torch.ones(2, dtype=torch.bfloat16), torch.tensor([1.0, 1.0078125], dtype=torch.bfloat16))


def test_a_difference_says_what_differs_first():
    a, b = torch.zeros(4), torch.tensor([0.0, 0.5, 0.0, -0.0])
    assert kernel_selftest.difference((a, a), (a, a), ("output", "state")) == ""
    assert kernel_selftest.difference((a, a), (a, b), ("output", "state")) == (
        "state differs in 2 of 4 values (max |diff| 0.5)")
    assert kernel_selftest.difference((a,), (torch.zeros(2),), ("output",)) == (
        "output is torch.float32 (2,), not torch.float32 (4,)")


@pytest.mark.parametrize("grid, status", [({}, 0), ({GDN_CHUNK: "split at 64: output differs"}, 1)])
def test_the_command_line_prints_one_json_line_and_exits_on_the_grid_verdict(monkeypatch, capsys, grid, status):
    calls = []

    def fake(device, dtype, *, geometry, cuts=kernel_selftest.GRID_CUTS, seed=0, kernels=None,
             checked=tuple(kernel_selftest.KERNELS)):
        calls.append((device, dtype, tuple(cuts), tuple(checked)))
        return grid if tuple(cuts) == kernel_selftest.GRID_CUTS else {GDN_CHUNK: "split at 37: output differs"}

    monkeypatch.setattr(kernel_selftest, "split_invariance_failures", fake)
    assert kernel_selftest.main(["--device", "cuda", "--dtype", "bfloat16"]) == status
    line = capsys.readouterr().out.strip()
    assert line.startswith(kernel_selftest.RESULT_PREFIX)
    report = json.loads(line[len(kernel_selftest.RESULT_PREFIX):])
    assert report["grid_failures"] == grid and report["off_grid"] == {GDN_CHUNK: "split at 37: output differs"}
    assert calls == [("cuda", "bfloat16", kernel_selftest.GRID_CUTS, (GDN_CHUNK, EXTEND_ATTENTION, GDN_KEEPING)),
                     ("cuda", "bfloat16", kernel_selftest.OFF_GRID_CUTS, (GDN_CHUNK, EXTEND_ATTENTION))]


def test_tiers_geometry_uses_the_kernels_tiles():
    """The tier's tiny shapes keep what chooses the kernels' arithmetic: more tokens than two GDN
    chunks, a ragged last chunk, grouped heads on both kernels."""
    assert TINY.tokens > 2 * kernel_selftest.GRID and TINY.tokens % kernel_selftest.GRID
    assert TINY.gdn_v_heads > TINY.gdn_k_heads and TINY.attn_q_heads > TINY.attn_kv_heads
