"""``python -m eval.replay``: see ``eval/replay/__init__.py``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eval.cli_types import int_at_least

PROG = "python -m eval.replay"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and status 2), like the other errors."""

    def error(self, message: str):
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    from eval.replay.run import DEFAULT_RUN, Mismatch, ServerError, UsageError, run_replay

    parser = _Parser(prog=PROG, description="Replay a trace against a loopback server with forced decoding.")
    parser.add_argument("--server", required=True, help="loopback base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--trace", type=Path, required=True, help="trace file (eval/traces/format.py)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (client.jsonl)")
    parser.add_argument("--run", default=DEFAULT_RUN, help=f"rid prefix (default {DEFAULT_RUN}); resume with the same")
    parser.add_argument("--concurrency", type=int_at_least(1), default=1, help="conversations in flight (default 1)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, one line printed)
        return int(exc.code or 0)
    try:
        result = run_replay(args.server, args.trace, args.out, args.run, args.concurrency)
    except (UsageError, Mismatch) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"{PROG}: server error: {exc}", file=sys.stderr)
        return 1
    print(f"{result['sent']} calls sent, {result['skipped']} already done, {result['total']} in the trace "
          f"-> {result['client']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
