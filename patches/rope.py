"""Moving cached attention keys to new positions: RoPE re-rotation (SCR relocation, ``docs/scr.md`` §8).

The KV pool holds post-RoPE keys. Rotations compose, R(p + Δ) = R(Δ)·R(p), so a key cached at
position o is moved to p by rotating it once by Δ = p − o (``docs/model.md`` §5): NeoX
(half-split) pairs, only the first ``rotary_dim`` channels of each head (Qwen3.5/3.6 rotate 64
of 256), always from the key as stored (chained shifts accumulate rounding error). Plain torch:
``tests/reference/test_rope.py`` checks it against keys computed fresh at the new position; the
rules for which table may be used are table-tested in ``tests/unit/test_scr_rotary.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch



class KeyRotation(NamedTuple):
    """The rotation of each key row by Δ = new − old (``docs/scr.md`` §8.2), shared by every layer:
    ``cos``/``sin`` ``[n, 1, rotary_dim / 2]`` in float32, and ``unchanged`` (rows whose position does
    not move keep their key bit for bit; None when every row moves)."""

    cos: torch.Tensor
    sin: torch.Tensor
    unchanged: torch.Tensor | None
    rotary_dim: int


def _rotation(old_pos: torch.Tensor, new_pos: torch.Tensor, cos_sin_cache: torch.Tensor,
              unchanged: torch.Tensor | None) -> KeyRotation:
    """cosΔ = cos_p·cos_o + sin_p·sin_o, sinΔ = sin_p·cos_o − cos_p·sin_o, in float32, from the
    model's own table (``cos_sin_cache[pos] = cos(pos·θ) ‖ sin(pos·θ)``), so the rotation uses exactly
    the cos/sin values the model rotated with."""
    rotary_dim = cos_sin_cache.shape[-1]
    half = rotary_dim // 2
    table = cos_sin_cache.to(torch.float32)
    old, new = table[old_pos.long()], table[new_pos.long()]
    cos_o, sin_o, cos_p, sin_p = old[:, :half], old[:, half:], new[:, :half], new[:, half:]
    cos = (cos_p * cos_o + sin_p * sin_o)[:, None, :]
    sin = (sin_p * cos_o - cos_p * sin_o)[:, None, :]
    return KeyRotation(cos, sin, unchanged, rotary_dim)


def shifted_rotation(old_start: int, new_start: int, rows: int, cos_sin_cache: torch.Tensor,
                     device: torch.device) -> KeyRotation:
    """The rotation of a block of ``rows`` consecutive keys from ``[old_start, …)`` to
    ``[new_start, …)`` (a relocation, ``docs/scr.md`` §8.3). The positions are checked here, on the
    host, so computing and applying it reads nothing back from the device (no sync per layer)."""
    for name, start in (("old_start", old_start), ("new_start", new_start)):
        if start < 0 or start + rows > cos_sin_cache.shape[0]:
            raise ValueError(f"{name}: positions [{start}, {start + rows}) outside the rotary table's "
                             f"{cos_sin_cache.shape[0]} rows")
    old = torch.arange(old_start, old_start + rows, device=device)
    unchanged = None if old_start != new_start else torch.ones(rows, dtype=torch.bool, device=device)
    return _rotation(old, old + (new_start - old_start), cos_sin_cache, unchanged)


def rotate_keys(keys: torch.Tensor, rotation: KeyRotation) -> torch.Tensor:
    """Keys ``[n, heads, head_dim]`` rotated by ``rotation``: NeoX halves of the first
    ``rotary_dim`` channels, ``k·cosΔ + rotate_half(k)·sinΔ``, written back in the keys' dtype;
    the other channels, and the ``unchanged`` rows, are the input's bit for bit."""
    rotary_dim, half = rotation.rotary_dim, rotation.rotary_dim // 2
    if rotary_dim > keys.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {keys.shape[-1]}")
    rot = keys[..., :rotary_dim].to(torch.float32)
    first, second = rot[..., :half], rot[..., half:]
    cos, sin = rotation.cos, rotation.sin
    moved = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    out = keys.clone()
    out[..., :rotary_dim] = moved.to(keys.dtype)
    if rotation.unchanged is None:
        return out
    # A select, not a masked copy: a boolean index would read the mask back (a device sync).
    return torch.where(rotation.unchanged.view(-1, *[1] * (keys.dim() - 1)), keys, out)


def rerotate_keys_from_cache(keys: torch.Tensor, old_pos: torch.Tensor, new_pos: torch.Tensor,
                             cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Keys ``[n, heads, head_dim]`` moved from ``old_pos[n]`` to ``new_pos[n]`` with the model's own
    rotary table (``docs/scr.md`` §8.2): ``rotate_keys`` by ``_rotation``, for any positions.

    The positions are checked against the keys first; that reads their minimum back from the
    device, so a caller that moves a block for many layers uses ``shifted_rotation`` once instead.
    """
    if cos_sin_cache.shape[-1] > keys.shape[-1]:
        raise ValueError(f"rotary_dim {cos_sin_cache.shape[-1]} exceeds head_dim {keys.shape[-1]}")
    rows = keys.shape[0]
    for name, pos in (("old_pos", old_pos), ("new_pos", new_pos)):
        # A length-1 or float position would broadcast or truncate silently, and a negative one
        # would read the table from its end: each is a wrong rotation, never an error, otherwise.
        if pos.dtype.is_floating_point or pos.dtype == torch.bool or tuple(pos.shape) != (rows,):
            raise ValueError(f"{name}: {rows} integer positions expected, got {tuple(pos.shape)} {pos.dtype}")
        if rows and int(pos.min()) < 0:
            raise ValueError(f"{name}: negative position {int(pos.min())}")
    return rotate_keys(keys, _rotation(old_pos, new_pos, cos_sin_cache, old_pos == new_pos))


# Which rotary table keys may be re-rotated with (``docs/scr.md`` §8.2): the rules, over plain facts.
# ``text_rotary`` finds the language model's attention rotary and reads its facts (width, base,
# style, rows); the rules say whether re-rotating with it gives the keys the model would compute at
# the new position. A mismatch refuses to start (exit 2) rather than serve wrong keys.

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


def rotary_problem(*, rotary_dim: int, base: float, table_width: int, table_rows: int, neox: bool,
                   expected_dim: int, expected_base: float, context_len: int | None) -> str | None:
    """Why the attention rotary cannot be used for re-rotation, or None when it can.

    The rotation is done in NeoX halves over the table's ``rotary_dim`` channels, and it looks up
    the table at every new position, so the table must match the config and cover the context."""
    if rotary_dim != expected_dim or abs(base - expected_base) > 1e-6 * expected_base:
        return (f"the attention rotary has rotary_dim={rotary_dim} base={base:g}; the text config "
                f"says rotary_dim={expected_dim} base={expected_base:g}")
    if table_width != expected_dim:
        return f"cos/sin table width {table_width} != rotary_dim {expected_dim}"
    if not neox:
        return "the attention rotary is not NeoX (half-split) style; re-rotation assumes it"
    if context_len is not None and table_rows < context_len:
        return f"the cos/sin table has {table_rows} rows, fewer than the context length {context_len}"
    return None


def rotary_layer(name: str, layer_ids) -> int | None:
    """The full-attention layer (one of ``layer_ids``) a rotary module belongs to, read from its
    name (``…layers.<id>.…``), or None: another layer, no layer, or the vision tower's own rotary."""
    if name.startswith(("visual", "vision")) or ".visual." in name or ".vision" in name:
        return None
    parts = name.split(".")
    for index, part in enumerate(parts[:-1]):
        if part == "layers" and parts[index + 1].isdigit() and int(parts[index + 1]) in layer_ids:
            return int(parts[index + 1])
    return None


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
