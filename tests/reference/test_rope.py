"""RoPE re-rotation (patches/rope.py) against keys computed fresh at the new position.

Keys are the tiny model's first full-attention layer's (k_proj, then k_norm, then RoPE as
transformers applies it: NeoX halves on the first rotary_dim = 8 of 32 channels), in fp32.
A key computed at p and re-rotated by Δ must equal the key computed at p + Δ within 1e-4
absolute. The bound is the reference's own error, not the re-rotation's: transformers forms the
angle p·θ in fp32 (absolute error up to about p·2^-24 rad, 4e-4 rad at p = 7,000), while the
re-rotation forms Δ·θ in fp64. Observed: at most 1.3e-5 on keys of magnitude up to ~4.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5ForConditionalGeneration
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

from patches.rope import rerotate_keys_from_cache

TOLERANCE = 1e-4


def rerotate_keys(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """The fp64-angle reference: keys ``[n, heads, head_dim]`` rotated by ``delta[n]`` positions.

    The server rotates with the model's own cos/sin table (``rerotate_keys_from_cache``); this one
    forms the angles Δ·θ in float64, so it shows what the rotation itself costs in accuracy.

    ``inv_freq`` has ``rotary_dim / 2`` entries (the rotary embedding's inverse frequencies).
    Returns a new tensor in ``keys.dtype``; rows with ``delta == 0`` come back unchanged.
    """
    half = inv_freq.shape[0]
    rotary_dim = 2 * half
    if rotary_dim > keys.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {keys.shape[-1]}")
    angles = delta.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]  # [n, half]
    cos = torch.cos(angles).to(torch.float32)[:, None, :]  # [n, 1, half]
    sin = torch.sin(angles).to(torch.float32)[:, None, :]
    rot = keys[..., :rotary_dim].to(torch.float32)
    first, second = rot[..., :half], rot[..., half:]
    moved = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    out = keys.clone()
    out[..., :rotary_dim] = moved.to(keys.dtype)
    unchanged = delta == 0
    if unchanged.any():
        out[unchanged] = keys[unchanged]
    return out


@pytest.fixture(scope="module")
def layer(tiny_model_dir):
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    text = model.model.language_model
    full = next(i for i, t in enumerate(text.config.layer_types) if t == "full_attention")
    return text, text.layers[full].self_attn


def keys_at(text, attn, hidden, positions):
    """Post-RoPE keys ``[n, kv_heads, head_dim]`` of ``hidden [n, hidden]`` at ``positions``."""
    with torch.no_grad():
        k = attn.k_norm(attn.k_proj(hidden).view(hidden.shape[0], -1, attn.head_dim))
        cos, sin = text.rotary_emb(hidden[None], positions[None])
        _, k = apply_rotary_pos_emb(k[None], k[None], cos[0][None], sin[0][None], unsqueeze_dim=2)
    return k[0]


@pytest.mark.parametrize("delta", [1, 17, 500, 4000, -1, -63, -3000], ids=lambda d: f"delta{d:+d}")
def test_rerotated_key_equals_key_computed_at_the_new_position(layer, delta):
    text, attn = layer
    gen = torch.Generator().manual_seed(7)
    hidden = torch.randn(12, text.config.hidden_size, generator=gen)
    old = torch.arange(3000, 3012)
    moved = rerotate_keys(keys_at(text, attn, hidden, old), torch.full((12,), delta), text.rotary_emb.inv_freq)
    fresh = keys_at(text, attn, hidden, old + delta)
    rotary_dim = 2 * text.rotary_emb.inv_freq.shape[0]
    assert rotary_dim == 8 and attn.head_dim == 32  # partial rotary: a quarter of the channels
    assert (moved - fresh).abs().max().item() < TOLERANCE
    # The pass-through channels are bit-identical (never touched).
    assert torch.equal(moved[..., rotary_dim:], fresh[..., rotary_dim:])


def test_per_row_deltas_and_zero_delta_rows(layer):
    text, attn = layer
    hidden = torch.randn(4, text.config.hidden_size, generator=torch.Generator().manual_seed(8))
    old = torch.tensor([10, 20, 30, 40])
    new = torch.tensor([110, 20, 5, 4040])
    cached = keys_at(text, attn, hidden, old)
    moved = rerotate_keys(cached, new - old, text.rotary_emb.inv_freq)
    assert (moved - keys_at(text, attn, hidden, new)).abs().max().item() < TOLERANCE
    assert torch.equal(moved[1], cached[1])  # delta 0: returned as stored


def test_one_rotation_beats_chained_rotations(layer):
    """Why the relocation always rotates once from the stored key."""
    text, attn = layer
    hidden = torch.randn(8, text.config.hidden_size, generator=torch.Generator().manual_seed(9))
    old = torch.arange(6000, 6008)
    cached = keys_at(text, attn, hidden, old).to(torch.bfloat16)
    fresh = keys_at(text, attn, hidden, old - 1000).to(torch.bfloat16).float()
    once = rerotate_keys(cached, torch.full((8,), -1000), text.rotary_emb.inv_freq).float()
    chained = cached
    for _ in range(10):
        chained = rerotate_keys(chained, torch.full((8,), -100), text.rotary_emb.inv_freq)
    once_error = (once - fresh).abs().max().item()
    chained_error = (chained.float() - fresh).abs().max().item()
    assert once_error < chained_error


def test_rotary_wider_than_head_is_rejected():
    with pytest.raises(ValueError, match="rotary_dim 8 exceeds head_dim 4"):
        rerotate_keys(torch.zeros(1, 1, 4), torch.tensor([1]), torch.ones(4))


def _cos_sin_cache(inv_freq: torch.Tensor, max_pos: int) -> torch.Tensor:
    """SGLang's layout (``RotaryEmbedding._compute_cos_sin_cache``): cos ‖ sin of pos·θ, fp32."""
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@pytest.mark.parametrize("delta", [1, 500, -63, -3000], ids=lambda d: f"delta{d:+d}")
def test_rerotation_from_the_cos_sin_table_equals_the_fresh_key(layer, delta):
    """The server's variant (the model's own cos/sin table, sum identities in fp32) meets the same
    1e-4 bound as the fp64-angle variant."""
    text, attn = layer
    hidden = torch.randn(12, text.config.hidden_size, generator=torch.Generator().manual_seed(9))
    old = torch.arange(3000, 3012)
    table = _cos_sin_cache(text.rotary_emb.inv_freq, 8192)
    moved = rerotate_keys_from_cache(keys_at(text, attn, hidden, old), old, old + delta, table)
    fresh = keys_at(text, attn, hidden, old + delta)
    assert (moved - fresh).abs().max().item() < TOLERANCE
    assert torch.equal(moved[..., 8:], fresh[..., 8:])


def test_rerotation_from_the_table_leaves_unmoved_rows_bit_identical(layer):
    text, attn = layer
    keys = keys_at(text, attn, torch.randn(3, text.config.hidden_size), torch.tensor([5, 6, 7]))
    table = _cos_sin_cache(text.rotary_emb.inv_freq, 64)
    moved = rerotate_keys_from_cache(keys, torch.tensor([5, 6, 7]), torch.tensor([5, 9, 7]), table)
    assert torch.equal(moved[0], keys[0]) and torch.equal(moved[2], keys[2])
    assert not torch.equal(moved[1], keys[1])
