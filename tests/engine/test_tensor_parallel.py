"""``--tp-size 2`` on the CPU path (gloo between two scheduler processes, one core each: the
launcher fills ``SGLANG_CPU_OMP_THREADS_BIND``), for ``exact`` (docs/tensor_parallel.md §3; ``scr``:
``test_scr_tensor_parallel.py``, a module of its own so that the two TP servers never run at once).

Each rank holds its shard of every snapshot (half the GDN value heads, half the KV heads).
The plan is a pure function of the token ids, so both ranks make the same one. Checked on one TP 2
server: warm answers equal cold ones bit for bit (ids and logprobs), cold ones equal the
independent reference (``tests/reference``), and the reused lengths equal the spec's brute-force
oracle (``tests/reference/exact_oracle.py``), on the cases of ``test_exact_server`` that edit, interleave and append;
and per rank, the snapshot a resumed read keeps at 512 equals the one a cold read keeps there
(dumped as ``<rid>-512.pt`` by rank 0 and ``<rid>-512-tp1.pt`` by rank 1), while the two ranks'
shards differ (they hold different heads).
"""

from __future__ import annotations

import pytest

from eval.server import output_record
from tests.engine.conftest import start_server
from tests.engine.test_exact_server import BASE, CASES, edited, exact_args, run_and_compare

pytestmark = pytest.mark.engine

TP_CASES = ("same_edit_twice", "two_interleaved_conversations", "append")  # cases that reuse something


def test_ranks_that_drift_apart_stop_the_server_with_a_named_error(tiny_model_dir, tmp_path):
    """The check after every prefill forward (docs/tensor_parallel.md §3): rank 1's piece check fails
    (injected), so it keeps nothing where rank 0 keeps the prompt-end snapshot. The exchange names
    the step at once, instead of two trees that differ from then on (a hang in the next all-reduce,
    or a resume one rank cannot serve). First in the module, before the module's TP server starts
    (two would share 2 cores)."""
    import time

    server = start_server(tiny_model_dir, tmp_path, "exact_tp2_drift", ["--tp-size", "2", *exact_args(tmp_path)],
                          env={"CACHE_POLICY_FAULTS": "exact.piece~drift#1@1+"})
    try:
        with pytest.raises(Exception):
            server.post("/generate", {"input_ids": BASE[:100], "rid": "drift.1",
                                      "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}}, timeout=120)
        deadline = time.monotonic() + 60
        while server.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.process.poll() is not None, "the server kept running with ranks that disagree"
        # The prompt-end snapshot of a 100-token prompt sits at 64 (the last whole piece, B = 64).
        assert "TP ranks disagree at step piece end=64 keep=prompt_end of rid=drift.1" in server.log_text()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact_tp2")
    server = start_server(tiny_model_dir, tmp, "exact_tp2",
                          ["--tp-size", "2", *exact_args(tmp, f"dump_snapshots={tmp / 'snapshots'}")])
    server.dump = tmp / "snapshots"
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()
    assert "read [" not in server.log_text()  # no forward off the planned pieces


def test_threads_bound_per_rank(tp_server):
    assert "SGLANG_CPU_OMP_THREADS_BIND=" in tp_server.log_text()  # logged with the CPU defaults


@pytest.mark.parametrize("name", TP_CASES)
def test_warm_equals_cold_under_tp2(tp_server, reference, name):
    warm = run_and_compare(tp_server, CASES[name], reference)
    assert warm[0]["cached_tokens"] == 0 and any(w["cached_tokens"] > 0 for w in warm[1:])


def test_each_rank_keeps_its_shard_of_the_same_snapshot(tp_server):
    import torch

    edit = edited(BASE, 300, 310)
    tp_server.flush_cache()
    tp_server.generate(BASE, 2, rid="tp-base")
    assert output_record(tp_server.generate(edit, 2, rid="tp-resumed"))["cached_tokens"] == 256
    tp_server.flush_cache()
    tp_server.generate(edit[:513], 2, rid="tp-cold")  # its prompt end is the cut at 512
    shards = {}
    for suffix in ("", "-tp1"):
        warm = torch.load(tp_server.dump / f"tp-resumed-512{suffix}.pt")
        cold = torch.load(tp_server.dump / f"tp-cold-512{suffix}.pt")
        for a, b in zip(warm["conv"], cold["conv"], strict=True):
            assert torch.equal(a, b)
        assert torch.equal(warm["temporal"], cold["temporal"]) and warm["temporal"].abs().sum() > 0
        shards[suffix] = warm["temporal"]
    assert shards[""].shape == shards["-tp1"].shape
    assert not torch.equal(shards[""], shards["-tp1"])  # different heads
