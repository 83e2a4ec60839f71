"""``python -m eval.soak``: see ``eval/soak/__init__.py``."""

from __future__ import annotations

import sys
from pathlib import Path

from eval import http
from eval.cli_types import Parser, int_at_least, positive_number, run_main

PROG = "python -m eval.soak"


def latency_ratio(text: str) -> float | None:
    """``--max-latency-ratio``: a number >= 1, or ``none`` (measured, not judged)."""
    import argparse

    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'none', got {text!r}")
    return value


def build_parser() -> Parser:
    """The command's flags: where, the load phase (``_add_load``), the probes after it (``_add_probes``)."""
    parser = Parser(prog=PROG, description="Bounded multi-tenant soak of a loopback server (eval/soak/__init__.py).\n\n"
                    "The server's admin routes (/flush_cache, /abort_request, /server_info) need its --admin-api-key: "
                    f"export {http.ADMIN_KEY_ENV}=KEY.\n\n"
                    "Exit status: 0 every check passed, 1 a check failed, 2 a usage error.")
    parser.add_server()
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="output directory (report.json, requests.jsonl)")
    _add_load(parser)
    _add_probes(parser)
    return parser


def _add_load(parser: Parser) -> None:
    parser.add_argument("--minutes", type=positive_number, default=None,
                        help="load phase length (default: 5 without --requests; no time bound with it)")
    parser.add_argument("--requests", type=int_at_least(1), default=None, metavar="N",
                        help="requests of the load phase: the same quota of each kind whatever the machine's speed "
                        "(default: no count limit, the phase ends with --minutes)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the load (conversations, edits, aborts, malformed requests)")
    parser.add_argument("--concurrency", type=int_at_least(1), default=4, metavar="N", help="parallel conversations")
    parser.add_argument("--tenants", type=int_at_least(1), default=4, metavar="N",
                        help="salts (extra_key / cache_salt) in use")
    parser.add_argument("--events", type=Path, default=None, metavar="FILE",
                        help="the server's --cache-events file")
    parser.add_argument("--log", type=Path, default=None, metavar="FILE",
                        help="the server's log (stdout + stderr)")
    parser.add_argument("--policy", choices=("radix", "exact", "scr"), default=None,
                        help="the server's --cache-policy (default: from the events)")
    parser.add_argument("--exact-sample", type=int_at_least(0), default=4, metavar="N",
                        help="exact only: cached answers compared with cold ones")
    parser.add_argument("--malformed", choices=("none", "safe", "all"), default="all",
                        help="malformed requests to interleave")
    parser.add_argument("--max-new-tokens", type=int_at_least(1), default=8, metavar="N",
                        help="tokens generated per request")


def _add_probes(parser: Parser) -> None:
    parser.add_argument("--fuzz-cases", type=int_at_least(0), default=None, metavar="N",
                        help="after the load, the schema-driven malformed set (every field of every generating "
                        "route, each wrong kind of value): N cases drawn from it, 0 none (default: all)")
    parser.add_argument("--regex-bomb-tokens", type=int_at_least(0), default=256, metavar="N",
                        help="the regex-bomb probe: trivial requests beside an N-token decode whose stop_regex "
                        "backtracks under Python's re (0: no probe)")
    parser.add_argument("--no-bounds", action="store_true",
                        help="skip the request-limit probes: requests just over each of the server's limits must get a "
                        "400 naming the limit, alone and beside trivial requests (eval/soak/bounds.py)")
    parser.add_argument("--max-latency-ratio", type=latency_ratio, default=3.0, metavar="R",
                        help="trivial requests beside the regex bomb or the over-limit requests may take at most R times "
                        "their usual latency; 'none': measured and reported, not judged (default: 3)")
    parser.add_argument("--no-namespaces", action="store_true",
                        help="skip the probes of cache_salt / extra_key pairs that must not share a namespace")
    parser.add_argument("--no-routes", action="store_true",
                        help="skip the route table's fuzz (every open, closed and admin route of "
                        "GET /cache_policy/routes asked as its verdict says)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, metavar="S", help="idle wait after /flush_cache")


def main(argv: list[str] | None = None) -> int:
    from eval.soak import format_table, run_soak

    args = build_parser().parse_args(argv)

    def body() -> int:
        report = run_soak(args.server, args.out, minutes=args.minutes, requests=args.requests, seed=args.seed,
                          concurrency=args.concurrency, tenants=args.tenants, events=args.events, log=args.log,
                          policy=args.policy, exact_sample=args.exact_sample, malformed=args.malformed,
                          max_new_tokens=args.max_new_tokens, idle_s=args.idle_seconds,
                          fuzz_cases=args.fuzz_cases, regex_bomb_tokens=args.regex_bomb_tokens,
                          namespaces=not args.no_namespaces, bounds=not args.no_bounds,
                          max_latency_ratio=args.max_latency_ratio, routes=not args.no_routes)
        print(format_table(report))
        print(f"-> {args.out / 'report.json'}")
        return 0 if report["passed"] else 1

    return run_main(PROG, body)  # eval.soak's UsageError -> 2


if __name__ == "__main__":
    sys.exit(main())
