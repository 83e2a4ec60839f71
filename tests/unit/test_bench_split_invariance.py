"""``eval.bench_split_invariance``: its table, its length list and the process-tree CPU count (the
benchmark itself starts servers and is run by hand: README, docs/exact.md §5.10)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from eval.bench_split_invariance import format_table, parse_lengths, tree_cpu_seconds


def test_the_table_gives_the_ratio_exact_to_radix():
    text = format_table([600, 8000], {"radix": {600: 0.2, 8000: 3.0}, "exact": {600: 0.15, 8000: 1.5}}, 4)
    lines = text.splitlines()
    assert "least of 4" in lines[0]
    assert lines[-2:] == ["| 600 | 0.20 | 0.15 | 0.75 |", "| 8,000 | 3.00 | 1.50 | 0.50 |"]


def test_lengths_parse_and_refuse_nonsense():
    assert parse_lengths("600, 2000,") == [600, 2000]
    for bad in ("", "1", "600,x"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_the_cpu_count_holds_at_least_the_process_own_time_with_a_child_alive():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        own = time.process_time()
        assert tree_cpu_seconds(os.getpid()) >= own - 0.05  # /proc counts in 10 ms ticks
    finally:
        child.kill()
        child.wait()


def test_reads_go_in_rounds_over_the_lengths_and_the_least_is_kept(monkeypatch):
    import eval.bench_split_invariance as bench

    order, costs = [], iter([5.0, 1.0, 0.5, 2.0, 0.7, 0.9])
    monkeypatch.setattr(bench, "cold_read_cpu", lambda server, prompt: order.append(len(prompt)) or next(costs))
    assert bench.least_cpu(None, {2: [1, 1], 3: [1, 1, 1]}, repeats=3) == {2: 0.5, 3: 0.9}
    assert order == [2, 3, 2, 3, 2, 3]
