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


class RotaryMismatch(RuntimeError):
    """The model has no usable text rotary for re-rotation: SCR must not start (exit 2)."""


def expected_text_rotary(text_config) -> tuple[int, float]:
    """``(rotary_dim, base)`` the language model's attention must use, read from its config:
    ``head_dim * partial_rotary_factor`` and ``rope_theta`` (``rope_parameters`` first, as
    transformers 5 writes it)."""
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    params = getattr(text_config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(text_config, "partial_rotary_factor", 1.0)) or 1.0
    base = params.get("rope_theta", getattr(text_config, "rope_theta", None))
    if base is None:
        raise RotaryMismatch("the text config names no rope_theta")
    return int(head_dim * factor), float(base)


def text_rotary(model, layer_ids, text_config, context_len: int | None = None):
    """The rotary embedding of the language model's full-attention layers ``layer_ids``.

    A multimodal checkpoint (Qwen3.5/3.6 as ``*ForConditionalGeneration``) registers its vision
    tower's rotary before the language model, so "the first module with a cos/sin table" is the
    wrong table (base 1e4, another width, 8,192 rows). Here each attention layer's own rotary is
    taken (modules named ``…layers.<id>.…``, outside the vision tower), all of them must share
    one table, and its ``rotary_dim``/base must be the text config's; the table must cover the
    context length. Raises ``RotaryMismatch`` naming what is wrong.
    """
    found = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if not (hasattr(module, "cos_sin_cache") and hasattr(module, "rotary_dim")):
            continue
        if name.startswith(("visual", "vision")) or ".visual." in name or ".vision" in name:
            continue
        parts = name.split(".")
        for index, part in enumerate(parts[:-1]):
            if part == "layers" and parts[index + 1].isdigit() and int(parts[index + 1]) in layer_ids:
                found.setdefault(int(parts[index + 1]), module)
    missing = sorted(set(layer_ids) - set(found))
    if missing:
        raise RotaryMismatch(f"no rotary embedding found on full-attention layer(s) {missing}")
    modules = [found[layer] for layer in sorted(found)]
    first = modules[0]
    for layer, module in zip(sorted(found), modules):
        if module is not first and not torch.equal(module.cos_sin_cache, first.cos_sin_cache):
            raise RotaryMismatch(f"layer {layer}'s rotary table differs from layer {sorted(found)[0]}'s")
    rotary_dim, base = expected_text_rotary(text_config)
    actual_base = float(getattr(first, "base", float("nan")))
    if first.rotary_dim != rotary_dim or abs(actual_base - base) > 1e-6 * base:
        raise RotaryMismatch(
            f"the attention rotary has rotary_dim={first.rotary_dim} base={actual_base:g}; the text config "
            f"says rotary_dim={rotary_dim} base={base:g}")
    if first.cos_sin_cache.shape[-1] != rotary_dim:
        raise RotaryMismatch(f"cos/sin table width {first.cos_sin_cache.shape[-1]} != rotary_dim {rotary_dim}")
    if not getattr(first, "is_neox_style", True):
        raise RotaryMismatch("the attention rotary is not NeoX (half-split) style; re-rotation assumes it")
    if context_len is not None and first.cos_sin_cache.shape[0] < context_len:
        raise RotaryMismatch(f"the cos/sin table has {first.cos_sin_cache.shape[0]} rows, fewer than the "
                             f"context length {context_len}")
    return first
