"""The launcher's refusals: settings under which a policy cannot keep its promise must stop the
server before it serves (exit status 2, a message naming the setting), not serve wrong numbers.

Each case starts ``python -m patches.launch_server`` and waits for it to exit. A refusal comes
after SGLang has parsed its arguments and before the model loads (20-40 s each, mostly importing
SGLang), so on CUDA the cases run at once; on CPU one at a time (the dry-run box is small). A case
that reaches the ready line instead is a FAIL, and its server is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from eval.gpu_check.report import Checks
from eval.server import READY_LINE, free_port

REFUSAL_STATUS = 2
TIMEOUT_S = 180


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    needle: str  # text the refusal message must contain (case-insensitive)
    cuda_only: str = ""  # why the case does not apply on CPU ("" when it does)


CASES = (
    Case("exact+fp8", ("--cache-policy", "exact", "--quantization", "fp8"), "quantized weights (--quantization fp8)"),
    Case("scr+extra_buffer", ("--cache-policy", "scr", "--serving-profile", "none",
                              "--mamba-radix-cache-strategy", "extra_buffer"),
         "--mamba-radix-cache-strategy extra_buffer",
         cuda_only="the CPU platform refuses extra_buffer itself, before any policy sees it"),
    Case("exact-nondeterministic", ("--cache-policy", "exact", "--serving-profile", "none"),
         "--enable-deterministic-inference",
         cuda_only="the batch-invariance rules apply to CUDA kernels only (CPU kernels are deterministic)"),
    Case("exact+bf16-state", ("--cache-policy", "exact", "--mamba-ssm-dtype", "bfloat16"), "must stay fp32"),
    Case("scr+fp8-kv", ("--cache-policy", "scr", "--kv-cache-dtype", "fp8_e4m3"),
         "--kv-cache-dtype fp8_e4m3: SCR re-rotates relocated keys"),
)


def attempt(case: Case, model_dir, log_dir, timeout_s: float = TIMEOUT_S) -> dict:
    """Run the launcher with ``case``'s flags until it exits (or serves, or times out)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"refusal-{case.name}.log"
    cmd = [sys.executable, "-m", "patches.launch_server", "--model-path", str(model_dir), "--port", str(free_port()),
           *case.args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    served = False
    while process.poll() is None and time.monotonic() - started < timeout_s:
        if READY_LINE in log_path.read_text(errors="replace"):
            served = True
            break
        time.sleep(0.5)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    text = log_path.read_text(errors="replace")
    return {"status": None if served or process.returncode < 0 else process.returncode, "served": served,
            "seconds": round(time.monotonic() - started, 1), "message": _message(text), "log": str(log_path),
            "found": case.needle.lower() in text.lower()}


def _message(text: str) -> str:
    """The launcher's error lines (what a user would read)."""
    lines = [line.strip() for line in text.splitlines() if "error:" in line or line.strip().startswith("- ")]
    return " | ".join(lines)[:600]


def run(ctx):
    checks = Checks()
    cases = [c for c in CASES if ctx.cuda or not c.cuda_only]
    skipped = [c for c in CASES if c not in cases]
    model_dir, log_dir = ctx.model_dir(), ctx.log_dir
    with ThreadPoolExecutor(len(cases) if ctx.cuda else 1) as pool:
        outcomes = list(pool.map(lambda c: attempt(c, model_dir, log_dir), cases))
    for case, outcome in zip(cases, outcomes):
        checks.note(case.name, outcome)
        what = "served instead" if outcome["served"] else f"exit status {outcome['status']}"
        checks.expect(outcome["status"] == REFUSAL_STATUS and not outcome["served"],
                      f"{case.name}: refused with status 2 before serving ({what}, {outcome['seconds']} s)")
        checks.expect(outcome["found"], f"{case.name}: the message names {case.needle!r}: {outcome['message'] or '(none)'}")
    for case in skipped:
        checks.note(case.name, {"skipped": case.cuda_only})
    summary = f"{len(cases)} refusals held"
    if skipped:
        summary += f"; not on CPU: {', '.join(c.name for c in skipped)}"
    return checks.result("refusals", summary)
