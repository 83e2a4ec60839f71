"""``patches.launch_server``: our flags are split off, SGLang's pass through, bad input exits 2.

``parse`` must not import SGLang; that is checked in a fresh interpreter, since other tests may
import SGLang in this one. The bad-input cases run the real entry point and must fail during
argument parsing, before any server starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patches.launch_server import parse
from policy.registry import PolicySpec
from tests.unit.fake_policy import FakeConfig

ROOT = Path(__file__).resolve().parents[2]
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
FAST_S = 10.0  # a bad command line must be rejected well within this; starting SGLang takes far longer


def run_python(args: list[str], cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    result = subprocess.run([PYTHON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - start


# ---------------------------------------------------------------------- parse: good input


@pytest.mark.parametrize(
    "argv, expected_spec, expected_rest",
    [
        pytest.param([], PolicySpec("radix", {}, None), [], id="empty-defaults-to-radix"),
        pytest.param(["--model-path", "m"], PolicySpec("radix", {}, None), ["--model-path", "m"], id="default-radix"),
        pytest.param(["--cache-policy", "radix"], PolicySpec("radix", {}, None), [], id="space-form"),
        pytest.param(["--cache-policy=radix"], PolicySpec("radix", {}, None), [], id="equals-form"),
        pytest.param(
            ["--model-path", "m", "--cache-policy", "radix", "--port", "3"],
            PolicySpec("radix", {}, None),
            ["--model-path", "m", "--port", "3"],
            id="passthrough-in-order",
        ),
        pytest.param(
            ["--cache-policy=radix", "--model-path", "m", "--tp", "2", "--enable-metrics", "--port=3"],
            PolicySpec("radix", {}, None),
            ["--model-path", "m", "--tp", "2", "--enable-metrics", "--port=3"],
            id="passthrough-flags-and-equals",
        ),
        pytest.param(
            ["--random-seed", "-1", "--cache-policy", "radix", "--x", "-0.5"],
            PolicySpec("radix", {}, None),
            ["--random-seed", "-1", "--x", "-0.5"],
            id="passthrough-negative-values",
        ),
        pytest.param(["-h"], PolicySpec("radix", {}, None), ["-h"], id="short-help-goes-to-sglang"),
        pytest.param(
            ["--help", "--cache-policy", "radix"], PolicySpec("radix", {}, None), ["--help"], id="help-goes-to-sglang",
        ),
        pytest.param(
            ["--cache-policy-sets", "x", "--cache-event", "y"],
            PolicySpec("radix", {}, None),
            ["--cache-policy-sets", "x", "--cache-event", "y"],
            id="near-miss-names-not-abbreviated",
        ),
        pytest.param(
            ["--cache-events", "/abs/e.jsonl", "--port", "3"],
            PolicySpec("radix", {}, "/abs/e.jsonl"),
            ["--port", "3"],
            id="events-absolute-kept",
        ),
    ],
)
def test_parse(argv, expected_spec, expected_rest):
    argv_copy = list(argv)
    spec, rest = parse(argv)
    assert spec == expected_spec
    assert rest == expected_rest
    assert argv == argv_copy


@pytest.mark.parametrize(
    "events_arg, relative",
    [
        pytest.param("rel/path.jsonl", "rel/path.jsonl", id="subdir"),
        pytest.param("events.jsonl", "events.jsonl", id="bare-name"),
        pytest.param("./a/../b.jsonl", "b.jsonl", id="normalised"),
    ],
)
def test_parse_events_path_becomes_absolute(tmp_path, monkeypatch, events_arg, relative):
    monkeypatch.chdir(tmp_path)
    spec, rest = parse(["--cache-events", events_arg, "--model-path", "m"])
    assert spec.events_path == str(tmp_path / relative)
    assert os.path.isabs(spec.events_path)
    assert rest == ["--model-path", "m"]


@pytest.mark.parametrize(
    "sets, expected",
    [
        pytest.param([], FakeConfig(), id="none"),
        pytest.param(["piece_tokens=64"], FakeConfig(piece_tokens=64), id="one"),
        pytest.param(
            ["piece_tokens=64", "mode=strict", "enabled=off"],
            FakeConfig(piece_tokens=64, mode="strict", enabled=False),
            id="several",
        ),
        pytest.param(["piece_tokens=64", "piece_tokens=128"], FakeConfig(piece_tokens=128), id="later-wins"),
    ],
)
def test_parse_policy_set_repeatable(fake_policy, sets, expected):
    argv = ["--model-path", "m", "--cache-policy", fake_policy]
    for item in sets:
        argv += ["--cache-policy-set", item]
    argv += ["--port", "3"]
    spec, rest = parse(argv)
    assert spec == PolicySpec(fake_policy, {
        "piece_tokens": expected.piece_tokens,
        "ratio": expected.ratio,
        "enabled": expected.enabled,
        "mode": expected.mode,
        "label": expected.label,
    }, None)
    assert spec.build().config == expected
    assert rest == ["--model-path", "m", "--port", "3"]


def test_parse_does_not_import_sglang():
    argv = ["--model-path", "m", "--cache-policy", "radix", "--cache-events", "e.jsonl", "--port", "3"]
    code = (
        "import json, sys\n"
        "from patches.launch_server import parse\n"
        f"spec, rest = parse({argv!r})\n"
        "print(json.dumps({'spec': spec.to_json(), 'rest': rest,"
        " 'sglang': sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.'))}))\n"
    )
    result, _ = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["sglang"] == []
    assert out["rest"] == ["--model-path", "m", "--port", "3"]
    assert PolicySpec.from_json(out["spec"]) == PolicySpec("radix", {}, str(ROOT / "e.jsonl"))


# ---------------------------------------------------------------------- the entry point: bad input

USAGE_ERROR = "python -m patches.launch_server: error: "


@pytest.mark.parametrize(
    "argv, error",
    [
        pytest.param(
            ["--cache-policy", "nope"],
            "argument --cache-policy: invalid choice: 'nope' (choose from 'radix')",
            id="unknown-policy",
        ),
        pytest.param(
            ["--model-path", "m", "--cache-policy=nope", "--port", "3"],
            "argument --cache-policy: invalid choice: 'nope' (choose from 'radix')",
            id="unknown-policy-equals-form",
        ),
        pytest.param(
            ["--cache-policy-set", "foo=1"],
            "cache policy 'radix' has no setting 'foo'; valid settings: (none)",
            id="unknown-setting",
        ),
        pytest.param(
            ["--cache-policy-set", "novalue"],
            "--cache-policy-set expects key=value, got 'novalue'",
            id="setting-without-value",
        ),
        pytest.param(
            ["--cache-policy-set", "=1"],
            "--cache-policy-set expects key=value, got '=1'",
            id="setting-without-key",
        ),
        pytest.param(
            ["--model-path", "m", "--cache-policy"],
            "argument --cache-policy: expected one argument",
            id="policy-without-value",
        ),
        pytest.param(
            ["--cache-policy-set"],
            "argument --cache-policy-set: expected one argument",
            id="set-without-value",
        ),
        pytest.param(
            ["--cache-events"],
            "argument --cache-events: expected one argument",
            id="events-without-value",
        ),
    ],
)
def test_entry_point_rejects_bad_input(argv, error):
    result, elapsed = run_python(["-m", "patches.launch_server", *argv])
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("usage: python -m patches.launch_server [--cache-policy NAME]")
    assert result.stderr.endswith(USAGE_ERROR + error + "\n")
    assert elapsed < FAST_S


@pytest.mark.parametrize(
    "argv, fragments",
    [
        pytest.param(["--cache-policy", "nope"], ["radix"], id="unknown-policy-lists-radix"),
        pytest.param(
            ["--cache-policy-set", "foo=1"], ["has no setting 'foo'", "valid settings: (none)"], id="unknown-setting",
        ),
        pytest.param(["--cache-policy-set", "novalue"], ["key=value"], id="missing-equals-mentions-key-value"),
    ],
)
def test_entry_point_error_mentions(argv, fragments):
    result, elapsed = run_python(["-m", "patches.launch_server", *argv])
    assert result.returncode == 2
    error_line = result.stderr.splitlines()[-1]
    for fragment in fragments:
        assert fragment in error_line
    assert elapsed < FAST_S
