"""eval/chaos: the pure parts of running a scenario.

* ``shrunk_pool``: the restarted server's KV pool is one and a half of the longest call, rounded
  up to 512 tokens (one call runs, earlier prompts must be evicted for the next);
* ``fatal``: the lines of each server log that name a fatal marker (what ``no fatal lines``
  judges), at most five per log;
* ``fill_file``: fills a disk to its last byte, halving the block down to one byte at each
  refusal (a disk left with a few free bytes would take part of the next event line)."""

from __future__ import annotations

import errno
import os

import pytest

from eval.chaos import disk
from eval.chaos.run import fatal, shrunk_pool
from eval.server import FATAL_MARKERS
from eval.traces.format import TraceCall


def call(prompt: int, completion: int) -> TraceCall:
    return TraceCall(conversation="c", turn=0, prompt_ids=[1] * prompt, completion_ids=[2] * completion, cache_salt=None)


@pytest.mark.parametrize("longest, pool", [(1000, 1536), (1024, 1536), (1100, 2048), (340, 512), (342, 1024)])
def test_the_shrunk_pool_is_one_and_a_half_calls_in_512_token_steps(longest, pool):
    assert shrunk_pool([call(10, 5), call(longest - 8, 8)]) == pool


def test_fatal_lines_are_found_per_log(tmp_path):
    marker = FATAL_MARKERS[0]
    bad, good = tmp_path / "a.log", tmp_path / "b.log"
    bad.write_text("".join(f"line {i}\n" if i % 2 else f"{marker} {i}\n" for i in range(14)))
    good.write_text("all fine\n")
    found = fatal([bad, good, tmp_path / "missing.log"])
    assert found == {str(bad): [f"{marker} {i}" for i in (0, 2, 4, 6, 8)]}
    assert fatal([good]) == {}


@pytest.mark.parametrize("capacity", [100_001, 65_536, 3])
def test_fill_file_fills_the_disk_to_its_last_byte(tmp_path, monkeypatch, capacity):
    target = tmp_path / "fill"
    real_write, state = os.write, {"left": capacity, "fd": None}
    real_open = os.open

    def fake_open(path, *args):
        fd = real_open(path, *args)
        if str(path) == str(target):
            state["fd"] = fd
        return fd

    def fake_write(fd, data):
        if fd != state["fd"]:
            return real_write(fd, data)
        if len(data) > state["left"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        state["left"] -= len(data)
        return len(data)

    monkeypatch.setattr(disk.os, "open", fake_open)
    monkeypatch.setattr(disk.os, "write", fake_write)
    assert disk.fill_file(target, b"x") == capacity
    assert state["left"] == 0
