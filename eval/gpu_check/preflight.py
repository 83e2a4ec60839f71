"""Preflight: is this the machine the rest of the check assumes?

The driver (``nvidia-smi``), torch seeing the GPU, the torch and Triton versions, the CUDA toolkit
SGLang's JIT kernels need (``toolkit.py``), SGLang importing at the pinned 0.5.16 (``serving/versions.py``; the overlay patches its internals and refuses any
other), all three imported by a fresh interpreter, and the tiny-model builder producing its model
offline. No GPU or no SGLang blocks the later steps: they would only fail for the same reason,
slower.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

from eval.gpu_check import toolkit
from eval.gpu_check.report import Checks
from serving.versions import PINNED, VersionMismatch, check_pins

MIN_DRIVER = 580  # CUDA 13 (SGLang 0.5.16's torch 2.11 wheel), docs/gpu.md "Install"


def driver(checks: Checks) -> None:
    try:
        answer = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total",
                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        checks.expect(False, f"nvidia-smi runs: {exc}")
        return
    line = answer.stdout.strip().splitlines()[0] if answer.stdout.strip() else ""
    checks.note("nvidia_smi", line or answer.stderr.strip())
    if not checks.expect(answer.returncode == 0 and line, f"nvidia-smi answers: {line or answer.stderr.strip()}"):
        return
    version = line.split(",")[0].strip()
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    checks.expect(major >= MIN_DRIVER, f"driver {version} >= {MIN_DRIVER}")


# Run in a fresh interpreter, as a server's processes import them: what this check's own process
# has imported (or not) cannot hide a broken install, and no CUDA context is held here.
PROBE = """
import json, sys
facts = {}
try:
    import torch
    facts["torch"] = torch.__version__
    facts["torch_cuda"] = torch.version.cuda
    facts["cuda_available"] = torch.cuda.is_available()
    if facts["cuda_available"]:
        facts["gpu"] = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                        "capability": list(torch.cuda.get_device_capability(0))}
except Exception as exc:
    facts["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    import triton
    facts["triton"] = triton.__version__
except Exception as exc:
    facts["triton_error"] = f"{type(exc).__name__}: {exc}"
try:
    import sglang
    facts["sglang"] = sglang.__version__
except Exception as exc:
    facts["sglang_error"] = f"{type(exc).__name__}: {exc}"
print("PROBE " + json.dumps(facts))
"""


def probe(timeout_s: float = 180) -> dict:
    """torch, Triton and SGLang as a fresh interpreter finds them."""
    answer = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
    for line in answer.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[len("PROBE "):])
    return {"probe_error": (answer.stderr or answer.stdout).strip()[-500:] or f"exit status {answer.returncode}"}


def check_probe(checks: Checks, facts: dict, cuda: bool) -> tuple[bool, bool]:
    """Returns (the device is usable, SGLang imports at the pin)."""
    for key in ("torch", "torch_cuda", "gpu", "triton", "sglang"):
        if key in facts:
            checks.note(key, facts[key])
    if not checks.expect("probe_error" not in facts, f"the import probe ran: {facts.get('probe_error', 'yes')}"):
        return False, False
    checks.expect("torch" in facts, f"torch imports: {facts.get('torch', facts.get('torch_error'))}")
    device_ok = True
    if cuda:
        device_ok = bool(facts.get("cuda_available"))
        checks.expect(device_ok, f"torch {facts.get('torch')} sees a GPU (cuda {facts.get('torch_cuda')})")
    checks.expect("triton" in facts, f"triton imports: {facts.get('triton', facts.get('triton_error'))}")
    sglang_ok = "sglang" in facts
    if sglang_ok:
        try:
            check_pins({"sglang": facts["sglang"]})
        except VersionMismatch as exc:
            sglang_ok = False
            checks.expect(False, str(exc))
    else:
        checks.expect(False, f"sglang imports: {facts.get('sglang_error')}")
    if sglang_ok:
        checks.expect(True, f"sglang {facts['sglang']} imports (pinned {PINNED['sglang']})")
    for name in ("transformers", "flashinfer-python", "sglang-kernel"):  # 0.5.16's kernel wheel (not sgl-kernel)
        try:
            checks.note(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            checks.note(name, None)
    return device_ok, sglang_ok


def cuda_toolkit(checks: Checks, torch_cuda: str | None) -> bool:
    """The toolkit SGLang's JIT kernels compile with, where they look for it (``toolkit.py``)."""
    found = toolkit.find(torch_cuda=torch_cuda)
    checks.note("cuda_toolkit", found)
    return checks.expect(found["problem"] is None, found["problem"] or
                         f"CUDA toolkit {found['nvcc_release']} at {found['home']} ({found['how']}) for SGLang's JIT kernels")


def builder(checks: Checks, ctx) -> None:
    path = ctx.model_dir()
    checks.note("model_dir", str(path))
    checks.expect((path / "config.json").exists() and (path / "model.safetensors").exists(),
                  f"the tiny-model builder produced {path.name}")


def run(ctx):
    checks = Checks()
    if ctx.cuda:
        driver(checks)
    facts = probe()
    device_ok, sglang_ok = check_probe(checks, facts, ctx.cuda)
    toolkit_ok = cuda_toolkit(checks, facts.get("torch_cuda")) if ctx.cuda else True
    builder(checks, ctx)
    if not device_ok:
        ctx.blocked = "preflight: torch sees no GPU"
    elif not sglang_ok:
        ctx.blocked = "preflight: SGLang does not import at the pinned version"
    elif not toolkit_ok:
        ctx.blocked = "preflight: no usable CUDA toolkit, so SGLang cannot build its JIT kernels and no server would start"
    facts = checks.data
    summary = ", ".join(f"{k} {facts[k]}" for k in ("sglang", "torch", "triton") if facts.get(k))
    if ctx.cuda and facts.get("gpu"):
        summary = f"{facts['gpu']['name']}, driver {str(facts.get('nvidia_smi', '?')).split(',')[0]}, " + summary
    return checks.result("preflight", summary + ("" if ctx.cuda else " (CPU: no driver or GPU to check)"))
