#!/usr/bin/env python
"""Build the tiny hybrid test model:
``python scripts/make_tiny_model.py OUT_DIR [--seed N] [--max-positions N] [--vocab-size N] [--no-check]``.

Thin entry point; the builder is ``eval/tiny_model.py``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.tiny_model import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
