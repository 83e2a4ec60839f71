"""Moving cached attention keys to new positions: RoPE re-rotation (SCR relocation, ``scr_spec.md`` §8).

The KV pool holds post-RoPE keys. Rotations compose, R(p + Δ) = R(Δ)·R(p), so a key cached at
position o is moved to p by rotating it once by Δ = p − o (``model_spec.md`` §5):

* NeoX (half-split) pairs ``(i, i + rotary_dim/2)``, only the first ``rotary_dim`` channels of
  each head (Qwen3.5/3.6 rotate 64 of 256); the other channels and all values are untouched;
* angles Δ·inv_freq in float64 and the rotation in float32, one cast back to the pool dtype;
* always from the key as stored (the caller keeps the cumulative Δ): chained shifts accumulate
  rounding error.

Plain torch, no SGLang: ``tests/reference/test_rope.py`` checks it against keys computed fresh at
the new position.
"""

from __future__ import annotations

import torch


def rerotate_keys(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[n, heads, head_dim]`` rotated by ``delta[n]`` positions (may be negative).

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


def rerotate_keys_from_cache(keys: torch.Tensor, old_pos: torch.Tensor, new_pos: torch.Tensor,
                             cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Keys ``[n, heads, head_dim]`` moved from ``old_pos[n]`` to ``new_pos[n]`` with the model's own
    rotary table (``scr_spec.md`` §8.2: ``cos_sin_cache[pos] = cos(pos·θ) ‖ sin(pos·θ)``).

    The angle difference comes from the sum identities in float32, so the rotation uses exactly
    the cos/sin values the model rotated with: cosΔ = cos_p·cos_o + sin_p·sin_o,
    sinΔ = sin_p·cos_o − cos_p·sin_o. NeoX halves, first ``rotary_dim`` channels only.
    """
    rotary_dim = cos_sin_cache.shape[-1]
    half = rotary_dim // 2
    if rotary_dim > keys.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {keys.shape[-1]}")
    table = cos_sin_cache.to(torch.float32)
    old, new = table[old_pos.long()], table[new_pos.long()]
    cos_o, sin_o, cos_p, sin_p = old[:, :half], old[:, half:], new[:, :half], new[:, half:]
    cos = (cos_p * cos_o + sin_p * sin_o)[:, None, :]
    sin = (sin_p * cos_o - cos_p * sin_o)[:, None, :]
    rot = keys[..., :rotary_dim].to(torch.float32)
    first, second = rot[..., :half], rot[..., half:]
    moved = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    out = keys.clone()
    out[..., :rotary_dim] = moved.to(keys.dtype)
    unchanged = old_pos == new_pos
    if unchanged.any():
        out[unchanged] = keys[unchanged]
    return out
