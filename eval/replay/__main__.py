"""``python -m eval.replay``: see ``eval/replay/__init__.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from eval.cli_types import Parser, failed, int_at_least, run_main

PROG = "python -m eval.replay"


def main(argv: list[str] | None = None) -> int:
    from eval.replay.run import DEFAULT_RUN, Mismatch, ServerError, run_replay

    parser = Parser(prog=PROG, description="Replay a trace against a loopback server with forced decoding "
                    "(eval/replay/__init__.py).\n\nExit status: 0 done, 1 the server's ids differ from the trace "
                    "or it failed a call, 2 a usage error (flags, trace file, server address).")
    parser.add_server()
    parser.add_argument("--trace", type=Path, required=True, metavar="FILE", help="trace file (eval/traces/format.py)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (client.jsonl)")
    parser.add_argument("--run-id", default=DEFAULT_RUN, metavar="NAME",
                        help="rid prefix; give the same one to resume a run")
    parser.add_argument("--concurrency", type=int_at_least(1), default=1, metavar="N", help="conversations in flight")
    parser.add_argument("--router", action="store_true",
                        help="--server is sglang-router in front of several servers (python -m eval.cluster): "
                             "send the forced ids in the field the router keeps, and x-smg-routing-key: "
                             "<run-id>.<conversation> with every call so the router (manual policy) keeps each "
                             "conversation on one server")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, one line printed)
        return int(exc.code or 0)

    def body() -> int:
        result = run_replay(args.server, args.trace, args.out, args.run_id, args.concurrency,
                            router=args.router)
        print(f"{result['sent']} calls sent, {result['skipped']} already done, {result['total']} in the trace "
              f"-> {result['client']}")
        return 0

    # a UsageError (eval.fidelity's, raised by the address checks) -> 2
    return run_main(PROG, body, failed(Mismatch), failed(ServerError, label="server error"))


if __name__ == "__main__":
    sys.exit(main())
