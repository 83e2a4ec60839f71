"""``python -m eval.offline``: see ``eval/offline/run.py``."""

import sys

from eval.offline.run import main

if __name__ == "__main__":
    sys.exit(main())
