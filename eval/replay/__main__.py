"""``python -m eval.replay``: see ``eval/replay/__init__.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from eval.cli_types import Parser, int_at_least

PROG = "python -m eval.replay"


def main(argv: list[str] | None = None) -> int:
    from eval.replay.run import DEFAULT_RUN, Mismatch, ServerError, UsageError, run_replay

    parser = Parser(prog=PROG, description="Replay a trace against a loopback server with forced decoding "
                    "(eval/replay/__init__.py).\n\nExit status: 0 done, 1 the server's ids differ from the trace "
                    "or it failed a call, 2 a usage error (flags, trace file, server address).")
    parser.add_argument("--server", required=True, metavar="URL", help="loopback base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--trace", type=Path, required=True, metavar="FILE", help="trace file (eval/traces/format.py)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (client.jsonl)")
    parser.add_argument("--run-id", default=DEFAULT_RUN, metavar="NAME",
                        help="rid prefix; give the same one to resume a run")
    parser.add_argument("--concurrency", type=int_at_least(1), default=1, metavar="N", help="conversations in flight")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, one line printed)
        return int(exc.code or 0)
    try:
        result = run_replay(args.server, args.trace, args.out, args.run_id, args.concurrency)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except Mismatch as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except ServerError as exc:
        print(f"{PROG}: server error: {exc}", file=sys.stderr)
        return 1
    print(f"{result['sent']} calls sent, {result['skipped']} already done, {result['total']} in the trace "
          f"-> {result['client']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
