"""Which rotary table SCR may re-rotate keys with (``docs/scr.md`` §8.2): the rules, over plain facts.

``patches/rope.py`` finds the language model's attention rotary and reads its facts (width,
base, style, rows); the rules here say whether re-rotating with it gives the keys the model would
compute at the new position. A mismatch refuses to start (exit 2) rather than serve wrong keys.
"""

from __future__ import annotations


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
