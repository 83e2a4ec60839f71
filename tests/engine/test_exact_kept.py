"""``--cache-policy exact`` with ``cut=kept`` on the tiny model (CPU): forwards end only at chunk
ends (B = 128) and keep points (R = 256, message ends, prompt end, junction, all on the 64-token
grid); a read resumes at any kept 64-multiple. Warm = cold bit for bit, cold = the independent
reference, reuse = the brute-force oracle (``kept=True``).

This holds only where the engine's kernels give a row the same bits whatever forward read it (the
kept rule's premise, docs/exact.md §5.13): a warm read here runs other forwards than the cold read.
"""

from __future__ import annotations

import pytest

from tests.engine.conftest import start_server
from tests.engine.prompts import prompt_ids
from tests.engine.test_exact_server import BASE, edited, run_and_compare

pytestmark = pytest.mark.engine

B, R = 128, 256


@pytest.fixture(scope="module")
def kept_server(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exact-kept")
    args = ["--cache-policy", "exact", "--cache-events", str(tmp / "events.jsonl"), "--decode-log-interval", "1"]
    for setting in (f"piece_tokens={B}", f"retain_every={R}", "cut=kept", "message_end="):
        args += ["--cache-policy-set", setting]
    server = start_server(tiny_model_dir, tmp, "exact-kept", args)
    yield server
    server.stop()
    assert server.fatal_lines() == [], server.log_tail()


KEPT_CASES = {
    "repeat": [BASE, BASE],
    "append": [BASE, BASE + prompt_ids(103, 90)],
    "middle_delete": [BASE, BASE[:200] + BASE[330:]],
    "edit_off_the_chunk_grid": [BASE, edited(BASE, 330, 340)],  # resumes at 256 (periodic), junction 320
    "turns": [BASE[:300], BASE[:300] + prompt_ids(111, 80), BASE[:300] + prompt_ids(111, 80) + prompt_ids(112, 70)],
}


@pytest.mark.parametrize("name", list(KEPT_CASES))
def test_kept_rule_warm_equals_cold(kept_server, reference, name):
    warm = run_and_compare(kept_server, KEPT_CASES[name], reference, piece=B, retain_every=R, kept=True)
    assert warm[0]["cached_tokens"] == 0
    if name in ("repeat", "append"):
        assert warm[1]["cached_tokens"] == 576  # the prompt end floored to the grid: off the chunk grid (128)
