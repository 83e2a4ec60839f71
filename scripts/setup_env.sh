#!/usr/bin/env bash
# Create or update .venv with everything the project needs; safe to run repeatedly.
#
#   GPU=0 scripts/setup_env.sh    CPU install: CPU torch, sglang==0.5.16 --no-deps,
#                                 the pinned CPU dependency list, this project (editable).
#   GPU=1 scripts/setup_env.sh    GPU install: the full sglang==0.5.16 (CUDA torch 2.11.0 etc.); needs the
#                                 CUDA 13 toolkit for SGLang's JIT kernels. Both modes install requirements/test.txt.
#   scripts/setup_env.sh          the mode the venv was installed in last (its stamp); CPU if none.
#
# The mode is sticky because scripts/test.sh calls this script without GPU: a plain default of
# CPU would reinstall CPU torch 2.13 over a GPU install's CUDA torch 2.11 on every test run.
#
# Environment: VENV (default .venv), PYTHON (the interpreter for a new venv; must be CPython
# 3.11, as pyproject.toml requires), SETUP_ENV_DRY_RUN=1 (print `mode=M python=P` after the
# checks and exit 0, installing nothing). Exit 2: a bad setting, a wrong Python, or (GPU mode)
# no NVIDIA driver new enough.
#
# Skips the install when requirements and pyproject are unchanged since the last run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
STAMP="$VENV/.cache-policy-setup"
NEED_PY="3.11"
# SGLang 0.5.16 pins torch==2.11.0, and PyPI's torch 2.11.0 (what `pip install sglang` gets) is
# a CUDA 13.0 build, as are its cu13 pins (flashinfer_python[cu13], nvidia-cutlass-dsl[cu13],
# cuda-python>=13.0). NVIDIA's CUDA compatibility guide: CUDA 13.x needs driver >= 580.
MIN_DRIVER=580

die() {
  echo "[setup] error: $*" >&2
  exit 2
}

# SGLang 0.5.16's torch 2.11.0 is a CUDA 13.0 build: the toolkit that compiles SGLang's JIT kernels must be 13.x.
TORCH_CUDA_MAJOR=13
check_cuda_toolkit() { # sets TOOLKIT_HOME, _HOW, _RELEASE and TOOLKIT_PROBLEM ("" when the toolkit is usable)
  TOOLKIT_HOME="${CUDA_HOME:-${CUDA_PATH:-}}" TOOLKIT_HOW='$CUDA_HOME/$CUDA_PATH' TOOLKIT_RELEASE="" TOOLKIT_PROBLEM=""
  if [ -z "$TOOLKIT_HOME" ]; then
    if command -v nvcc >/dev/null 2>&1; then
      TOOLKIT_HOME="$(dirname "$(dirname "$(command -v nvcc)")")" TOOLKIT_HOW="nvcc on PATH"
    else
      TOOLKIT_HOME=/usr/local/cuda TOOLKIT_HOW="the default /usr/local/cuda"
    fi
  fi
  local hint="install NVIDIA's CUDA Toolkit $TORCH_CUDA_MAJOR (for example the cuda-toolkit-$TORCH_CUDA_MAJOR-0 package from NVIDIA's apt repository, or start from an nvidia/cuda:$TORCH_CUDA_MAJOR.0.x-devel image) and export CUDA_HOME=/usr/local/cuda-$TORCH_CUDA_MAJOR.0 (docs/gpu.md, 'Install')"
  if [ -x "$TOOLKIT_HOME/bin/nvcc" ]; then
    # No `| head` here or below: under pipefail a reader that exits early can SIGPIPE the writer
    # (exit 141 under load, seen in the set-up tests); sed reads everything, bash keeps the first line.
    TOOLKIT_RELEASE="$("$TOOLKIT_HOME/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')" || true
    TOOLKIT_RELEASE="${TOOLKIT_RELEASE%%$'\n'*}"
  fi
  if [ -z "$TOOLKIT_RELEASE" ]; then
    TOOLKIT_PROBLEM="no CUDA toolkit: no working nvcc at $TOOLKIT_HOME/bin/nvcc ($TOOLKIT_HOW); SGLang compiles its JIT kernels with it: $hint"
  elif [ "${TOOLKIT_RELEASE%%.*}" != "$TORCH_CUDA_MAJOR" ]; then
    TOOLKIT_PROBLEM="the CUDA toolkit at $TOOLKIT_HOME ($TOOLKIT_HOW) is $TOOLKIT_RELEASE, torch is built with CUDA $TORCH_CUDA_MAJOR.0: SGLang's JIT kernels would not load; $hint"
  fi
}

case "${SETUP_ENV_DRY_RUN:-0}" in
  0 | 1) ;;
  *) die "SETUP_ENV_DRY_RUN=$SETUP_ENV_DRY_RUN: expected 1 (check and print, install nothing) or 0" ;;
esac

# ---- mode: GPU=1 / GPU=0 win; otherwise keep what the venv has (the stamp's first word).
STAMP_MODE=""
if [ -f "$STAMP" ]; then
  read -r STAMP_MODE _ <"$STAMP" || true
fi
case "${GPU:-}" in
  1) MODE=gpu WHY="GPU=1" ;;
  0) MODE=cpu WHY="GPU=0" ;;
  "")
    if [ "$STAMP_MODE" = gpu ] || [ "$STAMP_MODE" = cpu ]; then
      MODE=$STAMP_MODE WHY="GPU unset; $VENV was installed in $STAMP_MODE mode; GPU=1 or GPU=0 switches"
    else
      MODE=cpu WHY="GPU unset and no earlier install in $VENV"
    fi
    ;;
  *) die "GPU=$GPU: expected 1 (GPU install), 0 (CPU install), or unset (keep the venv's mode)" ;;
esac
echo "[setup] mode: $MODE ($WHY)"

# ---- Python: CPython 3.11 (pyproject.toml: requires-python >=3.11,<3.12).
# Prints e.g. "CPython 3.11.7"; fails when the interpreter does not run.
py_identity() {
  "$1" -c 'import platform, sys; print(platform.python_implementation(), "%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}
is_wanted_python() { # $1: the identity line
  local impl version
  read -r impl version <<<"$1"
  [ "$impl" = CPython ] && [ "${version%.*}" = "$NEED_PY" ]
}

if [ -e "$VENV/bin/python" ] || [ -L "$VENV/bin/python" ]; then
  # The venv's interpreter is the one that matters; PYTHON only picks the one for a new venv.
  PY="$VENV/bin/python"
  FOUND="$(py_identity "$PY")" || die "$PY does not run (its base interpreter was removed?); remove the venv (rm -rf $VENV) and run again"
  is_wanted_python "$FOUND" ||
    die "$VENV was made with $FOUND, but this project needs CPython $NEED_PY; remove it (rm -rf $VENV) and run again, with PYTHON=/path/to/python$NEED_PY if python$NEED_PY is not on PATH"
  NEW_VENV=0
else
  if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON" HOW="PYTHON=$PYTHON"
    command -v "$PY" >/dev/null 2>&1 || die "PYTHON=$PYTHON: no such interpreter; point it at a CPython $NEED_PY (e.g. PYTHON=/usr/bin/python$NEED_PY)"
  elif command -v "python$NEED_PY" >/dev/null 2>&1; then
    PY="python$NEED_PY" HOW="python$NEED_PY on PATH"
  elif command -v python3 >/dev/null 2>&1; then
    PY=python3 HOW="python3 on PATH (no python$NEED_PY)"
  else
    die "no python$NEED_PY or python3 on PATH; install CPython $NEED_PY, or set PYTHON=/path/to/python$NEED_PY"
  fi
  FOUND="$(py_identity "$PY")" || die "$PY ($HOW) does not run; install CPython $NEED_PY, or set PYTHON=/path/to/python$NEED_PY"
  is_wanted_python "$FOUND" ||
    die "$PY ($HOW) is $FOUND, but this project needs CPython $NEED_PY (pyproject.toml: >=3.11,<3.12); install Python $NEED_PY, or set PYTHON=/path/to/python$NEED_PY"
  NEW_VENV=1
fi

# ---- GPU mode: a driver that runs CUDA 13 before minutes of downloads that could not work.
if [ "$MODE" = gpu ]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    die "GPU mode needs an NVIDIA driver >= $MIN_DRIVER (SGLang 0.5.16 installs CUDA 13 torch 2.11.0), but nvidia-smi is not on PATH; install the driver, or use GPU=0 for the CPU install"
  SMI_OUT="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1)" ||
    die "nvidia-smi failed, so no driver version to check (needs >= $MIN_DRIVER): $(printf '%s\n' "$SMI_OUT" | sed -n 1,3p | tr '\n' ' ')"
  DRIVER="${SMI_OUT%%$'\n'*}"  # the first GPU's line (no `| head`: see check_cuda_toolkit)
  DRIVER="${DRIVER//[$' \r']/}"
  DRIVER_MAJOR="${DRIVER%%.*}"
  [[ "$DRIVER_MAJOR" =~ ^[0-9]+$ ]] ||
    die "could not read a driver version from nvidia-smi (got '$DRIVER'; needs >= $MIN_DRIVER)"
  [ "$DRIVER_MAJOR" -ge "$MIN_DRIVER" ] ||
    die "NVIDIA driver $DRIVER is too old: SGLang 0.5.16's torch 2.11.0 is a CUDA 13 build, which needs driver >= $MIN_DRIVER; upgrade the driver (docs/gpu.md)"
  echo "[setup] NVIDIA driver $DRIVER (>= $MIN_DRIVER: CUDA 13 runs)"
  # The CUDA toolkit SGLang's JIT kernels compile with on first use (nvcc through tvm-ffi, no
  # fallback). Looked for as tvm-ffi does (eval/gpu_check/toolkit.py): $CUDA_HOME, $CUDA_PATH, the
  # nvcc on PATH, /usr/local/cuda. An explicit GPU=1 install stops without it; the sticky mode of
  # scripts/test.sh (the CPU suite, which compiles nothing) only warns.
  check_cuda_toolkit
  if [ -n "$TOOLKIT_PROBLEM" ]; then
    [ "${GPU:-}" = 1 ] && die "$TOOLKIT_PROBLEM"
    echo "[setup] warning: $TOOLKIT_PROBLEM (the CPU suite does not need it; a server on the GPU does)" >&2
  else
    echo "[setup] CUDA toolkit $TOOLKIT_RELEASE at $TOOLKIT_HOME ($TOOLKIT_HOW)"
  fi
fi

if [ "${SETUP_ENV_DRY_RUN:-0}" = 1 ]; then
  echo "mode=$MODE python=$PY"
  exit 0
fi

WANT="$MODE $(cat "$ROOT/pyproject.toml" "$ROOT"/requirements/*.txt "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"
if [ "$NEW_VENV" = 1 ]; then
  echo "[setup] creating $VENV with $PY ($FOUND)"
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] $VENV is up to date ($MODE)"
  exit 0
fi
# The mode goes into the stamp before the install: an interrupted GPU install stays in GPU mode
# on the next plain run (the stale hash still forces the install to be redone).
echo "$MODE installing" >"$STAMP"

PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# pip warns once per package about this machine's local index folders; keep the real messages.
pip_install() {
  "${PIP[@]}" "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
}
if [ "$MODE" = cpu ]; then
  echo "[setup] installing CPU torch 2.13.0"
  pip_install torch==2.13.0
  echo "[setup] installing sglang 0.5.16 (--no-deps) and the pinned CPU dependency list"
  pip_install --no-deps -r "$ROOT/requirements/cpu-top.txt"
  pip_install --no-deps -r "$ROOT/requirements/cpu-deps.txt"
  echo "[setup] installing the evaluation extras (BM25, plots)"
  pip_install --no-deps -r "$ROOT/requirements/eval.txt"
else
  echo "[setup] installing sglang 0.5.16 with its CUDA dependencies"
  pip_install sglang==0.5.16
  pip_install -r "$ROOT/requirements/eval.txt"
fi
# One list for both modes, so the GPU install can run the CPU suite (tests/unit/test_install_lists.py).
echo "[setup] installing what the test suite needs (requirements/test.txt)"
if [ "$MODE" = cpu ]; then
  pip_install --no-deps -r "$ROOT/requirements/test.txt"
else
  pip_install -r "$ROOT/requirements/test.txt"
fi
echo "[setup] installing the overlay's own run-time dependencies"
pip_install --no-deps -r "$ROOT/requirements/overlay.txt"
echo "[setup] installing this project (editable)"
pip_install --no-deps --no-build-isolation -e "$ROOT"

# The torchvision stand-in must be in place before anything imports sglang, in every process
# (spawned schedulers included); a .pth line runs at interpreter start. No-op where torchvision exists.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import patches.cpu.preimport" >"$SITE/zz_cache_policy_preimport.pth"

"$VENV/bin/python" -c "import sglang, patches.plugin; print('[setup] sglang', sglang.__version__, 'ready')"
echo "$WANT" >"$STAMP"
