#!/usr/bin/env bash
# Create or update .venv with everything the project needs; safe to run repeatedly.
#
#   scripts/setup_env.sh          CPU install (default): CPU torch, sglang==0.5.16 --no-deps,
#                                 the pinned CPU dependency list, this project (editable).
#   GPU=1 scripts/setup_env.sh    GPU install: the full sglang==0.5.16 (CUDA torch 2.11.0 etc.).
#
# Skips the install when requirements and pyproject are unchanged since the last run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

MODE=cpu; [ "${GPU:-0}" = "1" ] && MODE=gpu
STAMP="$VENV/.cache-policy-setup"
WANT="$MODE $(cat "$ROOT/pyproject.toml" "$ROOT"/requirements/*.txt "$ROOT/scripts/setup_env.sh" | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] $VENV is up to date ($MODE)"
  exit 0
fi

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
  pip_install sglang==0.5.16 pytest
  pip_install -r "$ROOT/requirements/eval.txt"
fi
echo "[setup] installing the overlay's own run-time dependencies"
pip_install --no-deps -r "$ROOT/requirements/overlay.txt"
echo "[setup] installing this project (editable)"
pip_install --no-deps --no-build-isolation -e "$ROOT"

# The torchvision stand-in must be in place before anything imports sglang, in every process
# (spawned schedulers included); a .pth line runs at interpreter start. No-op where torchvision exists.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import patches.cpu.preimport" > "$SITE/zz_cache_policy_preimport.pth"

"$VENV/bin/python" -c "import sglang, patches.plugin; print('[setup] sglang', sglang.__version__, 'ready')"
echo "$WANT" > "$STAMP"
