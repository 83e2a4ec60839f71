"""RoPE re-rotation of cached keys (``patches/rope.py``, used by ``ScrTensors.place`` when SCR
relocates K rows) against keys computed fresh at the new position.

Every test calls the production code: ``rerotate_keys_from_cache`` directly, or ``ScrTensors.place``
(side buffer -> pool slots, then the re-rotation), never a copy of it.

The reference is written here from the formula (``docs/scr.md`` §8, docs/model.md §2.1 and docs/model.md §5),
not from the code under test: an un-rotated key ``k`` (random, unit-variance channels, like a key
after k_norm) is rotated from scratch in float64 at an absolute position ``p`` with NeoX halves,
``k'[i] = k[i]·cos(pθ_i) − k[i+4]·sin(pθ_i)``, ``k'[i+4] = k[i+4]·cos(pθ_i) + k[i]·sin(pθ_i)``,
``θ_i = 1e7^(−2i/8)``, on the first ``rotary_dim = head_dim · partial_rotary_factor = 32 · 0.25 = 8``
channels of each head; channels 8..31 pass through. (The tiny model's geometry; the fixture checks
it against the built model's config.) SGLang builds Qwen3.5's rotary with ``is_neox_style=True`` and
``patches.rope.text_rotary`` refuses any other, so the half-split layout is the one to check.

A key stored at ``o`` (the fp64 key at ``o`` cast to fp32 or bf16, the GPU pool dtype) and
re-rotated to ``p`` must match the fp64 key computed fresh at ``p`` within bounds derived from the
precision of each step (see ``fp32_bound`` and ``bf16_bound``), so a wrong sign, wrong halves,
wrong delta or a bf16 cos/sin table fails. The tables handed to the production code are
``exact_table`` (cos‖sin of pos·θ in fp64, rounded once to fp32: only the re-rotation's own
rounding is measured) and ``sglang_table`` (SGLang 0.5.16 ``RotaryEmbedding._compute_cos_sin_cache``'s
construction in fp32, what the server passes; its fp32 angle error grows with the position).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from eval.tiny_model import LONG_CONTEXT_POSITIONS, MAX_POSITIONS
from patches.rope import rerotate_keys_from_cache
from patches.scr_tensors import ScrTensors, SideBuffer

HEAD_DIM = 32
PARTIAL_ROTARY_FACTOR = 0.25
ROPE_THETA = 1e7
KV_HEADS = 2
ROTARY_DIM = int(HEAD_DIM * PARTIAL_ROTARY_FACTOR)  # 8
HALF = ROTARY_DIM // 2  # NeoX pairs (i, i + 4)
THETA = ROPE_THETA ** (-torch.arange(HALF, dtype=torch.float64) * 2 / ROTARY_DIM)  # fp64 θ_i

U32 = 2.0**-24  # fp32 unit roundoff (24-bit significand, round to nearest)
U16 = 2.0**-8  # bf16 unit roundoff (8-bit significand): one rounding moves x by at most |x|·2^-8

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.fixture(scope="module", autouse=True)
def tiny_geometry(tiny_model_dir):
    """The constants above are the tiny model's (its built ``config.json``)."""
    text = json.loads((tiny_model_dir / "config.json").read_text())["text_config"]
    assert text["head_dim"] == HEAD_DIM and text["num_key_value_heads"] == KV_HEADS
    assert text["rope_parameters"]["partial_rotary_factor"] == PARTIAL_ROTARY_FACTOR
    assert text["rope_parameters"]["rope_theta"] == ROPE_THETA
    assert text["max_position_embeddings"] == MAX_POSITIONS


# ----------------------------------------------------------------------------------------------
# The reference: RoPE from scratch in fp64, and the tables handed to the production code.


def rope64(keys: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """fp64 keys ``[n, heads, head_dim]`` rotated to absolute positions ``pos[n]`` (NeoX halves)."""
    angle = pos.to(torch.float64)[:, None, None] * THETA  # [n, 1, HALF]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = keys[..., :HALF], keys[..., HALF:ROTARY_DIM]
    out = keys.clone()
    out[..., :HALF] = x1 * cos - x2 * sin
    out[..., HALF:ROTARY_DIM] = x2 * cos + x1 * sin
    return out


def exact_table(rows: int) -> torch.Tensor:
    """``[rows, 8]`` cos(pos·θ) ‖ sin(pos·θ), angles and cos/sin in fp64, rounded once to fp32."""
    angle = torch.arange(rows, dtype=torch.float64)[:, None] * THETA
    return torch.cat([angle.cos(), angle.sin()], dim=-1).to(torch.float32)


def sglang_table(rows: int) -> torch.Tensor:
    """SGLang's construction, all in fp32: inv_freq = 1 / base^(2i/d), freqs = pos ⊗ inv_freq."""
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float32) / ROTARY_DIM))
    freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def unrotated_keys(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, KV_HEADS, HEAD_DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def pair_norm(keys: torch.Tensor) -> torch.Tensor:
    """``[n, heads, 8]``: for channel i and i + 4 alike, the norm of the pair (k[i], k[i+4])."""
    norm = torch.sqrt(keys[..., :HALF] ** 2 + keys[..., HALF:ROTARY_DIM] ** 2)
    return torch.cat([norm, norm], dim=-1)


def fp32_bound(keys: torch.Tensor, old: torch.Tensor, new: torch.Tensor, table_angle_error: bool) -> torch.Tensor:
    """Per-element bound ``[n, heads, 8]`` on the fp32 re-rotation's error against the fp64 truth.

    Rotations preserve the pair norm ‖·‖, so every error is a multiple of it. About ten fp32
    roundings lie on the path (the key's cast to fp32, the four table entries, two products and a
    sum for each of cosΔ and sinΔ, two products and a sum in the rotation), each at most U32·‖pair‖:
    12·U32·‖pair‖. Measured with ``exact_table``: at most 3.5·U32·‖pair‖ over 8,192 random rows.

    ``sglang_table`` adds the angle error of its fp32 entries: fl(pos)·fl(θ_i) rounds θ_i (a pow
    and a division, ≤ 2 U32 relative) and the product (≤ U32), so each entry's angle is off by at
    most 3·U32·pos·θ_i and cosΔ/sinΔ by the sum over o and p; 4·U32·(o + p)·θ_i·‖pair‖ with margin.
    Measured: at most 3.5·U32·(1 + (o + p)·θ_i)·‖pair‖ at positions up to 131,072.
    """
    bound = 12 * U32 * pair_norm(keys)
    if table_angle_error:
        angle = (old + new).to(torch.float64)[:, None, None] * torch.cat([THETA, THETA])
        bound = bound + 4 * U32 * angle * pair_norm(keys)
    return bound


def bf16_bound(keys: torch.Tensor, old, new, table_angle_error: bool) -> torch.Tensor:
    """Per-element bound on the bf16 re-rotation's error against the fp64 key computed fresh at p.

    Two bf16 roundings: the stored key (each channel off by ≤ U16·|k|, so the pair's error vector
    has norm ≤ U16·‖pair‖, and a rotation keeps that norm) and the result's cast back to bf16
    (≤ U16·|k'| ≤ U16·‖pair‖); plus the fp32 arithmetic in between (``fp32_bound``, negligible).
    2·U16·‖pair‖ ≈ 7.8e-3·‖pair‖. Measured: at most 1.89·U16·‖pair‖ (0.0187 absolute on these
    unit-variance keys) over 8,192 random rows, in line with the table of docs/model.md §5.
    """
    return 2 * U16 * pair_norm(keys) + fp32_bound(keys, old, new, table_angle_error)


def assert_matches_fresh(moved, stored, k0, old, new, table_angle_error=False):
    """``moved`` (production output from ``stored``, keys at ``old``) against fresh keys at ``new``."""
    assert moved.dtype == stored.dtype and moved.shape == stored.shape
    fresh = rope64(k0, new)
    bound_fn = fp32_bound if stored.dtype == torch.float32 else bf16_bound
    bound = bound_fn(fresh, old, new, table_angle_error)
    error = (moved.to(torch.float64) - fresh)[..., :ROTARY_DIM].abs()
    worst = (error / bound).max().item()
    assert worst <= 1.0, f"re-rotation error {error.max().item():.3g} is {worst:.3g}x its bound"
    # Partial rotary: channels 8..31 are the stored bits, never computed on.
    assert torch.equal(moved[..., ROTARY_DIM:], stored[..., ROTARY_DIM:])


# ----------------------------------------------------------------------------------------------
# Against keys computed fresh at the new position.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("delta", [1, 17, 500, 4000, -1, -63, -3000], ids=lambda d: f"delta{d:+d}")
def test_one_delta_for_all_rows_equals_keys_computed_at_the_new_position(dtype, delta):
    k0 = unrotated_keys(64, seed=7)
    old = torch.arange(3000, 3064)
    new = old + delta
    stored = rope64(k0, old).to(dtype)
    moved = rerotate_keys_from_cache(stored, old, new, exact_table(MAX_POSITIONS))
    assert_matches_fresh(moved, stored, k0, old, new)


def random_moves(rows: int, seed: int, key_seed: int, dtype):
    """``rows`` unrotated keys stored (rotated, in ``dtype``) at random positions, and a random new
    position for each: ``(k0, old, new, stored)``."""
    gen = torch.Generator().manual_seed(seed)
    k0 = unrotated_keys(rows, seed=key_seed)
    old = torch.randint(0, MAX_POSITIONS, (rows,), generator=gen)
    new = torch.randint(0, MAX_POSITIONS, (rows,), generator=gen)
    return k0, old, new, rope64(k0, old).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_row_deltas_equal_keys_computed_at_each_new_position(dtype):
    k0, old, new, stored = random_moves(256, seed=11, key_seed=8, dtype=dtype)
    new[::16] = old[::16]  # some rows stay where they are
    delta = new - old
    assert (delta > 0).sum() > 50 and (delta < 0).sum() > 50 and (delta == 0).sum() == 16
    assert delta.unique().numel() > 200  # genuinely a different delta per row
    moved = rerotate_keys_from_cache(stored, old, new, exact_table(MAX_POSITIONS))
    assert_matches_fresh(moved, stored, k0, old, new)


@pytest.mark.parametrize("dtype", DTYPES)
def test_long_positions_with_sglangs_fp32_table(dtype):
    """The table the server really passes (fp32 angles), over the long-context model's 131,072
    positions: the error grows with the position exactly as the angle error says, no more."""
    gen = torch.Generator().manual_seed(12)
    k0 = unrotated_keys(256, seed=9)
    old = torch.randint(0, LONG_CONTEXT_POSITIONS, (256,), generator=gen)
    new = (old + torch.randint(-20000, 20000, (256,), generator=gen)).clamp(0, LONG_CONTEXT_POSITIONS - 1)
    stored = rope64(k0, old).to(dtype)
    moved = rerotate_keys_from_cache(stored, old, new, sglang_table(LONG_CONTEXT_POSITIONS))
    assert_matches_fresh(moved, stored, k0, old, new, table_angle_error=True)


def test_bf16_result_is_within_one_rounding_of_the_exact_rotation_of_the_stored_key():
    """Sharper than the fresh-key bound: R(Δ) applied in fp64 to the stored bf16 key (rotations
    compose, so this is the stored key's own fresh value at p) differs from the production result
    only by the final cast, at most U16·|k'| per channel (+ the fp32 arithmetic). Measured:
    0.9955·U16·|k'| at most. A bf16 cos/sin (relative error up to 2^-8 in the angle's cos and sin)
    breaks it."""
    _, old, new, stored = random_moves(512, seed=13, key_seed=10, dtype=torch.bfloat16)
    moved = rerotate_keys_from_cache(stored, old, new, exact_table(MAX_POSITIONS))
    exact = rope64(stored.to(torch.float64), new - old)  # a rotation by Δ, from the formula
    error = (moved.to(torch.float64) - exact)[..., :ROTARY_DIM].abs()
    bound = U16 * exact[..., :ROTARY_DIM].abs() + 2 * fp32_bound(exact, old, new, table_angle_error=False)
    assert (error <= bound).all(), f"{(error > bound).sum().item()} channels off by more than one bf16 rounding"
    assert torch.equal(moved[..., ROTARY_DIM:], stored[..., ROTARY_DIM:])


# ----------------------------------------------------------------------------------------------
# Identity, pass-through channels, inputs.


@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_zero_is_the_identity_bit_for_bit(dtype):
    k0 = unrotated_keys(32, seed=14)
    pos = torch.randint(0, MAX_POSITIONS, (32,), generator=torch.Generator().manual_seed(15))
    stored = rope64(k0, pos).to(dtype)
    assert torch.equal(rerotate_keys_from_cache(stored, pos, pos.clone(), sglang_table(MAX_POSITIONS)), stored)
    # Mixed with moved rows in one call: the unmoved rows are still the stored bits.
    new = pos.clone()
    new[1::2] = (pos[1::2] + 37) % MAX_POSITIONS
    moved = rerotate_keys_from_cache(stored, pos, new, sglang_table(MAX_POSITIONS))
    assert torch.equal(moved[0::2], stored[0::2])
    assert not torch.equal(moved[1::2, :, :ROTARY_DIM], stored[1::2, :, :ROTARY_DIM])


@pytest.mark.parametrize("dtype", DTYPES)
def test_pass_through_channels_are_untouched_and_the_input_is_not_modified(dtype):
    _, old, new, stored = random_moves(64, seed=16, key_seed=17, dtype=dtype)
    before = stored.clone()
    moved = rerotate_keys_from_cache(stored, old, new, sglang_table(MAX_POSITIONS))
    assert torch.equal(stored, before)  # a new tensor; the caller writes it back
    assert moved.data_ptr() != stored.data_ptr()
    assert torch.equal(moved[..., ROTARY_DIM:], stored[..., ROTARY_DIM:])
    assert not torch.equal(moved[..., :ROTARY_DIM], stored[..., :ROTARY_DIM])


def test_one_rotation_beats_chained_rotations():
    """Why the relocation always rotates once from the stored key (docs/model.md §5): ten bf16
    re-rotations by −100 drift further from the fresh key at p − 1000 than one by −1000."""
    k0 = unrotated_keys(64, seed=18)
    old = torch.arange(6000, 6064)
    table = sglang_table(MAX_POSITIONS)
    stored = rope64(k0, old).to(torch.bfloat16)
    fresh = rope64(k0, old - 1000)
    once = rerotate_keys_from_cache(stored, old, old - 1000, table)
    chained = stored
    for step in range(10):
        chained = rerotate_keys_from_cache(chained, old - 100 * step, old - 100 * (step + 1), table)
    assert_matches_fresh(once, stored, k0, old, old - 1000)
    once_error = (once.double() - fresh).abs().max().item()
    chained_error = (chained.double() - fresh).abs().max().item()
    assert once_error < chained_error


# ----------------------------------------------------------------------------------------------
# Through ScrTensors.place: side rows -> fresh pool slots, keys re-rotated by one Δ per block.


def relocation_engine(dtype, layers=2, pool_rows=96, side_tokens=64):
    """A ``ScrTensors`` over plain tensors: ``layers`` (K, V) pool pairs, one side slot of
    ``side_tokens`` rows, the tiny model's rotary table. ``__init__`` needs a scheduler, so the
    attributes ``place`` reads are set directly."""
    gen = torch.Generator().manual_seed(19)
    pool_kv = [tuple(torch.randn(pool_rows, KV_HEADS, HEAD_DIM, generator=gen).to(dtype) for _ in "kv")
               for _ in range(layers)]
    engine = ScrTensors.__new__(ScrTensors)
    engine.pool_kv = pool_kv
    engine.side = SideBuffer(pool_kv, sessions=2, tokens=side_tokens)
    engine.rotary = SimpleNamespace(cos_sin_cache=exact_table(MAX_POSITIONS))
    # Side row r of slot 1 holds the key of position r (docs/scr.md §8: "old position of side row k is k").
    k0 = [unrotated_keys(side_tokens, seed=20 + layer) for layer in range(layers)]
    rows = torch.arange(side_tokens)
    for layer, (keys, values) in enumerate(engine.side.kv):
        keys[side_tokens + rows] = rope64(k0[layer], rows).to(dtype)
        values[side_tokens + rows] = torch.randn(side_tokens, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    return engine, k0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("old_start,new_start", [(40, 10), (5, 29)], ids=["back-30", "forward+24"])
def test_place_rerotates_a_relocated_block_to_its_new_positions(dtype, old_start, new_start):
    engine, k0 = relocation_engine(dtype)
    n = 20
    dst = torch.randperm(96, generator=torch.Generator().manual_seed(21))[:n]  # slots in any order
    untouched = torch.ones(96, dtype=torch.bool)
    untouched[dst] = False
    pool_before = [(k.clone(), v.clone()) for k, v in engine.pool_kv]
    engine.place(1, old_start, new_start, dst, rerotate=True)
    old = torch.arange(old_start, old_start + n)
    new = torch.arange(new_start, new_start + n)
    for layer, ((keys, values), (side_k, side_v)) in enumerate(zip(engine.pool_kv, engine.side.kv)):
        stored = side_k[64 + old]
        assert_matches_fresh(keys[dst], stored, k0[layer][old], old, new)
        assert torch.equal(values[dst], side_v[64 + old])  # values are copied, never rotated
        assert torch.equal(keys[untouched], pool_before[layer][0][untouched])
        assert torch.equal(values[untouched], pool_before[layer][1][untouched])


@pytest.mark.parametrize("dtype", DTYPES)
def test_place_copies_keys_bit_for_bit_when_not_moved_or_not_rerotated(dtype):
    engine, _ = relocation_engine(dtype)
    dst = torch.arange(50, 70)
    engine.place(1, 12, 12, dst, rerotate=True)  # same positions
    assert torch.equal(engine.pool_kv[0][0][dst], engine.side.kv[0][0][64 + 12:64 + 32])
    engine.place(1, 12, 3, dst, rerotate=False)  # the KVREUSE_NO_REROTATE ablation
    assert all(torch.equal(keys[dst], side_k[64 + 12:64 + 32])
               for (keys, _), (side_k, _) in zip(engine.pool_kv, engine.side.kv))


# ----------------------------------------------------------------------------------------------
# Errors.


def test_a_table_wider_than_the_head_is_rejected():
    """The documented error: the table's width is the rotary_dim, and it cannot exceed head_dim."""
    with pytest.raises(ValueError, match="rotary_dim 8 exceeds head_dim 4"):
        rerotate_keys_from_cache(torch.zeros(1, 1, 4), torch.tensor([0]), torch.tensor([1]), exact_table(4))
    with pytest.raises(ValueError, match="rotary_dim 8 exceeds head_dim 6"):
        rerotate_keys_from_cache(torch.zeros(2, 2, 6, dtype=torch.bfloat16), torch.tensor([0, 1]),
                                 torch.tensor([1, 1]), exact_table(4))


def test_positions_past_the_table_or_mismatched_row_counts_raise():
    """No silent garbage: a position past the table's last row raises (torch's IndexError); position
    lists that are not one integer per key row (a length-1 list would broadcast, a float one would
    truncate) and negative positions (they would read the table from its end) are refused by name."""
    keys = rope64(unrotated_keys(3, seed=22), torch.tensor([1, 2, 3])).float()
    table = exact_table(64)
    with pytest.raises(IndexError):
        rerotate_keys_from_cache(keys, torch.tensor([1, 2, 3]), torch.tensor([5, 6, 64]), table)
    with pytest.raises(ValueError, match=r"old_pos: 3 integer positions expected, got \(2,\)"):
        rerotate_keys_from_cache(keys, torch.tensor([1, 2]), torch.tensor([5, 6]), table)
    with pytest.raises(ValueError, match=r"new_pos: 3 integer positions expected, got \(2,\)"):
        rerotate_keys_from_cache(keys, torch.tensor([1, 2, 3]), torch.tensor([5, 6]), table)
    with pytest.raises(ValueError, match=r"new_pos: 3 integer positions expected, got \(1,\)"):
        rerotate_keys_from_cache(keys, torch.tensor([1, 2, 3]), torch.tensor([5]), table)
    with pytest.raises(ValueError, match="old_pos: 3 integer positions expected, got .*float32"):
        rerotate_keys_from_cache(keys, torch.tensor([1.0, 2.0, 3.0]), torch.tensor([5, 6, 7]), table)
    with pytest.raises(ValueError, match="new_pos: negative position -1"):
        rerotate_keys_from_cache(keys, torch.tensor([1, 2, 3]), torch.tensor([5, -1, 7]), table)