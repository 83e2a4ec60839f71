"""patches/scr_tensors.py (side buffer, state shadow) on plain tensors shaped like SGLang's pools."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from patches.scr_tensors import SideBuffer, StateShadow


def pools(layers=2, rows=50, heads=2, dim=4):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, heads, dim, generator=gen), torch.randn(rows, heads, dim, generator=gen))
            for _ in range(layers)]


def test_store_then_load_moves_exact_rows():
    pool = pools()
    side = SideBuffer(pool, sessions=3, tokens=8)
    src = torch.tensor([5, 9, 11, 2, 40, 41])
    side.store(1, pool, src, keep=0, end=6)
    dst = torch.tensor([30, 31, 32])
    before = [(k.clone(), v.clone()) for k, v in pool]
    side.load(1, torch.tensor([1, 2, 4]), pool, dst)
    for (k, v), (k0, v0) in zip(pool, before):
        assert torch.equal(k[dst], k0[torch.tensor([9, 11, 40])])
        assert torch.equal(v[dst], v0[torch.tensor([9, 11, 40])])
        untouched = torch.ones(50, dtype=torch.bool)
        untouched[dst] = False
        assert torch.equal(k[untouched], k0[untouched])


def test_incremental_store_copies_only_new_rows():
    pool = pools(layers=1)
    side = SideBuffer(pool, sessions=2, tokens=8)
    side.store(0, pool, torch.arange(0, 4), keep=0, end=4)
    marker = side.kv[0][0][:2].clone()
    pool[0][0][:4] = 0.0  # pretend the pool rows changed; rows below keep must not be re-read
    side.store(0, pool, torch.tensor([0, 1, 10, 11, 12]), keep=2, end=5)
    assert torch.equal(side.kv[0][0][:2], marker)
    assert torch.equal(side.kv[0][0][2:5], pool[0][0][torch.tensor([10, 11, 12])])


def test_bytes_per_token():
    side = SideBuffer(pools(layers=2, heads=2, dim=4), sessions=3, tokens=1024)
    # 2 layers x (K + V) x 2 heads x 4 dims x 4 bytes = 128 bytes per token
    assert side.bytes_per_token == 128


def test_state_shadow_round_trip():
    gen = torch.Generator().manual_seed(1)
    conv = [torch.randn(3, 5, 6, 3, generator=gen)]
    temporal = torch.randn(3, 5, 2, 4, 4, generator=gen)
    shadow = StateShadow(SimpleNamespace(conv=conv, temporal=temporal), sessions=2)
    shadow.save(1, state_index=3)
    saved = temporal[:, 3].clone(), conv[0][:, 3].clone()
    temporal[:, 3] = 0.0
    conv[0][:, 4] = 7.0
    shadow.restore(1, state_index=4)
    assert torch.equal(temporal[:, 4], saved[0]) and torch.equal(conv[0][:, 4], saved[1])
    assert torch.equal(temporal[:, 3], torch.zeros_like(temporal[:, 3]))  # the source is not touched
