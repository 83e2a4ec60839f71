"""Moving cached attention keys to new positions: RoPE re-rotation (SCR relocation, ``docs/scr.md`` §8).

The KV pool holds post-RoPE keys. Rotations compose, R(p + Δ) = R(Δ)·R(p), so a key cached at
position o is moved to p by rotating it once by Δ = p − o (``docs/model.md`` §5): NeoX
(half-split) pairs, only the first ``rotary_dim`` channels of each head (Qwen3.5/3.6 rotate 64
of 256), always from the key as stored (chained shifts accumulate rounding error). Plain torch:
``tests/reference/test_rope.py`` checks it against keys computed fresh at the new position.
"""

from __future__ import annotations

import torch

from scr.rotary import RotaryMismatch, expected_text_rotary, rotary_layer, rotary_problem


def rerotate_keys_from_cache(keys: torch.Tensor, old_pos: torch.Tensor, new_pos: torch.Tensor,
                             cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Keys ``[n, heads, head_dim]`` moved from ``old_pos[n]`` to ``new_pos[n]`` with the model's own
    rotary table (``docs/scr.md`` §8.2: ``cos_sin_cache[pos] = cos(pos·θ) ‖ sin(pos·θ)``).

    The angle difference comes from the sum identities in float32, so the rotation uses exactly
    the cos/sin values the model rotated with: cosΔ = cos_p·cos_o + sin_p·sin_o,
    sinΔ = sin_p·cos_o − cos_p·sin_o. NeoX halves, first ``rotary_dim`` channels only.
    """
    rotary_dim = cos_sin_cache.shape[-1]
    half = rotary_dim // 2
    if rotary_dim > keys.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {keys.shape[-1]}")
    rows = keys.shape[0]
    for name, pos in (("old_pos", old_pos), ("new_pos", new_pos)):
        # A length-1 or float position would broadcast or truncate silently, and a negative one
        # would read the table from its end: each is a wrong rotation, never an error, otherwise.
        if pos.dtype.is_floating_point or pos.dtype == torch.bool or tuple(pos.shape) != (rows,):
            raise ValueError(f"{name}: {rows} integer positions expected, got {tuple(pos.shape)} {pos.dtype}")
        if rows and int(pos.min()) < 0:
            raise ValueError(f"{name}: negative position {int(pos.min())}")
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


def text_rotary(model, layer_ids, text_config, context_len: int | None = None):
    """The rotary embedding of the language model's full-attention layers ``layer_ids``.

    A multimodal checkpoint (Qwen3.5/3.6 as ``*ForConditionalGeneration``) registers its vision
    tower's rotary before the language model, so "the first module with a cos/sin table" is the
    wrong table (base 1e4, another width, 8,192 rows). Here each attention layer's own rotary is
    taken (modules named ``…layers.<id>.…``, outside the vision tower), all of them must share
    one table, and its ``rotary_dim``/base must be the text config's; the table must cover the
    context length. Raises ``RotaryMismatch`` naming what is wrong.
    """
    found = _layer_rotaries(model, layer_ids)
    missing = sorted(set(layer_ids) - set(found))
    if missing:
        raise RotaryMismatch(f"no rotary embedding found on full-attention layer(s) {missing}")
    layers = sorted(found)
    first = found[layers[0]]
    for layer in layers:
        if found[layer] is not first and not torch.equal(found[layer].cos_sin_cache, first.cos_sin_cache):
            raise RotaryMismatch(f"layer {layer}'s rotary table differs from layer {layers[0]}'s")
    expected_dim, expected_base = expected_text_rotary(text_config)
    problem = rotary_problem(
        rotary_dim=first.rotary_dim, base=float(getattr(first, "base", float("nan"))),
        table_width=first.cos_sin_cache.shape[-1], table_rows=first.cos_sin_cache.shape[0],
        neox=getattr(first, "is_neox_style", True), expected_dim=expected_dim, expected_base=expected_base,
        context_len=context_len)
    if problem is not None:
        raise RotaryMismatch(problem)
    return first


def _layer_rotaries(model, layer_ids) -> dict:
    """``{layer id: module}`` for modules with a cos/sin table on layers ``layer_ids`` (``rotary_layer``)."""
    found = {}
    for name, module in model.named_modules(remove_duplicate=False):
        has_table = hasattr(module, "cos_sin_cache") and hasattr(module, "rotary_dim")
        layer = rotary_layer(name, layer_ids) if has_table else None
        if layer is not None:
            found.setdefault(layer, module)
    return found
