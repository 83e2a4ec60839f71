"""``python -m eval.fidelity``: see ``eval/fidelity/__init__.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from eval.cli_types import Parser, failed, int_at_least, run_main, usage

PROG = "python -m eval.fidelity"


def main(argv: list[str] | None = None) -> int:
    from eval.fidelity import ScenarioError, ServerError, load_scenarios, run_fidelity
    from eval.fidelity.run import DEFAULT_TOKENS, DEFAULT_TOP

    parser = Parser(prog=PROG, description="How far scr answers are from a cold read (eval/fidelity/__init__.py).\n\n"
                    "Exit status: 0 every check passed, 1 a check failed or the server failed a request, "
                    "2 a usage error (flags, scenario file, server address).")
    parser.add_server()
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument("--scenarios", type=Path, default=None, metavar="FILE",
                        help="scenario JSON file (default: the built-in set)")
    parser.add_argument("--events", type=Path, default=None, metavar="FILE",
                        help="the server's --cache-events file (without it the moved share is unknown)")
    parser.add_argument("--tokens", type=int_at_least(1), default=DEFAULT_TOKENS, metavar="N",
                        help="greedy tokens per request")
    parser.add_argument("--top", type=int_at_least(1), default=DEFAULT_TOP, metavar="K",
                        help="top-K logprobs per position for the KL")
    args = parser.parse_args(argv)

    def body() -> int:
        scenarios = load_scenarios(args.scenarios) if args.scenarios is not None else None
        summary = run_fidelity(args.server, args.out, scenarios, args.events, args.tokens, args.top)
        print(summary["markdown"])
        print(f"-> {', '.join(summary['files'])}")
        for warning in summary["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        for failure in summary["checks_failed"]:
            print(f"CHECK FAILED {failure}", file=sys.stderr)
        return 1 if summary["checks_failed"] else 0

    # eval.fidelity's UsageError -> 2
    return run_main(PROG, body, usage(ScenarioError), failed(ServerError, label="server error"))


if __name__ == "__main__":
    sys.exit(main())
