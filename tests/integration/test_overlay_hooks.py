"""The overlay's hooks inside real SGLang 0.5.16 on CPU: discovery, effect, failure modes, CPU defaults.

``HookRegistry``, ``patches.plugin`` and ``patches.process`` are process-global, so each scenario runs in a fresh
interpreter (``overlay_child.py``, which documents the scenarios) and these tests assert on its
JSON summary, exit status and stderr. Importing SGLang costs several CPU-seconds per process, so the
module starts every child at once and each test waits for its own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from patches import routes, targets, validation
from patches.cpu import attention as cpu_attention
from patches.cpu import platform as cpu_platform
from policy.registry import SPEC_ENV, PolicySpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("overlay_child.py")
_VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PYTHON) if _VENV_PYTHON.exists() else sys.executable
CHILD_TIMEOUT_S = 240  # a child needs ~8 CPU-seconds; the box is shared
SUMMARY_PREFIX = "OVERLAY_CHILD_SUMMARY "
MISSING_TARGET = "sglang.srt.mem_cache.common.no_such_function"

POLICY_TARGETS = {targets.REQ_MATCHED, targets.RELEASE_KV, targets.SCHEDULER_IDLE, targets.SCHEDULER_INIT,
                  targets.ABORT}
CPU_TARGETS = {target for target, _ in cpu_platform.KERNEL_REPLACEMENTS} | {
    cpu_platform.SERVER_ARGS_POST_INIT,
    cpu_attention.TARGET,
    cpu_platform.ENGINE_CONFIG,  # fork, the default start method on CPU (the children drop the variable)
}
# request checks and the open routes' hook: installed with or without a policy
VALIDATION_TARGETS = set(validation.TARGETS) | set(routes.TARGETS)
OUR_SOURCE = [["cache_policy", "hybrid-cache-policies"]]  # (entry point name, distribution)
INSTALLED_RE = re.compile(
    r"^\[cache-policy\] overlay installed pid=(\d+) cpu_platform=(True|False) policy=(\S+) hooks=(\d+)$"
)


class Child:
    """One scenario process; started at once, read on first ``result()``."""

    def __init__(self, scenario: str, spec: str | None, args: tuple[str, ...] = ()):
        env = {k: v for k, v in os.environ.items()
               if k not in (SPEC_ENV, "SGLANG_PLUGINS", "SGLANG_MAMBA_CONV_DTYPE", cpu_platform.START_METHOD_ENV)}
        env["HF_HUB_OFFLINE"] = "1"
        if spec is not None:
            env[SPEC_ENV] = spec
        self.scenario = scenario
        self.proc = subprocess.Popen(
            [PYTHON, str(CHILD), scenario, *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self._result = None

    def result(self) -> "ChildResult":
        if self._result is None:
            try:
                stdout, stderr = self.proc.communicate(timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                stdout, stderr = self.proc.communicate()
                pytest.fail(f"{self.scenario}: no exit within {CHILD_TIMEOUT_S} s\n{stderr[-4000:]}")
            self._result = ChildResult(self.proc.returncode, stdout, stderr)
        return self._result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class ChildResult:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        lines = [line for line in stdout.splitlines() if line.startswith(SUMMARY_PREFIX)]
        assert lines, f"no summary line (exit {returncode})\nstdout:\n{stdout[-2000:]}\nstderr:\n{stderr[-4000:]}"
        self.summary = json.loads(lines[-1][len(SUMMARY_PREFIX):])

    def installed_lines(self) -> list[tuple[int, bool, str, int]]:
        found = []
        for line in self.stderr.splitlines():
            match = INSTALLED_RE.match(line)
            if match:
                pid, cpu, policy, hooks = match.groups()
                found.append((int(pid), cpu == "True", policy, int(hooks)))
        return found


@pytest.fixture(scope="module")
def children(tiny_model_dir, tmp_path_factory):
    events_dir = tmp_path_factory.mktemp("overlay_events")
    radix = PolicySpec.resolve("radix").to_json()
    radix_with_events = PolicySpec.resolve("radix", events_path=str(events_dir / "events.jsonl")).to_json()
    started = {
        "policy": Child("policy", radix_with_events, (str(tiny_model_dir),)),
        "stock": Child("stock", None, (str(tiny_model_dir),)),
        "cuda_text_only": Child("cuda_text_only", None, (str(tiny_model_dir),)),
        "version": Child("version", None),
        "missing_hook": Child("missing_hook", radix),
        "missing_hook_loader": Child("missing_hook_loader", radix),
        "bad_spec": Child("bad_spec", "not json"),
    }
    yield started
    for child in started.values():
        child.kill()


def _check_discovery(result: ChildResult, expected: set[str], policy: str) -> None:
    discovery = result.summary["discovery"]
    assert result.returncode == 0, result.stderr[-4000:]
    assert discovery["cuda"] is False, "these expectations are for the CPU platform"
    assert discovery["state_installed"] is True
    assert discovery["state_cpu"] is True
    assert sorted(discovery["installed_targets"]) == sorted(expected)
    assert len(discovery["installed_targets"]) == len(expected)  # each registered once
    assert sorted(discovery["targets"]) == sorted(expected)
    for target, info in discovery["targets"].items():
        assert info == {"replaced": True, "wraps_original": True, "sources": OUR_SOURCE}, target
    assert result.installed_lines() == [(discovery["pid"], True, policy, len(expected))]


# ---------------------------------------------------------------------- 1. entry point discovery


def test_entry_point_installs_policy_and_cpu_hooks(children):
    result = children["policy"].result()
    assert len(POLICY_TARGETS | CPU_TARGETS | VALIDATION_TARGETS) == 25
    _check_discovery(result, POLICY_TARGETS | CPU_TARGETS | VALIDATION_TARGETS, policy="radix")


def test_entry_point_without_spec_installs_only_cpu_hooks(children):
    result = children["stock"].result()
    assert len(CPU_TARGETS | VALIDATION_TARGETS) == 20
    _check_discovery(result, CPU_TARGETS | VALIDATION_TARGETS, policy="None")


def test_on_cuda_the_tiny_model_starts_text_only(children):
    """On CUDA SGLang 0.5.16 serves a Qwen3.5/3.6 architecture as multimodal and dies building an
    image processor the tiny checkpoint has no config for (OSError); the overlay's rule, installed on
    every platform, serves a checkpoint without processor configs text-only, so the tokenizer manager
    and the scheduler load its tokenizer (patches/text_only.py)."""
    result = children["cuda_text_only"].result()
    assert result.returncode == 0, result.stderr[-4000:]
    summary = result.summary
    assert summary["cpu"] is False and summary["post_init_hooks"] == 1
    assert summary["with_overlay"] == {"enable_multimodal": False, "is_multimodal": False, "loads": True,
                                       "tokenizer_manager": "loaded TokenizersBackend",
                                       "scheduler": "loaded TokenizersBackend"}
    alone = summary["sglang_alone"]
    assert (alone["enable_multimodal"], alone["is_multimodal"], alone["loads"]) == (None, True, False)
    for step in ("tokenizer_manager", "scheduler"):
        assert alone[step].startswith("OSError: Can't load image processor"), alone[step]


# ---------------------------------------------------------------------- 2. hooks on real objects


def test_hooks_plan_and_release_on_real_cache(children):
    result = children["policy"].result()
    assert result.returncode == 0, result.stderr[-4000:]
    flow = result.summary["flow"]

    # The plugin's Scheduler.__init__ hook: only attention-TP rank 0 writes events.
    assert flow["rank1_writes_events"] is False
    assert flow["rank0_events_file"] == flow["events_path"]
    assert flow["executor_policy"] == "radix"

    # B = A (12 tokens, KV + recurrent state in the tree) + 5 new tokens.
    assert flow["b_prefix_len"] == 12
    assert flow["b_prefix_is_a"] is True
    assert flow["b_cow_source_is_a"] is True
    assert flow["b_plan"] == {"resume": 12, "steps": [[12, 17]]}
    assert flow["b_cached_tokens"] == 12

    # Release of B (finished by length after 3 tokens): one event, exact counts, state dropped.
    assert flow["events_before_b_release"] == 0
    assert len(flow["events_after_b"]) == 1
    event_b = flow["events_after_b"][0]
    assert {k: v for k, v in event_b.items() if k not in ("queued_ts", "finished_ts")} == {
        "schema": 1,
        "snapshots": [],
        "forwards_off_plan": 0,
        "pieces": [],
        "blocks": 0,
        "fallback": None,
        "retractions": 0,
        "match_cap": None,
        "rid": "req-b",
        "policy": "radix",
        "prompt_tokens": 17,
        "prefix_reused": 12,
        "moved": 0,
        "read": 5,
        "decode_tokens": 3,
        "cache_salt": None,
        "plan_resume": 12,
        "finish_reason": "length",
    }
    assert 0 < event_b["queued_ts"] <= event_b["finished_ts"]
    assert flow["b_tracked_after_release"] is False
    assert flow["b_row_freed"] is True
    # The tree now owns B's 17 prompt + 2 decoded KV slots (A's 12 among them); nothing leaked.
    assert flow["tree_tokens_after_b"] == 19
    assert flow["kv_available_after_b"] == flow["kv_total"] - 19

    # C shares A's first 8 tokens but no recurrent state sits there: hybrid match 0.
    assert flow["c_prefix_len"] == 0
    assert flow["c_plan"] == {"resume": 0, "steps": [[0, 11]]}
    assert len(flow["events_after_c"]) == 2
    event_c = flow["events_after_c"][1]
    assert (event_c["rid"], event_c["prompt_tokens"], event_c["prefix_reused"], event_c["read"]) == ("req-c", 11, 0, 11)
    assert (event_c["decode_tokens"], event_c["plan_resume"], event_c["finish_reason"]) == (0, 0, "abort")
    assert flow["tracked_after_c"] == []

    # init_next_round_input without a tree cache plans nothing.
    assert flow["e_tracked"] is False

    # D extends B's cached sequence: 17 prompt + 2 decoded tokens are served.
    assert flow["d_prefix_len"] == 19
    assert flow["d_plan"] == {"resume": 19, "steps": [[19, 20]]}


# ---------------------------------------------------------------------- 3. failure modes


def test_version_mismatch_stops_process(children):
    result = children["version"].result()
    summary = result.summary
    assert result.returncode == 1
    assert summary["raised"] == "SystemExit"
    assert "sglang==9.9.9" in summary["message"]
    assert "sglang==0.5.16" in summary["message"]
    assert summary["message"] in result.stderr
    assert (summary["registered"], summary["applied"], summary["installed"]) == ([], [], False)


def test_missing_hook_stops_install_naming_target(children):
    result = children["missing_hook"].result()
    summary = result.summary
    assert result.returncode == 1
    assert summary["raised"] == "SystemExit", summary
    assert MISSING_TARGET in summary["message"]
    assert MISSING_TARGET in result.stderr
    assert summary["installed"] is False


def test_missing_hook_stops_process_under_sglang_loader(children):
    result = children["missing_hook_loader"].result()
    summary = result.summary
    assert result.returncode == 1, (summary, result.stderr[-3000:])
    assert summary["raised"] == "SystemExit", summary
    assert MISSING_TARGET in result.stderr


def test_unparseable_spec_stops_process_under_sglang_loader(children):
    result = children["bad_spec"].result()
    summary = result.summary
    assert result.returncode == 1
    # SystemExit passes through the loader's `except Exception` (an Exception would be swallowed).
    assert summary["raised"] == "SystemExit"
    assert summary["message"].startswith(f"cache-policy overlay: cannot parse {SPEC_ENV}: ")
    assert summary["message"] in result.stderr
    # The CPU hooks were registered before the spec was read, and none was applied.
    assert summary["registered"] == sorted(CPU_TARGETS | VALIDATION_TARGETS)
    assert (summary["applied"], summary["installed"]) == ([], False)


# ---------------------------------------------------------------------- 4. CPU ServerArgs defaults


def test_cpu_server_args_defaults(children):
    result = children["stock"].result()
    assert result.returncode == 0, result.stderr[-4000:]
    server_args = result.summary["server_args"]
    assert server_args["defaults"] == {
        "device": "cpu",
        "attention_backend": "torch_native",
        "sampling_backend": "pytorch",
        "disable_cuda_graph": True,
        "enable_multimodal": False,
        "mamba_radix_cache_strategy": "no_buffer",
        "disable_overlap_schedule": True,
        "dtype": "float32",
    }
    assert server_args["conv_dtype_env"] == "float32"
    assert server_args["explicit_bf16_dtype"] == "bfloat16"
    message = server_args["extra_buffer_error"]
    assert message is not None and "extra_buffer is not available on CPU" in message
    assert "Use no_buffer" in message
