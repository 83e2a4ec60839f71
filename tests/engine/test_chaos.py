"""``eval.chaos`` in CI: one short scenario per policy (one server, its events file on a disk that
fills, killed between turns and restarted with a shrunk pool), every check of ``eval/chaos/checks.py``.

The full matrix (both setups, the router with a worker killed mid-call) is the README's command;
it takes minutes per policy, these take under a minute each. CI runners cannot mount a tmpfs, so
the disk fault there is the injected ENOSPC (``--no-mount``); ``eval.chaos`` uses a real tmpfs
where the machine allows it.
"""

from __future__ import annotations

import json

import pytest

from eval.chaos.__main__ import main


@pytest.mark.parametrize("policy", ["radix", "exact", "scr"])
def test_one_server_survives_a_full_disk_and_a_restart(policy, tiny_model_dir, tmp_path):
    out = tmp_path / "chaos"
    # turn 1: c00's call is the full-disk window (its event lost), c01's (a deletion) relocates with
    # its event kept; turn 2 comes after the restart with the shrunk pool (where scr's relocation
    # finds no rows to allocate and reads plainly: measured)
    status = main(["--policies", policy, "--setups", "alone", "--conversations", "2", "--turns", "3", "--lost-writes", "1",
                   "--no-mount", "--model", str(tiny_model_dir), "--out", str(out)])
    result = json.loads((out / "chaos.json").read_text())[f"{policy} alone"]
    verdicts = result["verdicts"]
    failed = {name: v["detail"] for name, v in verdicts.items() if v["ok"] is False}
    assert status == 0 and not failed, failed
    # the faults happened: events were lost to the disk and the restart was recorded
    assert verdicts["disk full logged"]["ok"] and verdicts["restart said"]["ok"]
    if policy == "exact":
        assert verdicts["exact = replay"]["ok"] and verdicts["exact warm = cold"]["ok"]
    if policy == "scr":
        assert verdicts["scr own rows"]["ok"]
