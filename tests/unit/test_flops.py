"""eval/accounting/flops.py against hand arithmetic (docs/model.md §4, docs/eval.md §5.7)."""

from __future__ import annotations

import json

import pytest

from eval.accounting import flops
from eval.accounting.flops import QWEN36_27B


def test_qwen36_27b_components():
    assert flops.mlp_flops_per_token(QWEN36_27B) == 2 * 64 * 3 * 5120 * 17408 == 34_225_520_640  # 34.23e9
    assert flops.attention_projection_flops_per_token(QWEN36_27B) == (
        2 * 16 * (5120 * 12288 + 2 * 5120 * 1024 + 6144 * 5120)) == 3_355_443_200  # 3.36e9
    assert flops.gdn_projection_flops_per_token(QWEN36_27B) == (
        2 * 48 * (5120 * 10240 + 5120 * 6144 + 2 * 5120 * 48 + 6144 * 5120)) == 11_120_148_480  # 11.12e9
    assert flops.body_flops_per_token(QWEN36_27B) == 48_701_112_320  # 48.70e9
    assert round(flops.body_flops_per_token(QWEN36_27B) / 1e9, 2) == 48.70


def test_qwen36_27b_body_parameters_and_pair_cost():
    # matmul weights (48,701,112,320 / 2) + conv 1,966,080 + norms 668,672 + A_log/dt_bias 4,608 + GDN norm 6,144
    assert QWEN36_27B.small_params() == 1_966_080 + 668_672 + 4_608 + 6_144
    assert flops.n_body(QWEN36_27B) == 24_353_201_664
    assert flops.flops_per_pair(QWEN36_27B) == 4 * 16 * 24 * 256 == 393_216


def test_tiny_model_geometry_from_its_config(tiny_model_dir):
    geometry = flops.geometry_from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    # 8 layers (6 GDN, 2 full), hidden 64, MLP 128, 4 query / 2 KV heads of 32, GDN 2x16 keys, 4x16 values
    assert (geometry.gdn_layers, geometry.full_layers) == (6, 2)
    assert flops.mlp_flops_per_token(geometry) == 2 * 8 * 3 * 64 * 128 == 393_216
    assert flops.attention_projection_flops_per_token(geometry) == 2 * 2 * (64 * 256 + 64 * 128 + 128 * 64) == 131_072
    assert flops.gdn_projection_flops_per_token(geometry) == 2 * 6 * (64 * 128 + 64 * 64 + 2 * 64 * 4 + 64 * 64) == 202_752
    assert flops.body_flops_per_token(geometry) == 727_040
    assert flops.flops_per_pair(geometry) == 4 * 2 * 4 * 32 == 1_024


@pytest.mark.parametrize(
    "prompt, read, decode, pairs",
    [
        (100, 100, 0, 5_000.0),  # cold prefill: P²/2
        (100, 0, 0, 0.0),
        (100, 40, 0, (100**2 - 60**2) / 2),  # 3,200
        (100, 40, 10, 3_200 + 10 * 100 + 50.0),
    ],
    ids=["cold", "all-reused", "suffix-read", "with-decode"],
)
def test_attention_pairs(prompt, read, decode, pairs):
    assert flops.attention_pairs(prompt, read, decode) == pairs


def test_request_pflops():
    body = 24.3532e9
    assert flops.prefix_reuse_pflops(read=1000, decode=200, body_params=body) == pytest.approx(2 * body * 1200 / 1e15)
    assert flops.naive_pflops(prompt=5000, decode=200, body_params=body) == pytest.approx(2 * body * 5200 / 1e15)
    expected = 2 * body * 1200 / 1e15 + 393_216 * flops.attention_pairs(5000, 1000, 200) / 1e15
    assert flops.with_attention_pflops(5000, 1000, 200, body, 393_216) == pytest.approx(expected)
    assert flops.prefix_reuse_pflops(read=1000, decode=200, body_params=body) == pytest.approx(0.058447680)


def test_qwen36_27b_paper_constants_as_printed():
    # docs/eval.md §2.6.2 / docs/model.md §4: GFLOPs per token to two decimals, N_body = 24.3532e9.
    g = QWEN36_27B
    printed = [round(f(g) / 1e9, 2) for f in (flops.mlp_flops_per_token, flops.attention_projection_flops_per_token,
                                               flops.gdn_projection_flops_per_token, flops.body_flops_per_token)]
    assert printed == [34.23, 3.36, 11.12, 48.70]
    assert round(flops.n_body(g) / 1e9, 4) == 24.3532 and round(2 * flops.n_body(g) / 1e9, 3) == 48.706
    # docs/eval.md §5.7: the components are 70.3 %, 6.9 % and 22.8 % of the linear term.
    body = flops.body_flops_per_token(g)
    shares = [round(100 * f(g) / body, 1) for f in (flops.mlp_flops_per_token,
                                                     flops.attention_projection_flops_per_token,
                                                     flops.gdn_projection_flops_per_token)]
    assert shares == [70.3, 6.9, 22.8]
    # The paper's 10.98 PFLOPs per question is ~225k read + decode tokens (docs/eval.md §2.6.4).
    assert round(10.98e15 / (2 * flops.n_body(g)) / 1e3) == 225
