#!/usr/bin/env bash
# Set up (or update) .venv, then run the tests. `.ci/run` calls exactly this, with no arguments.
# The set-up keeps the venv's mode (a GPU=1 install stays a GPU install; scripts/setup_env.sh).
#
#   scripts/test.sh               the whole suite (CI): unit, reference, integration, engine
#   scripts/test.sh --fast        unit + reference tiers only: no SGLang server, about a minute
#   scripts/test.sh ARGS...       ARGS go to pytest, e.g. `scripts/test.sh tests/unit -x`
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The suite is the CPU suite, also on a GPU box: with a GPU visible, SGLang and torch take their
# CUDA paths and the CPU expectations fail. The GPU check is scripts/gpu_check.sh.
# tests/conftest.py does the same for a plain `pytest`; CACHE_POLICY_TESTS_SEE_GPU=1 opts out of both.
if [ "${CACHE_POLICY_TESTS_SEE_GPU:-0}" != 1 ]; then
  export CUDA_VISIBLE_DEVICES=""
fi
if [ "$#" -eq 0 ]; then
  set -- tests
elif [ "$1" = "--fast" ]; then
  shift
  set -- tests/unit tests/reference "$@"
fi
exec "${VENV:-$ROOT/.venv}/bin/python" -m pytest -q -p no:cacheprovider --durations=25 "$@"
