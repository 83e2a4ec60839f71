#!/usr/bin/env bash
# Set up (or update) .venv, then run the whole test suite. `.ci/run` calls exactly this.
# Extra arguments go to pytest, e.g. `scripts/test.sh tests/unit -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider --durations=10 "$@"
