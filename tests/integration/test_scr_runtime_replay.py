"""``patches/scr_runtime.py`` on a fake engine, against a transcript recorded before its decisions
moved into ``scr/`` (``scr_fake_engine.py`` says what is replayed).

A deliberate change to a log line, an event or the runtime's behaviour re-records the transcript:
``SCR_REPLAY_RECORD=1 pytest tests/integration/test_scr_runtime_replay.py``, and the diff of
``scr_runtime_transcript.txt`` goes into review with the change.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from tests.integration.scr_fake_engine import transcript

GOLDEN = Path(__file__).with_name("scr_runtime_transcript.txt")


def test_the_runtime_replays_its_recorded_transcript():
    got = transcript()
    if os.environ.get("SCR_REPLAY_RECORD") == "1":
        GOLDEN.write_text("\n".join(got) + "\n")
    want = GOLDEN.read_text().splitlines()
    diff = list(difflib.unified_diff(want, got, "recorded", "now", lineterm="", n=2))
    assert not diff, "\n".join(diff[:80])
