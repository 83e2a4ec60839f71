#!/usr/bin/env bash
# Set up (or update) .venv, then run the tests. `.ci/run` calls exactly this, with no arguments.
#
#   scripts/test.sh               the whole suite (CI): unit, reference, integration, engine
#   scripts/test.sh --fast        unit + reference tiers only: no SGLang server, about a minute
#   scripts/test.sh ARGS...       ARGS go to pytest, e.g. `scripts/test.sh tests/unit -x`
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$#" -eq 0 ]; then
  set -- tests
elif [ "$1" = "--fast" ]; then
  shift
  set -- tests/unit tests/reference "$@"
fi
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider --durations=25 "$@"
