"""``patches.rope.text_rotary``: SCR re-rotates with the language model's rotary, never the vision
tower's (review defect 1: the first module with a cos/sin table was the vision tower's), and
refuses a model whose attention rotary disagrees with its text config. Fake module trees, torch only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from patches.rope import text_rotary
from patches.rope import RotaryMismatch, expected_text_rotary


class Rotary(nn.Module):
    def __init__(self, rotary_dim: int, base: float, rows: int = 16, neox: bool = True):
        super().__init__()
        self.rotary_dim, self.base, self.is_neox_style = rotary_dim, base, neox
        inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
        angles = torch.arange(rows, dtype=torch.float)[:, None] * inv[None, :]
        self.register_buffer("cos_sin_cache", torch.cat([angles.cos(), angles.sin()], dim=-1))


class Layer(nn.Module):
    def __init__(self, rotary):
        super().__init__()
        self.rotary_emb = rotary


def model(text_rotary_module=None, vision=True, attention=(3, 7), shared=True):
    root = nn.Module()
    if vision:  # registered first, as in Qwen3VLForConditionalGeneration.__init__
        root.visual = nn.Module()
        root.visual.rotary_pos_emb = Rotary(16, 1e4, rows=8)
    root.model = nn.Module()
    text = text_rotary_module or Rotary(8, 1e7)
    root.model.layers = nn.ModuleList(
        [Layer(text if shared else Rotary(8, 1e7)) if i in attention else nn.Linear(2, 2) for i in range(8)])
    return root, text


CONFIG = SimpleNamespace(head_dim=32, hidden_size=64, num_attention_heads=4,
                         rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25})


def test_expected_rotary_from_the_text_config():
    assert expected_text_rotary(CONFIG) == (8, 1e7)
    legacy = SimpleNamespace(head_dim=None, hidden_size=64, num_attention_heads=2, rope_theta=5e5)
    assert expected_text_rotary(legacy) == (32, 5e5)


def test_the_text_rotary_not_the_vision_towers():
    root, text = model()
    assert text_rotary(root, [3, 7], CONFIG) is text


def test_one_rotary_per_layer_with_equal_tables_is_accepted():
    root, _ = model(shared=False)
    assert text_rotary(root, [3, 7], CONFIG).base == 1e7


@pytest.mark.parametrize("rotary,match", [
    (Rotary(8, 1e4), "base=10000"),
    (Rotary(16, 1e7), "rotary_dim=16"),
    (Rotary(8, 1e7, neox=False), "NeoX"),
])
def test_a_rotary_that_disagrees_with_the_config_is_refused(rotary, match):
    root, _ = model(rotary)
    with pytest.raises(RotaryMismatch, match=match):
        text_rotary(root, [3, 7], CONFIG)


def test_a_model_without_a_text_rotary_is_refused():
    root, _ = model(attention=())
    with pytest.raises(RotaryMismatch, match=r"layer\(s\) \[3, 7\]"):
        text_rotary(root, [3, 7], CONFIG)


def test_a_table_shorter_than_the_context_is_refused():
    root, _ = model()
    with pytest.raises(RotaryMismatch, match="fewer than the context length 8192"):
        text_rotary(root, [3, 7], CONFIG, context_len=8192)
