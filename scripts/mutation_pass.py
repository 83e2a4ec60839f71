#!/usr/bin/env python
"""Mutation pass over policy/, exact_cache/, scr/, eval/accounting/, serving/, eval/chaos/ and the
deciding modules of patches/ and eval/replay/ (``tests.mutation.runner.TARGETS``; not in CI).

Plants one bug at a time in a copy of the repository and runs the unit, reference and integration
tests (no server) that import the mutated module; a mutant the tests still pass is a survivor.
The logic is in ``tests/mutation/``; how to run it and the last runs' results are in
``docs/mutation.md``.

    .venv/bin/python scripts/mutation_pass.py --max-per-module 16 --seed 0 --jobs 1
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.mutation.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
