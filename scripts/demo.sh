#!/usr/bin/env bash
# Set up (or update) .venv, build the tiny model, serve it with the patched server, run a short
# multi-turn conversation with an edit in the middle, and print what the cache did per request.
# Extra arguments go to `python -m eval.demo` (e.g. --policies radix,scr --out DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$ROOT/.venv/bin/python" -m eval.demo "$@"
