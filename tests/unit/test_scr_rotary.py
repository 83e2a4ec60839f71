"""patches/rope.py (the rotary rules): which attention rotary SCR may re-rotate keys with."""

from __future__ import annotations

import pytest

from patches.rope import rotary_layer, rotary_problem

GOOD = dict(rotary_dim=8, base=1e7, table_width=8, table_rows=8192, neox=True, expected_dim=8, expected_base=1e7,
            context_len=8192)


@pytest.mark.parametrize(
    "changes, problem",
    [
        pytest.param({}, None, id="matches"),
        pytest.param({"context_len": None, "table_rows": 16}, None, id="no-context-length"),
        pytest.param({"base": 1e4}, "the attention rotary has rotary_dim=8 base=10000; the text config says "
                     "rotary_dim=8 base=1e+07", id="vision-base"),
        pytest.param({"rotary_dim": 16}, "rotary_dim=16", id="wider"),
        pytest.param({"base": 1e7 * (1 + 1e-7)}, None, id="base-within-rounding"),
        pytest.param({"table_width": 16}, "cos/sin table width 16 != rotary_dim 8", id="table-width"),
        pytest.param({"neox": False}, "the attention rotary is not NeoX (half-split) style; re-rotation assumes it",
                     id="not-neox"),
        pytest.param({"table_rows": 4096}, "the cos/sin table has 4096 rows, fewer than the context length 8192",
                     id="short-table"),
    ],
)
def test_rotary_problem(changes, problem):
    got = rotary_problem(**{**GOOD, **changes})
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


@pytest.mark.parametrize(
    "name, layer",
    [
        pytest.param("model.layers.3.self_attn.rotary_emb", 3, id="attention-layer"),
        pytest.param("language_model.model.layers.7.self_attn.rotary_emb", 7, id="multimodal-text-layer"),
        pytest.param("model.layers.4.self_attn.rotary_emb", None, id="not-a-full-attention-layer"),
        pytest.param("visual.blocks.3.attn.rotary_emb", None, id="vision-tower"),
        pytest.param("model.visual.layers.3.rotary_emb", None, id="vision-tower-inside"),
        pytest.param("model.rotary_emb", None, id="no-layer"),
        pytest.param("model.layers.x.rotary_emb", None, id="not-a-number"),
    ],
)
def test_rotary_layer(name, layer):
    assert rotary_layer(name, {3, 7}) == layer
