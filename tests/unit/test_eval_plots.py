"""``eval.plots``: the CDF steps (pure) and that the figure helpers write a PNG."""

from __future__ import annotations

import pytest

from eval import plots


@pytest.mark.parametrize("values, xs, ys", [
    ([], [], []),
    ([5], [5], [1.0]),
    ([3, 1, 2, 4], [1, 2, 3, 4], [0.25, 0.5, 0.75, 1.0]),
    ([2, 2], [2, 2], [0.5, 1.0]),
])
def test_cdf_points(values, xs, ys):
    assert plots.cdf_points(values) == (xs, ys)


def test_helpers_write_png(tmp_path):
    fig, ax = plots.subplots(4, 3)
    plots.stacked_bars(ax, ["a", "b"], [("low", [1, 2], "#4c72b0"), ("high", [3, 1], "#c44e52")])
    plots.cdf_step(ax, [], "nothing")
    plots.cdf_step(ax, [1, 3, 2], "run")
    assert [bar.get_y() for bar in ax.patches] == [0, 0, 1, 2]  # the second layer sits on the first
    path = plots.save(fig, tmp_path / "x.png", rect=(0, 0.05, 1, 1))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
