"""``patches.row_invariance.rowwise``: during a decode forward a product's rows come out as if each
were computed alone (the bits a request decoded alone gets); during a prefill forward a short
product's rows come out as in a product of 64 rows; outside forwards nothing changes."""

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

    monkeypatch.setitem(row_invariance._FORWARD, "mode", "decode")
    assert torch.equal(row_invariance.rowwise(linear, x), alone)  # bit for bit
    assert calls == [1, 1, 1, 1]
    assert torch.equal(row_invariance.rowwise(linear, x[:1]), F.linear(x[:1], weight))
    monkeypatch.setitem(row_invariance._FORWARD, "mode", None)
    calls.clear()
    row_invariance.rowwise(linear, x)
    assert calls == [4]  # outside a forward: one product


def test_a_short_prefill_product_has_the_bits_of_the_same_rows_in_a_long_one(monkeypatch):
    """The last 2 rows of a prefill read alone come out as at the end of a 66-row product. (Unpadded
    they did not on the 2-core box, MKL's fp32 GEMM: a product of 1 or 2 rows takes another path;
    not asserted, as it depends on the CPU and the BLAS.)"""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 128, generator=gen)
    x = torch.randn(66, 128, generator=gen)
    long = F.linear(x, weight)
    calls = []

    def linear(rows):
        calls.append(rows.shape[0])
        return F.linear(rows, weight)

    monkeypatch.setitem(row_invariance._FORWARD, "mode", "prefill")
    assert torch.equal(row_invariance.rowwise(linear, x[64:]), long[64:])
    assert torch.equal(row_invariance.rowwise(linear, x), long)
    assert calls == [row_invariance.PREFILL_ROWS, 66]
