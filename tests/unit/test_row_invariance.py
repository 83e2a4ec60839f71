"""``patches.row_invariance.rowwise``: during a decode forward a product's rows come out as if each
were computed alone (the bits a request decoded alone gets); outside decode nothing changes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from patches import row_invariance


def test_rows_are_computed_alone_only_while_decoding(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=gen)
    x = torch.randn(4, 64, generator=gen)
    alone = torch.cat([F.linear(x[i:i + 1], weight) for i in range(4)])
    calls = []

    def linear(rows):
        calls.append(rows.shape[0])
        return F.linear(rows, weight)

    monkeypatch.setitem(row_invariance._DECODING, "on", True)
    assert torch.equal(row_invariance.rowwise(linear, x), alone)  # bit for bit
    assert calls == [1, 1, 1, 1]
    assert torch.equal(row_invariance.rowwise(linear, x[:1]), F.linear(x[:1], weight))
    monkeypatch.setitem(row_invariance._DECODING, "on", False)
    calls.clear()
    row_invariance.rowwise(linear, x)
    assert calls == [4]  # prefill: one product
