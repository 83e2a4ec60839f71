"""The relocation's key re-rotation reads nothing back from the device (no sync per layer), and
gives the same keys, bit for bit, as ``rerotate_keys_from_cache`` layer by layer (``patches/rope.py``,
``ScrTensors.place``; ``docs/scr.md`` §8.3). Numerical accuracy is ``tests/reference/test_rope.py``'s."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from patches.rope import rerotate_keys_from_cache, rotate_keys, shifted_rotation
from patches.scr_tensors import ScrTensors, SideBuffer

LAYERS, POOL_ROWS, SIDE_TOKENS, HEADS, HEAD_DIM, ROTARY_DIM, TABLE_ROWS = 3, 96, 64, 2, 16, 8, 200


def table(device="cpu") -> torch.Tensor:
    inv = 1.0 / 1e4 ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float) / ROTARY_DIM)
    angles = torch.arange(TABLE_ROWS, dtype=torch.float)[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


def engine(dtype=torch.float32, device="cpu") -> ScrTensors:
    """A ``ScrTensors`` with only what ``place`` reads: pools, a side buffer with slot 1 filled, a table."""
    gen = torch.Generator().manual_seed(5)

    def rand(rows):
        return torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(dtype).to(device)

    tensors = ScrTensors.__new__(ScrTensors)
    tensors.pool_kv = [(rand(POOL_ROWS), rand(POOL_ROWS)) for _ in range(LAYERS)]
    tensors.side = SideBuffer(tensors.pool_kv, sessions=2, tokens=SIDE_TOKENS)
    for keys, values in tensors.side.kv:
        keys[SIDE_TOKENS:], values[SIDE_TOKENS:] = rand(SIDE_TOKENS), rand(SIDE_TOKENS)
    tensors.rotary = NS(cos_sin_cache=table(device))
    return tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("old_start, new_start", [(40, 10), (5, 29)], ids=["back", "forward"])
def test_place_equals_the_per_layer_rotation_bit_for_bit(dtype, old_start, new_start):
    tensors = engine(dtype)
    dst = torch.randperm(POOL_ROWS, generator=torch.Generator().manual_seed(6))[:20]
    old = torch.arange(old_start, old_start + 20)
    tensors.place(1, old_start, new_start, dst, rerotate=True)
    for (keys, values), (side_k, side_v) in zip(tensors.pool_kv, tensors.side.kv):
        want = rerotate_keys_from_cache(side_k[SIDE_TOKENS + old], old, old + (new_start - old_start), table())
        assert torch.equal(keys[dst], want)
        assert torch.equal(values[dst], side_v[SIDE_TOKENS + old])


def test_place_reads_nothing_back_from_the_device():
    """On the meta device any read of a value (``.item()``, ``int()``, a boolean mask) raises: the
    relocation of every layer runs without one, where the general entry point needs one."""
    tensors = engine(device="meta")
    tensors.place(1, 40, 10, torch.arange(50, 70, device="meta"), rerotate=True)
    keys = tensors.pool_kv[0][0][:20]
    with pytest.raises(RuntimeError):
        rerotate_keys_from_cache(keys, torch.arange(20, device="meta"), torch.arange(3, 23, device="meta"), table("meta"))


def test_an_unmoved_block_keeps_its_keys_bit_for_bit():
    keys = torch.randn(10, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    assert torch.equal(rotate_keys(keys, shifted_rotation(30, 30, 10, table(), torch.device("cpu"))), keys)


@pytest.mark.parametrize(
    "old_start, new_start, problem",
    [
        pytest.param(-1, 5, r"old_start: positions \[-1, 9\)", id="negative-old"),
        pytest.param(5, -2, r"new_start: positions \[-2, 8\)", id="negative-new"),
        pytest.param(5, 191, r"new_start: positions \[191, 201\) outside the rotary table's 200 rows", id="past-table"),
    ],
)
def test_block_positions_are_checked_on_the_host(old_start, new_start, problem):
    with pytest.raises(ValueError, match=problem):
        shifted_rotation(old_start, new_start, 10, table(), torch.device("cpu"))


def test_a_table_wider_than_the_head_is_rejected():
    keys = torch.zeros(4, HEADS, ROTARY_DIM - 2)
    with pytest.raises(ValueError, match=f"rotary_dim {ROTARY_DIM} exceeds head_dim {ROTARY_DIM - 2}"):
        rotate_keys(keys, shifted_rotation(0, 1, 4, table(), torch.device("cpu")))
