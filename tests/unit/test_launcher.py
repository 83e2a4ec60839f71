"""``patches.launch_server`` and its command line (``serving/launch_args.py``): our flags are split
off, SGLang's pass through, bad input exits 2, ``--help`` shows ours without importing SGLang.

``parse`` must not import SGLang; that is checked in a fresh interpreter, since other tests may
import SGLang in this one. The bad-input cases run the real entry point and must fail during
argument parsing, before any server starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exact_cache.config import ExactConfig
from exact_cache.policy import ExactPolicy
from patches.launch_server import build_parser, parse
from serving.launch_args import LaunchError, apply_server_settings, given, snapshot_settings
from policy.registry import PolicySpec
from policy import registry
from policy.api import PolicyDefaults
from tests.unit.fake_policy import FakeConfig, FakePolicy

ROOT = Path(__file__).resolve().parents[2]
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
FAST_S = 10.0  # a bad command line must be rejected well within this; starting SGLang takes far longer


def run_python(args: list[str], cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    result = subprocess.run([PYTHON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - start


class LaunchableFakePolicy(PolicyDefaults, FakePolicy):
    """``FakePolicy`` with the optional members' defaults, which the launcher calls.

    TODO(issue 13): drop once ``tests/unit/fake_policy.FakePolicy`` inherits ``PolicyDefaults``."""

    config_class = FakeConfig


@pytest.fixture
def fake_policy(fake_policy):
    registry.register(fake_policy, "tests.unit.test_launcher:LaunchableFakePolicy")
    return fake_policy


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


# ---------------------------------------------------------------------- --help


def imported_modules(importtime_stderr: str) -> set[str]:
    """Module names from ``python -X importtime`` output (``import time: self | cumulative | name``)."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_shows_our_flags_first_without_importing_sglang(flag):
    result, _ = run_python(["-X", "importtime", "-m", "patches.launch_server", "--model-path", "m", flag])
    assert result.returncode == 0, result.stderr
    usage, description, options = result.stdout.split("\n\n")[:3]
    assert usage.startswith("usage: python -m patches.launch_server [--cache-policy NAME]")
    assert "run 'python -m patches.launch_server --help-sglang' to list those." in description.replace("\n", " ")
    for ours in ("--cache-policy NAME", "--cache-policy-set KEY=VALUE", "--cache-events FILE", "--cache-trace FILE",
                 "-h, --help", "--help-sglang"):
        assert ours in options
    assert "Default: radix" in options and "exact, radix, scr" in " ".join(options.split())
    assert "  exact (" in result.stdout and "piece_tokens=832" in result.stdout
    imported = imported_modules(result.stderr)
    assert "serving.launch_args" in imported  # the check sees the launcher's own imports
    assert not {m for m in imported if m.split(".")[0] in ("sglang", "torch")}


def test_every_flag_has_complete_help_with_its_default():
    for action in build_parser()._actions:
        text = " ".join(action.help.split())
        assert text.endswith(".") and text[0].isupper(), action.option_strings
        if action.nargs != 0:
            assert "Default: " in text, action.option_strings


def test_help_sglang_execs_sglangs_own_help(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, args: calls.append((path, args)))
    parse(["--help-sglang"])
    assert calls == [(sys.executable, [sys.executable, "-m", "sglang.launch_server", "--help"])]


# ---------------------------------------------------------------------- start-up record


@pytest.mark.parametrize(
    "argv, policy, settings",
    [
        pytest.param(["--model-path", "m"], "radix", {}, id="radix"),
        pytest.param(["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=64",
                      "--cache-policy-set", "retain_every=128"], "exact",
                     dataclasses.asdict(ExactConfig(piece_tokens=64, retain_every=128)), id="exact-with-settings"),
    ],
)
def test_startup_record_is_appended_before_the_events(tmp_path, argv, policy, settings):
    from policy.events import read_events, read_startups
    from serving.event_writer import write_startup_record

    events = tmp_path / "events.jsonl"
    spec, sglang_argv = parse([*argv, "--cache-events", str(events)])
    write_startup_record(spec.events_path, spec.policy, spec.config, sglang_argv)
    write_startup_record(spec.events_path, spec.policy, spec.config, sglang_argv)  # a restart appends a second
    first, second = read_startups(str(events))
    assert first["record"] == "startup" and first["policy"] == policy and first["settings"] == settings
    assert first["server_args"] == sglang_argv and first["pid"] == os.getpid() and second["ts"] >= first["ts"]
    assert set(first["versions"]) == {"sglang", "torch", "transformers", "overlay"}
    assert first["versions"]["overlay"] == "0.1.0"
    assert list(read_events(str(events))) == []


def test_no_startup_record_without_an_events_file(tmp_path, monkeypatch):
    from serving.event_writer import write_startup_record

    monkeypatch.chdir(tmp_path)
    spec, sglang_argv = parse(["--model-path", "m"])
    write_startup_record(spec.events_path, spec.policy, spec.config, sglang_argv)
    assert list(tmp_path.iterdir()) == []


def test_the_launcher_declares_policy_capabilities_instead_of_probing():
    for path in ("serving/launch_args.py", "patches/launch_server.py"):
        text = (ROOT / path).read_text()
        assert "hasattr(" not in text and "getattr(" not in text, path


# ---------------------------------------------------------------------- the entry point: bad input

USAGE_ERROR = "python -m patches.launch_server: error: "


@pytest.mark.parametrize(
    "argv, error",
    [
        pytest.param(
            ["--cache-policy", "nope"],
            "argument --cache-policy: invalid choice: 'nope' (choose from 'exact', 'radix', 'scr')",
            id="unknown-policy",
        ),
        pytest.param(
            ["--model-path", "m", "--cache-policy=nope", "--port", "3"],
            "argument --cache-policy: invalid choice: 'nope' (choose from 'exact', 'radix', 'scr')",
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
            ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=100"],
            "cache policy 'exact': piece_tokens=100: must be a positive multiple of 64",
            id="exact-bad-piece",
        ),
        pytest.param(
            ["--model-path", "m", "--cache-policy", "exact", "--chunked-prefill-size", "128"],
            "--cache-policy exact needs --chunked-prefill-size 832; "
            "the command line gives --chunked-prefill-size 128",
            id="exact-conflicting-chunk-size",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--enable-mixed-chunk"],
            "--cache-policy exact cannot run with --enable-mixed-chunk",
            id="exact-forbidden-flag",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--cache-policy-set", "max_snapshots=1"],
            "max_snapshots=1 is too small for one running request: it needs at least 2",
            id="exact-budget-too-small",
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
        pytest.param(
            ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=100"], ["piece_tokens"],
            id="exact-bad-piece-names-the-setting",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--chunked-prefill-size", "128"], ["needs --chunked-prefill-size 832"],
            id="exact-chunk-size-names-the-needed-value",
        ),
    ],
)
def test_entry_point_error_mentions(argv, fragments):
    result, elapsed = run_python(["-m", "patches.launch_server", *argv])
    assert result.returncode == 2
    error_line = result.stderr.splitlines()[-1]
    for fragment in fragments:
        assert fragment in error_line
    assert elapsed < FAST_S


# ---------------------------------------------------------------------- the exact policy's SGLang settings

EXACT_832_ADDED = [
    "--chunked-prefill-size", "832",
    "--prefill-max-requests", "1",
    "--page-size", "1",
    "--mamba-radix-cache-strategy", "no_buffer",
    "--disable-overlap-schedule",
    "--radix-cache-backend", "exact",
]  # enable_mixed_chunk=False adds nothing


def exact_spec(**config) -> PolicySpec:
    return PolicySpec("exact", dataclasses.asdict(ExactConfig(**config)), None)


@pytest.mark.parametrize(
    "argv, expected_spec, expected_rest",
    [
        pytest.param(
            ["--model-path", "m", "--cache-policy", "exact"], exact_spec(), ["--model-path", "m", *EXACT_832_ADDED],
            id="defaults-appended-after-passthrough",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=64", "--cache-policy-set", "retain_every=256"],
            exact_spec(piece_tokens=64, retain_every=256),
            ["--chunked-prefill-size", "64", *EXACT_832_ADDED[2:]],
            id="piece-size-follows-the-setting",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--chunked-prefill-size", "832", "--disable-overlap-schedule", "--page-size=1"],
            exact_spec(),
            ["--chunked-prefill-size", "832", "--disable-overlap-schedule", "--page-size=1",
             "--prefill-max-requests", "1", "--mamba-radix-cache-strategy", "no_buffer",
             "--radix-cache-backend", "exact"],
            id="agreeing-values-not-repeated",
        ),
        pytest.param(
            ["--cache-policy", "exact", "--cache-policy-set", "max_snapshots=3", "--max-running-requests", "2"],
            exact_spec(max_snapshots=3),
            ["--max-running-requests", "2", *EXACT_832_ADDED, "--max-mamba-cache-size", "5"],
            id="snapshot-budget-sizes-the-mamba-pool",
        ),
    ],
)
def test_parse_exact(argv, expected_spec, expected_rest):
    spec, rest = parse(argv)
    assert spec == expected_spec
    assert rest == expected_rest


@pytest.mark.parametrize(
    "argv, flag, expected",
    [
        pytest.param([], "--page-size", (False, None), id="absent"),
        pytest.param(["--page-size", "4"], "--page-size", (True, "4"), id="space-form"),
        pytest.param(["--page-size=4"], "--page-size", (True, "4"), id="equals-form"),
        pytest.param(["--port", "3", "--disable-overlap-schedule"], "--disable-overlap-schedule", (True, None),
                     id="bare-flag-last"),
        pytest.param(["--disable-overlap-schedule", "--port", "3"], "--disable-overlap-schedule", (True, None),
                     id="bare-flag-before-another-flag"),
        pytest.param(["--page-size-x", "4"], "--page-size", (False, None), id="longer-name-is-not-the-flag"),
        pytest.param(["--random-seed", "-1"], "--random-seed", (True, "-1"), id="negative-value"),
    ],
)
def test_given(argv, flag, expected):
    assert given(argv, flag) == expected


@pytest.mark.parametrize(
    "settings, argv, expected",
    [
        pytest.param({"disable_overlap_schedule": True}, ["--port", "3"],
                     ["--port", "3", "--disable-overlap-schedule"], id="bool-flag-added"),
        pytest.param({"disable_overlap_schedule": True}, ["--disable-overlap-schedule"],
                     ["--disable-overlap-schedule"], id="bool-flag-already-given"),
        pytest.param({"enable_mixed_chunk": False}, ["--port", "3"], ["--port", "3"], id="absent-bool-stays-absent"),
        pytest.param({"page_size": 1}, ["--port", "3"], ["--port", "3", "--page-size", "1"], id="value-added"),
        pytest.param({"page_size": 1}, ["--page-size", "1"], ["--page-size", "1"], id="same-value-unchanged"),
        pytest.param({"page_size": 1}, ["--page-size=1"], ["--page-size=1"], id="same-value-equals-form-unchanged"),
        pytest.param(
            {"chunked_prefill_size": 64, "radix_cache_backend": "exact"}, [],
            ["--chunked-prefill-size", "64", "--radix-cache-backend", "exact"], id="in-settings-order",
        ),
        pytest.param({}, ["--port", "3"], ["--port", "3"], id="no-settings"),
    ],
)
def test_apply_server_settings(settings, argv, expected):
    argv_copy = list(argv)
    assert apply_server_settings("exact", settings, argv) == expected
    assert argv == argv_copy


@pytest.mark.parametrize(
    "settings, argv, message",
    [
        pytest.param(
            {"enable_mixed_chunk": False}, ["--enable-mixed-chunk"],
            "--cache-policy exact cannot run with --enable-mixed-chunk", id="forbidden-bool-flag",
        ),
        pytest.param(
            {"page_size": 1}, ["--page-size", "16"],
            "--cache-policy exact needs --page-size 1; the command line gives --page-size 16", id="different-value",
        ),
        pytest.param(
            {"page_size": 1}, ["--page-size=16"],
            "--cache-policy exact needs --page-size 1; the command line gives --page-size 16",
            id="different-value-equals-form",
        ),
        pytest.param(
            {"mamba_radix_cache_strategy": "no_buffer"}, ["--mamba-radix-cache-strategy", "extra_buffer"],
            "--cache-policy exact needs --mamba-radix-cache-strategy no_buffer; "
            "the command line gives --mamba-radix-cache-strategy extra_buffer",
            id="different-string-value",
        ),
        pytest.param(
            {"page_size": 1}, ["--page-size", "--port", "3"],
            "--cache-policy exact needs --page-size 1; the command line gives --page-size None",
            id="value-flag-without-value",
        ),
    ],
)
def test_apply_server_settings_conflicts(settings, argv, message):
    with pytest.raises(LaunchError) as info:
        apply_server_settings("exact", settings, argv)
    assert str(info.value) == message


def exact_policy(max_snapshots: int) -> ExactPolicy:
    return ExactPolicy(ExactConfig(max_snapshots=max_snapshots))


@pytest.mark.parametrize(
    "max_snapshots, argv, expected",
    [
        pytest.param(0, [], {}, id="0-leaves-sglang-sizing"),
        pytest.param(0, ["--max-running-requests", "2"], {}, id="0-ignores-running"),
        pytest.param(3, ["--max-running-requests", "2"], {"max_mamba_cache_size": 5}, id="3+2"),
        pytest.param(2, ["--max-running-requests=1"], {"max_mamba_cache_size": 3}, id="2+1-equals-form"),
    ],
)
def test_snapshot_budget(max_snapshots, argv, expected):
    assert snapshot_settings(exact_policy(max_snapshots).snapshot_budget(), argv) == expected


@pytest.mark.parametrize(
    "max_snapshots, argv, message",
    [
        pytest.param(
            1, ["--max-running-requests", "2"],
            "max_snapshots=1 is too small for one running request: it needs at least 2", id="1-too-small",
        ),
        pytest.param(
            3, [],
            "max_snapshots needs --max-running-requests N: each running request holds a working state slot "
            "besides the snapshots",
            id="3-without-running",
        ),
        pytest.param(
            3, ["--max-running-requests"],
            "max_snapshots needs --max-running-requests N: each running request holds a working state slot "
            "besides the snapshots",
            id="3-running-without-value",
        ),
    ],
)
def test_snapshot_budget_rejects(max_snapshots, argv, message):
    with pytest.raises(LaunchError) as info:
        snapshot_settings(exact_policy(max_snapshots).snapshot_budget(), argv)
    assert str(info.value) == message


def test_snapshot_budget_of_a_policy_without_one():
    assert snapshot_settings(PolicySpec("radix").build().snapshot_budget(), ["--max-running-requests", "2"]) == {}


def test_parse_exact_does_not_import_sglang_or_torch():
    code = (
        "import json, sys\n"
        "from patches.launch_server import parse\n"
        "spec, rest = parse(['--cache-policy', 'exact', '--model-path', 'm'])\n"
        "print(json.dumps({'rest': rest,"
        " 'heavy': sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch'))}))\n"
    )
    result, _ = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["heavy"] == []
    assert out["rest"] == ["--model-path", "m", *EXACT_832_ADDED]


def test_snapshot_budget_with_a_non_integer_running_count_is_a_policy_error():
    with pytest.raises(LaunchError, match=r"^max_snapshots needs --max-running-requests N: "):
        snapshot_settings(ExactPolicy(ExactConfig(max_snapshots=4)).snapshot_budget(), ["--max-running-requests", "x"])


# ---------------------------------------------------------------------------------------- scr


@pytest.fixture
def no_kvreuse_env(monkeypatch):
    """The authors' KVREUSE_* variables of the calling shell must not leak into these cases."""
    for key in list(os.environ):
        if key.startswith("KVREUSE_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    "env, sets, expected",
    [
        pytest.param({}, [], 6, id="default"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, [], 3, id="authors-env"),
        pytest.param({"KVREUSE_MAX_BLOCKS": "3"}, ["max_blocks=5"], 5, id="command-line-wins"),
    ],
)
def test_scr_settings_layer_env_under_command_line(monkeypatch, no_kvreuse_env, env, sets, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    argv = ["--model-path", "m", "--cache-policy", "scr", *[x for s in sets for x in ("--cache-policy-set", s)]]
    spec, _rest = parse(argv)
    assert spec.config["max_blocks"] == expected


def test_scr_bad_authors_env_is_a_launch_error(monkeypatch):
    monkeypatch.setenv("KVREUSE_SSM_MODE", "sideways")
    with pytest.raises(SystemExit) as info:
        parse(["--model-path", "m", "--cache-policy", "scr"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "argv, expected_tail",
    [
        pytest.param([], ["--page-size", "1", "--disable-overlap-schedule", "--log-requests",
                          "--log-requests-level", "0"], id="adds-settings-and-request-log"),
        pytest.param(["--log-requests-level", "2"], ["--log-requests-level", "2", "--page-size", "1",
                                                     "--disable-overlap-schedule", "--log-requests"],
                     id="keeps-the-users-log-level"),
    ],
)
def test_scr_server_settings(no_kvreuse_env, argv, expected_tail):
    _spec, rest = parse(["--model-path", "m", "--cache-policy", "scr", *argv])
    assert rest == ["--model-path", "m", *expected_tail]


def test_scr_refuses_a_page_size_other_than_one():
    with pytest.raises(SystemExit):
        parse(["--model-path", "m", "--cache-policy", "scr", "--page-size", "16"])


# ---------------------------------------------------------------------- refusals from a scheduler


@pytest.mark.parametrize(
    "messages, expected",
    [
        pytest.param([], [], id="none"),
        pytest.param(["no text rotary"], ["no text rotary"], id="one"),
        pytest.param(["b: second", "a: first", "b: second"], ["a: first", "b: second"], id="deduplicated-sorted"),
    ],
)
def test_refusals_travel_from_scheduler_to_launcher(monkeypatch, messages, expected):
    from serving import refusals

    monkeypatch.delenv(refusals.REFUSAL_ENV, raising=False)
    path = refusals.open_channel()
    try:
        assert os.environ[refusals.REFUSAL_ENV] == path
        for message in messages:
            refusals.record(message)
        assert refusals.reasons(path) == expected
    finally:
        os.unlink(path)
    assert refusals.reasons(path) == []  # the file is gone


def test_a_refusal_without_a_launcher_is_not_recorded(monkeypatch, tmp_path):
    from serving import refusals

    monkeypatch.delenv(refusals.REFUSAL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    refusals.record("no launcher")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- token lookups (exact cut=messages)


class _Vocab:
    unk_token_id = 0
    ids = {"<unk>": 0, "<|im_end|>": 7, "▁hi": 8}

    def convert_tokens_to_ids(self, text):
        return self.ids.get(text, 0)

    def convert_ids_to_tokens(self, token_id):
        return {v: k for k, v in self.ids.items()}[token_id]


def test_token_ids_looks_up_one_token_and_refuses_what_is_not_one():
    from serving.launch_args import token_ids

    assert token_ids({"message_end_id": "<|im_end|>"}, _Vocab()) == {"message_end_id": 7}
    with pytest.raises(LaunchError, match="message_end_id: the served tokenizer has no token '<im_start>'"):
        token_ids({"message_end_id": "<im_start>"}, _Vocab())


def test_parse_exact_messages_looks_the_token_up_in_the_served_tokenizer(tmp_path):
    """The id comes from the tokenizer on the command line, not a constant; an explicit id is kept."""
    from eval.tiny_model import build_tokenizer

    build_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    expected = AutoTokenizer.from_pretrained(str(tmp_path)).convert_tokens_to_ids("<|im_end|>")
    spec, _ = parse(["--cache-policy", "exact", "--cache-policy-set", "cut=messages", "--model-path", str(tmp_path)])
    assert spec.config["message_end_id"] == expected and spec.build().rule.message_end == expected
    spec, _ = parse(["--cache-policy", "exact", "--cache-policy-set", "cut=messages", "--cache-policy-set",
                     "message_end_id=5", "--model-path", "not-loaded"])
    assert spec.config["message_end_id"] == 5
    spec, _ = parse(["--cache-policy", "exact", "--model-path", "not-loaded"])  # grid: no lookup
    assert spec.config["message_end_id"] == -1


def test_parse_exact_messages_with_a_token_the_tokenizer_lacks_exits_2(tmp_path, capsys):
    from eval.tiny_model import build_tokenizer

    build_tokenizer(tmp_path)
    with pytest.raises(SystemExit) as info:
        parse(["--cache-policy", "exact", "--cache-policy-set", "cut=messages", "--cache-policy-set",
               "message_end=<|turn|>", "--model-path", str(tmp_path)])
    assert info.value.code == 2
    assert "message_end_id: the served tokenizer has no token '<|turn|>'" in capsys.readouterr().err


# ---------------------------------------------------------------------- KV-cache format refusals


def _resolved_server(policy_name: str, policy_sets: list[str], cuda: bool, kv_cache_dtype: str, model_dir: Path):
    """What ``prepare_server_args`` would resolve for a server that honours the profile and the
    policy's own settings, with ``kv_cache_dtype`` as given (``vars()`` of it is what the launcher reads)."""
    import types

    from serving import profile

    spec = PolicySpec.resolve(policy_name, policy_sets, None)
    chosen = profile.get("matched")
    fields = {"model_path": str(model_dir), "revision": None, "chunked_prefill_size": 512, "tp_size": 1,
              "prefill_max_requests": 1, **chosen.settings(cuda), **spec.build().server_settings(),
              "kv_cache_dtype": kv_cache_dtype, "dtype": "auto"}
    return spec, chosen, types.SimpleNamespace(**fields)


@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
@pytest.mark.parametrize("policy_name, sets", [("exact", ["piece_tokens=832"]), ("scr", [])], ids=["exact", "scr"])
@pytest.mark.parametrize("kv, refused", [("auto", False), ("bf16", False), ("bfloat16", False),
                                         ("fp8_e4m3", True), ("fp8_e5m2", True), ("mxfp8", True), ("nvfp4", True)])
def test_the_launcher_refuses_a_quantized_kv_cache_for_both_policies(
        tmp_path, monkeypatch, capsys, cuda, policy_name, sets, kv, refused, no_kvreuse_env):
    """exact and scr both compare or move KV rows bit for bit: a quantized KV cache exits 2 naming
    the flag, and SGLang's two spellings of bfloat16 are accepted (``bf16`` was refused by exact)."""
    from patches import launch_server
    from serving import profile

    (tmp_path / "config.json").write_text("{}")
    spec, chosen, server_args = _resolved_server(policy_name, sets, cuda, kv, tmp_path)
    monkeypatch.setattr(launch_server, "_torch_sees_a_gpu", lambda: cuda)
    for key, value in profile.get("matched").environment(cuda).items():
        monkeypatch.setenv(key, value)
    lines = _refusal_lines(spec, server_args, chosen, cuda, capsys)
    if not refused:
        assert lines is None
        return
    assert lines == [f"  - --kv-cache-dtype {kv}: " + (
        "quantized KV rows are read by kernels outside SGLang's deterministic set" if policy_name == "exact" else
        "SCR re-rotates relocated keys in the pool's dtype, so a quantized key would be rounded back to its format "
        "on every move and drift from a cold read") + "; use --kv-cache-dtype auto (or bf16)"]


def _refusal_lines(spec, server_args, chosen, cuda: bool, capsys) -> list[str] | None:
    """The launcher's start-up check on resolved settings: None when it lets the server start, else
    the problem lines it printed before exiting 2."""
    from patches import launch_server

    try:
        launch_server._refuse_unsafe_settings(spec, server_args, chosen, cuda)
    except SystemExit as stopped:
        assert stopped.code == 2
        return [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    return None


# ---------------------------------------------------------------------- the kept rule's kernel guard


@pytest.mark.parametrize("failures, refused", [({}, False), ({"gdn_chunk": "split at 64: output differs"}, True)],
                         ids=["invariant", "split-variant"])
def test_cut_kept_is_refused_on_cuda_unless_the_kernels_hold_split_invariance(
        tmp_path, monkeypatch, capsys, caplog, failures, refused):
    """The launcher asks the device (``split_invariance_failures``) only for a policy whose premise
    it is, and exits 2 naming the kernel and pointing at cut=messages when a split changed bits;
    when it held, it says so in one start-up line (``PREMISE_HELD``, what the GPU check reads)."""
    import logging
    from patches import launch_server
    from serving import profile

    (tmp_path / "config.json").write_text("{}")
    asked = []
    monkeypatch.setattr(launch_server, "split_invariance_failures", lambda args, cuda: asked.append(cuda) or failures)
    monkeypatch.setattr(launch_server, "_torch_sees_a_gpu", lambda: True)
    for key, value in profile.get("matched").environment(True).items():
        monkeypatch.setenv(key, value)
    spec, chosen, server_args = _resolved_server("exact", ["cut=kept", "message_end=", "piece_tokens=832"], True,
                                                 "auto", tmp_path)
    if not refused:
        with caplog.at_level(logging.INFO, logger="patches.launch_server"):
            launch_server._refuse_unsafe_settings(spec, server_args, chosen, True)
        assert [r.getMessage() for r in caplog.records] == [
            "cut=kept: split invariance checked on CUDA (patches.kernel_selftest, bfloat16): no kernel's bits change "
            "when a forward is split on the 64-token grid"]
    else:
        with pytest.raises(SystemExit) as stopped:
            launch_server._refuse_unsafe_settings(spec, server_args, chosen, True)
        assert stopped.value.code == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
        assert "cut=kept needs kernels that give a row the same bits" in line
        assert "gdn_chunk does not here: split at 64: output differs" in line and line.endswith("cut=messages instead")
    assert asked == [True]
    grid, grid_chosen, grid_args = _resolved_server("exact", ["piece_tokens=832"], True, "auto", tmp_path)
    caplog.clear()
    launch_server._refuse_unsafe_settings(grid, grid_args, grid_chosen, True)
    assert asked == [True]  # cut=grid rests on no such premise: the device is not asked
    assert not [r for r in caplog.records if "split invariance" in r.getMessage()]


@pytest.mark.parametrize("keeps, refused", [("ends", False), ("inside", True)])
def test_a_failed_keeping_check_refuses_keeps_inside_only(tmp_path, monkeypatch, capsys, keeps, refused):
    """The self-test's ``gdn_keeping`` entry (a state kept inside a forward is not the ended forward's)
    is the premise of ``keeps=inside`` alone: that server exits 2 pointing at keeps=ends, while
    ``keeps=ends`` on the same kernels starts."""
    from patches import launch_server
    from serving import profile

    (tmp_path / "config.json").write_text("{}")
    failures = {"gdn_keeping": "the state kept at 64 differs from the forward that ended there"}
    monkeypatch.setattr(launch_server, "split_invariance_failures", lambda args, cuda: failures)
    monkeypatch.setattr(launch_server, "_torch_sees_a_gpu", lambda: True)
    for key, value in profile.get("matched").environment(True).items():
        monkeypatch.setenv(key, value)
    spec, chosen, server_args = _resolved_server(
        "exact", ["cut=kept", "message_end=", "piece_tokens=832", f"keeps={keeps}"], True, "auto", tmp_path)
    lines = _refusal_lines(spec, server_args, chosen, True, capsys)
    if not refused:
        assert lines is None
        return
    [line] = lines
    assert line.startswith("  - keeps=inside needs the GDN prefill to keep") and "gdn_keeping does not here" in line
    assert line.endswith("keeps=ends instead")


def test_the_cpu_engine_answers_for_itself_under_cut_kept(tmp_path):
    """On CPU the answer is the CPU engine's measured property (patches/cpu/platform.py), not a kernel run."""
    import types

    from patches import launch_server
    from patches.cpu import platform as cpu_platform

    assert launch_server.split_invariance_failures(types.SimpleNamespace(), False) == \
        cpu_platform.SPLIT_INVARIANCE_FAILURES == {}  # the tiled prefill attention made it so


# ---------------------------------------------------------------------- request limits (issue 33)


def test_request_limit_flags_default_and_set():
    from serving.launch_args import request_limits_of
    from serving.request_limits import KIB, MIB, RequestLimits

    args, rest = build_parser().parse_known_args(["--model-path", "m"])
    assert request_limits_of(args) == RequestLimits() and rest == ["--model-path", "m"]
    args, rest = build_parser().parse_known_args([
        "--max-request-body", "1M", "--max-prompts", "8", "--max-sequences", "16", "--max-stop-regexes", "2",
        "--max-stop-regex-chars", "100", "--stop-regex-max-mem", "64K", "--stop-regex-cache", "2048K",
        "--port", "1"])
    assert rest == ["--port", "1"]
    assert request_limits_of(args) == RequestLimits(MIB, 8, 16, 2, 100, 64 * KIB, 2 * MIB)


def test_request_limits_travel_as_one_env_var(monkeypatch):
    from patches import launch_server
    from serving import request_limits

    monkeypatch.setenv(request_limits.LIMITS_ENV, "stale")
    limits = launch_server._pass_request_limits(["--max-prompts", "3"])
    assert os.environ[request_limits.LIMITS_ENV] == limits.to_json()
    assert request_limits.current().max_prompts == 3


@pytest.mark.parametrize("argv, error", [
    (["--max-prompts", "0"], "argument --max-prompts: expected a positive integer, got '0'"),
    (["--max-sequences", "x"], "argument --max-sequences: expected a positive integer, got 'x'"),
    (["--max-request-body", "1.5M"], "argument --max-request-body: '1.5M' is not a size (an integer, optionally "
                                     "with K, M or G: 256K, 32M)"),
    (["--stop-regex-cache", "0"], "argument --stop-regex-cache: expected a positive size, got '0'"),
    (["--stop-regex-max-mem", "1K"], "--stop-regex-max-mem must be at least 16K, got 1024"),
])
def test_bad_request_limits_exit_2_before_sglang(argv, error):
    result, _ = run_python(["-m", "patches.launch_server", "--model-path", "m", *argv])
    assert result.returncode == 2, result.stderr
    assert result.stderr.rstrip().endswith(error), result.stderr
