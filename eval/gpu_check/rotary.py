"""Re-rotating cached keys at Qwen3.6's geometry, against SGLang's own rotary kernels.

SCR moves a cached key from position p to q = p + d by rotating the stored (post-RoPE) key by d
with the model's own cos/sin table (``patches/rope.py``: ``shifted_rotation`` + ``rotate_keys``
for a block, ``rerotate_keys_from_cache`` for single rows). This module checks that the moved
key is the key SGLang itself computes at q, for Qwen3.6-27B's attention (head_dim 256, partial
rotary factor 0.25 so 64 rotary channels in NeoX halves, rope_theta 1e7, interleaved MRoPE with
sections [11, 11, 10]; text positions, so the three MRoPE streams carry the same position), at
positions up to 131,072, shifts of both signs.

What rotates the keys ("rotators", SGLang's in ``rotary_kernels.py``):
* on CUDA, SGLang 0.5.16's kernels: ``fused_qk_gemma_rmsnorm_rope_gate`` (what the Qwen3.5/3.6
  attention runs on CUDA: q/k RMSNorm + RoPE in one Triton kernel, bf16 out), and
  ``MRotaryEmbedding.forward`` with [3, n] positions (the Triton MRoPE kernel) in fp32 and bf16;
* on CPU, ``MRotaryEmbedding.forward_native`` (SGLang's torch path) in fp32 and bf16;
* anywhere, ``TorchRotator``: the rotation written here from the formula (unit tests, no SGLang).
Each rotator is given random raw keys; what it returns at position 0 (cos 1, sin 0: no rounding)
is its input ``x`` as the kernel sees it (after the fused kernel's RMSNorm), and the truth is
``x`` rotated in float64 with angles q·θ_i, θ_i = 1e7^(-i/32), computed in float64.

Tolerance (per element, in units of the pair norm ‖(x_i, x_{i+32})‖, which a rotation keeps):
* ``r``: one rotation's rounding, given by the rotator: the cast of the result to the key dtype
  (u = 2^-8 for bf16, whose significand has 8 bits; 2^-24 for fp32), plus products and sums in the
  kernel's arithmetic, plus a bf16 cos/sin table where the kernel casts its table (2^-8).
* ``A(q)``: the fp32 table's angle error at q: θ_i from a pow and a division and q·θ_i rounded
  (CUDA's powf is within 4 ulp, the division and product within 1/2 ulp each: 12·2^-24 relative to
  q·θ_i with margin), plus cos/sin within 2 ulp (4·2^-24). At q = 131,072 and θ_0 = 1 that is
  ~0.09 rad of slack, so the comparisons with the float64 truth are loose for the fast pairs at
  large q; the direct comparison below has no such term.
* fresh key at q vs truth: r + A(q).
* moved key vs truth: r (the stored key at p) + u (the moved key's cast) + 16·2^-24 (the fp32
  sum identities and rotation) + A(q): the table's error at p cancels, the stored key was rotated
  by â(p) and then by â(q) − â(p) from the same table.
* moved key vs the fresh key at q (the claim SCR relies on): 2r + u + 16·2^-24, whatever q: both
  end at the table's angle â(q). For bf16 keys that is ~3 bf16 roundings: a relocated key is the
  key SGLang computes at the new position up to bf16 rounding, never bit for bit in general.
The channels past the rotary 64 must come back bit for bit, and a zero shift must leave the key as
stored.

SGLang's kernels are wrapped in ``rotary_kernels.py``; this module imports torch and the production
re-rotation (``patches/rope.py``), which is what it checks, and no SGLang. With ``rotary_kernels.py``
and ``reference.py`` these are the modules of ``eval/`` that import engine code; the layering rule
(``tests/unit/test_import_rules.py``) lists them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from patches.rope import rerotate_keys_from_cache, rotate_keys, shifted_rotation

U32 = 2.0**-24  # fp32 unit roundoff
U16 = 2.0**-8  # bf16 unit roundoff
UNIT = {torch.float32: U32, torch.bfloat16: U16}
MAX_POSITION = 131_072  # the largest position a key is stored at or moved to
TABLE_ANGLE_REL = 12 * U32  # relative error of an fp32 table angle q·θ_i (see the module docstring)
TABLE_ENTRY_ABS = 4 * U32  # cos/sin of that angle within 2 ulp
REROTATION_ARITH = 16 * U32  # the fp32 sum identities and the rotation of patches/rope.py


@dataclass(frozen=True)
class Geometry:
    """The attention geometry of Qwen3.6-27B (docs/model.md §1; ``mrope_section`` and
    ``max_position_embeddings`` as the checkpoint's ``config.json`` gives them)."""

    head_dim: int = 256
    partial_rotary_factor: float = 0.25
    rope_theta: int = 10_000_000
    mrope_section: tuple[int, int, int] = (11, 11, 10)
    mrope_interleaved: bool = True
    num_q_heads: int = 24
    num_kv_heads: int = 4
    max_position_embeddings: int = 262_144

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def rope_parameters(self) -> dict:
        """``text_config.rope_parameters`` as the checkpoint writes it (what SGLang's get_rope receives)."""
        return {"rope_type": "default", "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_interleaved": self.mrope_interleaved, "mrope_section": list(self.mrope_section)}

    def theta64(self) -> torch.Tensor:
        """θ_i = theta^(-2i / rotary_dim) in float64, one per NeoX pair."""
        half = self.rotary_dim // 2
        return float(self.rope_theta) ** (-torch.arange(half, dtype=torch.float64) * 2 / self.rotary_dim)


QWEN36 = Geometry()


@dataclass(frozen=True)
class Move:
    """A block of ``rows`` consecutive keys moved from ``[old_start, …)`` to ``[new_start, …)``."""

    old_start: int
    new_start: int
    rows: int


def moves(quick: bool = False, seed: int = 0, limit: int = MAX_POSITION) -> list[Move]:
    """Blocks to move: the extremes (from 0 to a block ending at ``limit``, back, ±1 next to it),
    a zero shift, small and mid shifts of both signs, then random ones."""
    fixed = [
        Move(limit - 255, 0, 256), Move(0, limit - 255, 256),
        Move(limit - 128, limit - 127, 128), Move(limit - 127, limit - 128, 128),
        Move(100_000, 99_000, 128), Move(65_536, 69_632, 128), Move(3, 1, 64), Move(1_000, 1_000, 16),
    ]
    rng = random.Random(seed)
    rows = 64
    extra = [Move(rng.randrange(0, limit - rows + 2), rng.randrange(0, limit - rows + 2), rows)
             for _ in range(2 if quick else 8)]
    return [m for m in fixed + extra if max(m.old_start, m.new_start) + m.rows - 1 <= limit]


def scattered(count: int, seed: int = 1, limit: int = MAX_POSITION) -> tuple[list[int], list[int]]:
    """Single rows moved between unrelated positions, with 0, ``limit - 1`` and ``limit`` among them."""
    rng = random.Random(seed)
    old = [0, limit, limit - 1, 7, limit] + [rng.randrange(0, limit + 1) for _ in range(max(0, count - 5))]
    new = [limit, 0, limit, limit - 1, 12_345] + [rng.randrange(0, limit + 1) for _ in range(max(0, count - 5))]
    return old[:count], new[:count]


# ----------------------------------------------------------------------------------------------
# Rotators


def sglang_style_table(geometry: Geometry, rows: int, device="cpu") -> torch.Tensor:
    """``[rows, rotary_dim]`` cos ‖ sin built as SGLang 0.5.16's ``RotaryEmbedding`` builds it, in fp32."""
    dim = geometry.rotary_dim
    inv_freq = 1.0 / (geometry.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    freqs = torch.outer(torch.arange(rows, dtype=torch.float32, device=device), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


class TorchRotator:
    """RoPE written here from the formula: fp32 table and arithmetic, one cast to the key dtype.
    The reference rotator of the unit tests (no SGLang), and the CPU fallback."""

    def __init__(self, geometry: Geometry, dtype: torch.dtype, device="cpu", rows: int = MAX_POSITION + 1):
        self.name = f"torch-reference {dtype_name(dtype)}"
        self.geometry, self.dtype, self.device = geometry, dtype, torch.device(device)
        self.unit = UNIT[dtype]
        self.rounding = self.unit + 4 * U32  # fp32 products and sum, then the cast
        self.table = sglang_style_table(geometry, rows, self.device)

    def rotate(self, raw: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        dim, half = self.geometry.rotary_dim, self.geometry.rotary_dim // 2
        entry = self.table[positions]
        cos, sin = entry[:, None, :half], entry[:, None, half:]
        x = raw[..., :dim].to(torch.float32)
        first, second = x[..., :half], x[..., half:]
        out = raw.clone()
        out[..., :dim] = torch.cat([first * cos - second * sin, second * cos + first * sin], -1).to(raw.dtype)
        return out


# ----------------------------------------------------------------------------------------------
# The comparison


def rope64(x: torch.Tensor, positions: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """float64 keys ``[n, heads, head_dim]`` rotated to ``positions`` (NeoX halves, first rotary_dim channels)."""
    dim, half = geometry.rotary_dim, geometry.rotary_dim // 2
    angle = positions.to(torch.float64)[:, None, None] * geometry.theta64()
    cos, sin = angle.cos(), angle.sin()
    out = x.clone()
    first, second = x[..., :half], x[..., half:dim]
    out[..., :half] = first * cos - second * sin
    out[..., half:dim] = second * cos + first * sin
    return out


def table_angle_bound(positions: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """``[n, 1, rotary_dim]``: A(q) of the module docstring, per row and channel (both halves of a pair)."""
    theta = torch.cat([geometry.theta64(), geometry.theta64()])
    return TABLE_ANGLE_REL * positions.to(torch.float64)[:, None, None] * theta + TABLE_ENTRY_ABS


def pair_norm(x: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    dim, half = geometry.rotary_dim, geometry.rotary_dim // 2
    norm = torch.sqrt(x[..., :half] ** 2 + x[..., half:dim] ** 2)
    return torch.cat([norm, norm], dim=-1)


def production_moves(stored: torch.Tensor, blocks: list[Move], table: torch.Tensor) -> torch.Tensor:
    """Each block moved as SCR moves a relocated run (``shifted_rotation`` + ``rotate_keys``)."""
    out, start = [stored[:0]], 0
    for move in blocks:
        rotation = shifted_rotation(move.old_start, move.new_start, move.rows, table, stored.device)
        out.append(rotate_keys(stored[start:start + move.rows], rotation))
        start += move.rows
    return torch.cat(out)


@dataclass
class Comparison:
    """The worst error/bound ratios of one rotator (≤ 1 passes) and what they were measured on."""

    name: str
    rows: int
    fresh_vs_truth: float
    moved_vs_truth: float
    moved_vs_fresh: float
    moved_vs_fresh_units: float  # max |moved − fresh| in units of u·‖pair‖ (u: the key dtype's roundoff)
    bit_identical: float  # share of rotary elements where moved == fresh exactly
    passthrough_equal: bool
    zero_shift_equal: bool

    @property
    def ok(self) -> bool:
        return (max(self.fresh_vs_truth, self.moved_vs_truth, self.moved_vs_fresh) <= 1.0
                and self.passthrough_equal and self.zero_shift_equal)

    def summary(self) -> str:
        return (f"{self.name}: worst error/bound fresh {self.fresh_vs_truth:.2f}, moved {self.moved_vs_truth:.2f}, "
                f"moved-vs-fresh {self.moved_vs_fresh:.2f} ({self.moved_vs_fresh_units:.2f} u), "
                f"{100 * self.bit_identical:.0f}% bit-identical, {self.rows} rows")


def compare(rotator, blocks: list[Move], single: tuple[list[int], list[int]], seed: int = 0,
            rerotate=rerotate_keys_from_cache) -> Comparison:
    """Move keys with the production re-rotation and compare with ``rotator`` at the new positions
    and with the float64 truth (bounds in the module docstring). ``rerotate`` is replaceable so a
    test can show that a wrong re-rotation fails."""
    g, device = rotator.geometry, rotator.device
    old = [m.old_start + i for m in blocks for i in range(m.rows)] + list(single[0])
    new = [m.new_start + i for m in blocks for i in range(m.rows)] + list(single[1])
    old_pos = torch.tensor(old, dtype=torch.long, device=device)
    new_pos = torch.tensor(new, dtype=torch.long, device=device)
    n, in_blocks = len(old), sum(m.rows for m in blocks)
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randn(n, g.num_kv_heads, g.head_dim, generator=generator, dtype=torch.float64)
    raw = raw.to(device=device, dtype=rotator.dtype)

    base = rotator.rotate(raw, torch.zeros_like(old_pos))  # the kernel's input: cos 1, sin 0 round nothing
    stored = rotator.rotate(raw, old_pos)
    fresh = rotator.rotate(raw, new_pos)
    moved = torch.cat([production_moves(stored[:in_blocks], blocks, rotator.table),
                       rerotate(stored[in_blocks:], old_pos[in_blocks:], new_pos[in_blocks:], rotator.table)])

    dim = g.rotary_dim
    x = base.double().cpu()
    truth = rope64(x, new_pos.cpu(), g)[..., :dim]
    norm = pair_norm(x, g)
    angle = table_angle_bound(new_pos.cpu(), g)
    r, u = rotator.rounding, rotator.unit
    moved64, fresh64 = moved.double().cpu()[..., :dim], fresh.double().cpu()[..., :dim]
    tiny = torch.finfo(torch.float64).tiny  # a zero pair has a zero bound and must have a zero error

    def worst(error: torch.Tensor, bound: torch.Tensor) -> float:
        return float((error / (bound * norm).clamp_min(tiny)).max())

    direct = (moved64 - fresh64).abs()
    zero = (old_pos == new_pos).cpu()
    return Comparison(
        name=rotator.name, rows=n,
        fresh_vs_truth=worst((fresh64 - truth).abs(), r + angle),
        moved_vs_truth=worst((moved64 - truth).abs(), r + u + REROTATION_ARITH + angle),
        moved_vs_fresh=worst(direct, torch.full_like(angle, 2 * r + u + REROTATION_ARITH)),
        moved_vs_fresh_units=float((direct / (u * norm).clamp_min(tiny)).max()),
        bit_identical=float((direct == 0).double().mean()),
        passthrough_equal=bool(torch.equal(moved[..., dim:], stored[..., dim:])
                               and torch.equal(fresh[..., dim:], base[..., dim:])),
        zero_shift_equal=bool(torch.equal(moved[zero.to(moved.device)], stored[zero.to(stored.device)])),
    )
