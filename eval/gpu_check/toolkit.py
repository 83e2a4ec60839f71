"""The CUDA toolkit SGLang 0.5.16's JIT kernels compile with, found the way they find it.

On CUDA, SGLang builds some kernels on first use (``silu_and_mul`` of every MLP among them:
``sglang.jit_kernel`` through tvm-ffi's ``cpp.extension``) with ``nvcc``, and has no fallback: a box
with the driver but without the toolkit serves nothing. tvm-ffi looks for the toolkit in
``$CUDA_HOME``, then ``$CUDA_PATH``, then the folder above the ``nvcc`` on ``PATH``, then
``/usr/local/cuda``; ``cuda_home`` follows the same order. The toolkit's major version must be
torch's (SGLang 0.5.16's torch 2.11.0 wheel is built with CUDA 13.0). ``scripts/setup_env.sh``
makes the same check in bash before a GPU install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Callable, Mapping

DEFAULT_HOME = "/usr/local/cuda"
INSTALL_HINT = ("install NVIDIA's CUDA Toolkit {major} (for example the cuda-toolkit-{major}-0 package from NVIDIA's "
                "apt repository, or start from an nvidia/cuda:{major}.0.x-devel image) and export "
                "CUDA_HOME=/usr/local/cuda-{major}.0 (docs/gpu.md, 'Install')")
_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def cuda_home(env: Mapping[str, str], which: Callable[[str], str | None] = shutil.which) -> tuple[str, str]:
    """(the toolkit folder tvm-ffi would use, how it was found)."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            return env[name], f"${name}"
    nvcc = which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc)), "nvcc on PATH"
    return DEFAULT_HOME, "the default " + DEFAULT_HOME


def nvcc_release(text: str) -> str | None:
    """``13.0`` from ``nvcc --version``'s ``Cuda compilation tools, release 13.0, V13.0.48``."""
    found = _RELEASE.search(text)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def problem(home: str, how: str, release: str | None, torch_cuda: str | None) -> str | None:
    """Why the JIT kernels cannot be built (None when they can), with what to install."""
    major = (torch_cuda or "13.0").split(".")[0]
    hint = INSTALL_HINT.format(major=major)
    if release is None:
        return f"no CUDA toolkit: no working nvcc at {home}/bin/nvcc ({how}); SGLang compiles its JIT kernels with it: {hint}"
    if release.split(".")[0] != major:
        return (f"the CUDA toolkit at {home} ({how}) is {release}, torch is built with CUDA {torch_cuda}: "
                f"SGLang's JIT kernels would not load; {hint}")
    return None


def find(env: Mapping[str, str] | None = None, torch_cuda: str | None = None) -> dict:
    """The toolkit on this machine: home, how found, nvcc's release, and the problem if any."""
    env = os.environ if env is None else env
    home, how = cuda_home(env)
    nvcc = os.path.join(home, "bin", "nvcc")
    release = None
    if os.access(nvcc, os.X_OK):
        try:
            answer = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
            release = nvcc_release(answer.stdout)
        except (OSError, subprocess.TimeoutExpired):
            release = None
    return {"home": home, "how": how, "nvcc_release": release, "problem": problem(home, how, release, torch_cuda)}
