"""The kernels step: the premise of exact's kept rule (``docs/exact.md`` §5.13, §6) on the GPU's own
kernels. ``python -m patches.kernel_selftest`` (in a fresh interpreter: ``eval/`` does not import
``patches/``) runs SGLang's GDN chunk kernel and its unified extend attention on random bf16 data at
Qwen3.6's head dims, each read in one forward and in forwards split on the 64-token grid, and
reports the kernels whose split read is not bit-identical: the same self-test a CUDA server runs
before it serves the rule. Off the grid (37, 100) the GDN kernel must differ, as it does under the
Triton interpreter (``tests/kernels``): proof the comparison can see a split on this GPU.

On CPU there is nothing to run (the kernels are Triton GPU kernels); the kernel tier runs the same
self-test on them under the interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

from eval.gpu_check.report import SKIP, Checks, StepResult

RESULT_PREFIX = "KERNEL_SELFTEST "  # patches/kernel_selftest.py prints its one JSON line after it
GDN_CHUNK, EXTEND_ATTENTION = "gdn_chunk", "extend_attention"  # its kernel names
TIMEOUT_S = 240  # importing torch and SGLang, and Triton compiling ten kernels at new shapes


def selftest(device: str, dtype: str = "bfloat16") -> dict:
    """``python -m patches.kernel_selftest``'s JSON line (or why there is none)."""
    answer = subprocess.run([sys.executable, "-m", "patches.kernel_selftest", "--device", device, "--dtype", dtype],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    for line in answer.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"error": (answer.stderr or answer.stdout).strip()[-800:] or f"exit {answer.returncode}"}


def judge(checks: Checks, report: dict) -> None:
    """The expectations on a self-test report (pure, unit-tested)."""
    checks.note("selftest", report)
    if "error" in report:
        checks.expect(False, f"the self-test did not report: {report['error']}")
        return
    grid = report.get("grid_failures", {})
    checks.expect(grid == {}, "split on the 64-token grid, both kernels are bit-identical to the unsplit read, and "
                  "the GDN prefill keeps inside one forward the states forwards that ended there leave (gdn_keeping)"
                  + ("" if not grid else ": " + "; ".join(f"{k}: {v}" for k, v in sorted(grid.items()))))
    off = report.get("off_grid", {})
    checks.expect(GDN_CHUNK in off, f"off the grid (37, 100) the GDN chunk kernel's bits change, as under the "
                  f"interpreter (the comparison can see a split): {off.get(GDN_CHUNK, 'identical')}")
    checks.note("attention_off_grid", off.get(EXTEND_ATTENTION, "identical (as under the interpreter)"))


def run(ctx):
    if not ctx.cuda:
        return StepResult("kernels", SKIP, detail="CPU: no GPU kernels; tests/kernels runs the self-test on SGLang's "
                          "Triton kernels under the interpreter")
    checks = Checks()
    judge(checks, selftest("cuda"))
    return checks.result("kernels", "GDN chunk and unified extend attention: a 64-grid split is bit-identical; "
                         "states kept inside a forward are the ended forwards'; a split at 37 changes the GDN "
                         "kernel's bits")
