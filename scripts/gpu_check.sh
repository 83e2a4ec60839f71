#!/usr/bin/env bash
# The 10-minute end-to-end check on one GPU with the tiny model, no downloads (docs/gpu.md,
# "The 10-minute check"). Uses the existing .venv (a GPU install: GPU=1 scripts/setup_env.sh).
#   scripts/gpu_check.sh                      the check on CUDA; report and logs in runs/gpu_check
#   scripts/gpu_check.sh --device cpu         a dry run of the same steps on CPU
#   scripts/gpu_check.sh --only rotary,scr    some steps; --quick: fewer cases; --out DIR
# Exit status 1 when any step failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "gpu_check: no .venv; run GPU=1 scripts/setup_env.sh first" >&2
  exit 2
fi
# shellcheck disable=SC1091
source "$ROOT/.venv/bin/activate"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m eval.gpu_check "$@"
