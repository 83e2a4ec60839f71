#!/usr/bin/env bash
# Set up (or update) .venv, generate the default BCP-shaped CLM trace set (10 questions, seed 0, Qwen tokens),
# and replay it under radix, exact and scr on the long-context tiny model, one server at a time:
# side-by-side table in runs/bench/table.md. Run it alone on the machine (see README).
# Extra arguments go to `python -m eval.bench_policies` (e.g. --questions 20 --concurrency 8).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$ROOT/.venv/bin/python" -m eval.bench_policies "$@"
