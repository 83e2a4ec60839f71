"""``eval.bench_policies --resume``: an arm's earlier result is reused only when it measured the
same thing (same trace bytes, server arguments, settings, concurrency) and passed every check; a
set rendered `preserve` (eval/render.py) is a trace file of its own."""

import hashlib
import json

import pytest

from eval.arms import parse_arm
from eval.bench_policies import file_digest, reusable

ARGS = ["--cache-policy", "scr", "--cache-policy-set", "relocated_in_tree=0"]


def finished(folder, **overrides):
    arm = parse_arm("scr-notree=scr:relocated_in_tree=0")
    result = {"arm": arm.name, "policy": "scr", "settings": dict(arm.settings), "concurrency": 4,
              "trace_sha256": "abc", "server_args": ARGS, "checks_failed": [], "replay_s": 1.0}
    result.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report").mkdir(exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(result))
    return arm


def test_file_digest_is_sha256_of_the_bytes(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"x" * (3 << 20) + b"tail")
    assert file_digest(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_measurement_is_reused(tmp_path):
    arm = finished(tmp_path / "a")
    assert reusable(tmp_path / "a", arm, ARGS, 4, "abc")["replay_s"] == 1.0


def test_anything_different_is_served_again(tmp_path):
    arm = finished(tmp_path / "a")
    assert reusable(tmp_path / "a", arm, ARGS, 4, "other-trace") is None
    assert reusable(tmp_path / "a", arm, ARGS + ["--x"], 4, "abc") is None
    assert reusable(tmp_path / "a", arm, ARGS, 1, "abc") is None
    other = parse_arm("scr-notree=scr:relocated_in_tree=1")
    assert reusable(tmp_path / "a", other, ARGS, 4, "abc") is None


def test_failed_missing_or_unreadable_results_are_not_reused(tmp_path):
    arm = finished(tmp_path / "failed", checks_failed=["identity"])
    assert reusable(tmp_path / "failed", arm, ARGS, 4, "abc") is None
    arm = finished(tmp_path / "mispredicted", exact_prediction={"share": 0.99})
    assert reusable(tmp_path / "mispredicted", arm, ARGS, 4, "abc") is None
    arm = finished(tmp_path / "noreport")
    (tmp_path / "noreport" / "report").rmdir()
    assert reusable(tmp_path / "noreport", arm, ARGS, 4, "abc") is None
    assert reusable(tmp_path / "empty", arm, ARGS, 4, "abc") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bench.json").write_text("{")
    assert reusable(tmp_path / "broken", arm, ARGS, 4, "abc") is None


def test_a_preserve_set_is_another_file_and_the_rendering_goes_to_synth(tmp_path, monkeypatch):
    """--render preserve (eval/render.py) generates its own trace file, so its digest (and any
    --resume) never mixes with the default set's; the default set keeps its old name."""
    import subprocess

    from eval import bench_policies

    default = bench_policies.default_trace_path(tmp_path, 10, 0)
    assert default.name == "trace-q10-s0-qwen.jsonl"
    assert bench_policies.default_trace_path(tmp_path, 10, 0, "preserve").name == "trace-q10-s0-qwen-preserve.jsonl"
    seen = []
    monkeypatch.setattr(subprocess, "run", lambda argv, check: seen.append(argv))
    bench_policies.synth_default(tmp_path / "t.jsonl", 2, 1, render="preserve")
    assert seen[0][seen[0].index("--render") + 1] == "preserve"


def test_a_trace_rendered_otherwise_than_render_asks_is_refused(tmp_path, capsys):
    from eval import bench_policies
    from eval.traces.format import TraceCall, write_trace

    trace = tmp_path / "t.jsonl"
    write_trace([TraceCall("q1", 0, [1, 2], [3], None, meta={"render": "preserve"})], trace)
    assert bench_policies.trace_rendering(trace, None) == bench_policies.trace_rendering(trace, "preserve") == "preserve"
    with pytest.raises(SystemExit) as info:
        bench_policies.main(["--out", str(tmp_path / "o"), "--trace", str(trace), "--render", "default"])
    assert info.value.code == 2
    assert f"--render default: {trace} was rendered 'preserve'" in capsys.readouterr().err
