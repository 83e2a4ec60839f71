"""``python -m eval.cluster``: see ``eval/cluster/__init__.py``."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from eval.cli_types import (Parser, UsageError, existing_dir, existing_file, int_at_least, name_list, run_main,
                            usage)
from eval.cluster.cluster import DEFAULT_ROUTER_POLICY, ROUTER_POLICIES
from serving.profile import DEFAULT, PROFILES

PROG = "python -m eval.cluster"
ROOT = Path(__file__).resolve().parents[2]
EXIT = "\n\nExit status: 0 done, 1 a check failed, 2 a usage error."


def _policies() -> tuple[str, ...]:
    from policy.registry import names

    return names()


def serve_parser() -> Parser:
    parser = Parser(prog=PROG, description=(
        "Start N patched servers (python -m patches.launch_server) on loopback ports with sglang-router in "
        "front, print the router's URL, and serve until Ctrl-C or SIGTERM; then stop every process. "
        "Arguments this command does not know are passed to every worker (server flags, e.g. "
        "--max-total-tokens 65536 --cache-policy-set piece_tokens=832). Clients that want conversation "
        "affinity send the header x-smg-routing-key: <rid without its last .turn> (the default router "
        "policy, manual, pins each key to one worker). `python -m eval.cluster bench --help`: one server "
        "against the cluster on a trace." + EXIT))
    parser.add_argument("--workers", type=int_at_least(1), default=2, metavar="N", help="patched servers to start")
    parser.add_argument("--policy", required=True, metavar="NAME", help="--cache-policy of every worker")
    parser.add_argument("--router-policy", choices=ROUTER_POLICIES, default=DEFAULT_ROUTER_POLICY,
                        help="sglang-router's --policy (manual: pinned by x-smg-routing-key)")
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the tiny model, built once under .artifacts)")
    parser.add_argument("--gpus-per-worker", type=int_at_least(0), default=0, metavar="K",
                        help="GPU box: worker i gets --base-gpu-id i*K (0: CPU, the cores are split between workers)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cluster", metavar="DIR",
                        help="router.log and worker-<i>/{server.log,events.jsonl}")
    return parser


def bench_parser() -> Parser:
    from eval.bench_policies import DEFAULT_QUESTIONS, DEFAULT_SEED

    parser = Parser(prog=f"{PROG} bench", description=(
        "Per policy: the trace through one server, then through the router + N workers (once per router "
        "policy), every run ingested with every check; a table of shares, split conversations, exact's "
        "per-worker prediction and the throughput ratio measured in this run (eval/cluster/bench.py). "
        "The tiny model is random: the numbers measure the machinery, not quality." + EXIT))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cluster-bench", metavar="DIR", help="output folder")
    parser.add_argument("--trace", type=existing_file, default=None, metavar="FILE",
                        help="trace to replay (default: generate the BCP-shaped set with eval.traces synth)")
    parser.add_argument("--questions", type=int_at_least(1), default=min(4, DEFAULT_QUESTIONS), metavar="N",
                        help="questions of the generated set")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="S", help="seed of the generated set")
    parser.add_argument("--small", action="store_true",
                        help="generate the small preset (eval.traces synth --small: 6,144-token budget, short "
                             "documents; about 15 calls and 53k prompt tokens per question)")
    parser.add_argument("--policies", type=name_list(("radix", "exact", "scr")), default=None, metavar="LIST",
                        help="comma-separated policies, each with its defaults (default: exact,scr)")
    parser.add_argument("--arm", action="append", default=None, metavar="NAME=POLICY[:KEY=VALUE,...]",
                        help="an arm, as eval.bench_policies takes it (repeatable; instead of --policies)")
    parser.add_argument("--workers", type=int_at_least(1), default=2, metavar="N", help="workers behind the router")
    parser.add_argument("--serving-profile", default=DEFAULT, choices=list(PROFILES),
                        metavar="NAME",
                        help="the SGLang settings every arm and worker shares (serving/profile.py; default matched)")
    parser.add_argument("--router-policies", type=name_list(ROUTER_POLICIES), default="manual,cache_aware",
                        metavar="LIST", help="router policies to measure, one cluster run each")
    parser.add_argument("--concurrency", type=int_at_least(1), default=4, metavar="N", help="conversations in flight")
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the long-context tiny model, built once under .artifacts)")
    return parser


def serve(argv: list[str]) -> int:
    from eval.cluster.cluster import Cluster
    from eval.tiny_model import cached_build

    args, server_flags = serve_parser().parse_known_args(argv)
    if args.policy not in _policies():
        raise UsageError(f"--policy {args.policy!r}: choose from {', '.join(_policies())}")
    if any(flag.split("=")[0] in ("--cache-policy", "--port", "--host", "--cache-events") for flag in server_flags):
        raise UsageError("--cache-policy, --port, --host and --cache-events are set per worker by this command")
    model = args.model or cached_build(ROOT / ".artifacts")
    stop, started = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after start-up: stop serving; during it, unwind
        signal.signal(sig, lambda *_: sys.exit(143) if not started.is_set() else stop.set())
    cluster = Cluster(str(model), args.out, args.workers, ["--cache-policy", args.policy, *server_flags],
                      args.router_policy, gpus_per_worker=args.gpus_per_worker)
    print(f"{PROG}: starting {args.workers} workers ({args.policy}) and the router ({args.router_policy})",
          file=sys.stderr, flush=True)
    with cluster:
        started.set()
        for i, server in enumerate(cluster.servers):
            print(f"{PROG}: worker-{i} {server.url} (log {server.log_path})", file=sys.stderr)
        print(cluster.url, flush=True)
        stop.wait()
    print(f"{PROG}: stopped", file=sys.stderr)
    return 0


def bench(argv: list[str]) -> int:
    from eval.bench_policies import default_model, synth_default
    from eval.cluster.bench import bench as run_bench, failed

    from eval.arms import ArmError, parse_arms, with_profile

    parser = bench_parser()
    args = parser.parse_args(argv)
    if args.policies and args.arm:
        parser.error("give --policies or --arm, not both")
    try:
        arms = with_profile(parse_arms(args.arm or [f"{p}={p}" for p in (args.policies or ["exact", "scr"])]),
                            args.serving_profile)
    except ArmError as exc:
        parser.error(str(exc))
    # SIGTERM unwinds like Ctrl-C, so every server and the router are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.trace
    if trace is None:
        trace = args.out / f"trace-q{args.questions}-s{args.seed}{'-small' if args.small else ''}-qwen.jsonl"
        if not trace.exists():
            synth_default(trace, args.questions, args.seed, args.small)
    model = args.model or default_model(trace)
    results = run_bench(trace, args.out, arms, args.workers, args.router_policies, args.concurrency, model)
    problems = failed(results)
    for problem in problems:
        print(f"{PROG} bench: CHECK FAILED {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return run_main(f"{PROG} bench", lambda: bench(argv[1:]), usage(OSError, ValueError))
    return run_main(PROG, lambda: serve(argv), usage(OSError))


if __name__ == "__main__":
    sys.exit(main())
