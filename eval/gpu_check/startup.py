"""Start-up, once and untimed: what every server of the check goes through before it serves.

1. SGLang 0.5.16's own model-config and tokenizer/processor loading of the tiny model, from the
   defaults a CUDA server starts with (``python -m patches.text_only MODEL``, in a fresh
   interpreter: ``eval/`` does not import ``patches/``). On CUDA SGLang serves the Qwen3.5/3.6
   architecture as multimodal and dies building an image processor the tiny checkpoint has no
   config for; the overlay serves a checkpoint without processor configs text-only. This runs on
   CPU too, so the dry run exercises the CUDA branch.
2. On CUDA, one server (radix, the serving profile, bf16) and one request: SGLang compiles its
   JIT kernels with nvcc on first use and Triton compiles its kernels on first launch, both into
   on-disk caches the later servers reuse, so no timed step pays for compilation. This first start
   gets ``FIRST_START_TIMEOUT_S``; every later server ``servers.STARTUP_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from eval.gpu_check import servers
from eval.gpu_check.exact_cases import prompt_ids
from eval.gpu_check.report import Checks

# nvcc builds of SGLang's JIT modules take 20-60 s each on a first start, plus Triton's compilations
# and loading: generous, and outside the 10-minute budget (the step is untimed).
FIRST_START_TIMEOUT_S = 900.0
RESULT_PREFIX = "TEXT_ONLY_RESULT "  # patches/text_only.py prints its one JSON line after it
LOAD_TIMEOUT_S = 300


def sglang_loads_the_model(model_dir) -> dict:
    """``python -m patches.text_only MODEL``'s JSON line (or why there is none)."""
    answer = subprocess.run([sys.executable, "-m", "patches.text_only", str(model_dir)], capture_output=True,
                            text=True, timeout=LOAD_TIMEOUT_S)
    for line in answer.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return {"loads": False, "error": (answer.stderr or answer.stdout).strip()[-500:] or f"exit {answer.returncode}"}


def run(ctx):
    checks = Checks()
    loaded = sglang_loads_the_model(ctx.model_dir())
    checks.note("model_config", loaded)
    checks.expect(loaded.get("loads") is True and loaded.get("is_multimodal") is False,
                  "SGLang's model config serves the tiny model text-only and the tokenizer manager and scheduler load "
                  f"its tokenizer from a CUDA server's defaults: {loaded.get('tokenizer_manager', loaded.get('error'))}")
    if not ctx.cuda:
        return checks.result("startup", "text-only model config loads (CPU: no JIT kernels to build, no warm-up server)")
    args = ["--cache-policy", "radix", "--serving-profile", "matched"]
    with servers.serving(ctx, "warm-up", args, total_tokens=4096, startup_timeout=FIRST_START_TIMEOUT_S) as server:
        answer = server.generate(prompt_ids(3, 200), 4, rid="warm-up.1")
        servers.check_clean_log(checks, server)
    checks.expect(bool(answer), "the warm-up server answered one request (JIT and Triton kernels built)")
    return checks.result("startup", "text-only model config loads; JIT and Triton kernels built by one untimed server")
