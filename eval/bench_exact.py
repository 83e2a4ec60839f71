"""Benchmark of the exact cache: cold-read cost of fixed pieces, and what an edit costs.

``python -m eval.bench_exact [--model DIR] [--context N] [--piece B] [--retain R] [--repeats K]``
(defaults: the tiny model, 7,680 tokens, B = 832, R = 3,328). Two servers run one after the other
on the same machine:

1. **Cold-read cost**: the same prompt read cold (``/flush_cache`` first) by stock SGLang
   chunking (``--cache-policy radix``, SGLang's default chunk size) and by the exact cache's
   B-token pieces. Prints the median times and their ratio, measured in this run.
2. **Edit cost** (the shape of ``docs/exact.md`` §3.5): time to the first token and
   tokens read for: a cold read, the same text again, an edit in the last piece, at 90 %, 50 %
   and 10 %, and the last edit sent again. Each edit starts from a cache holding the original
   text only. Rows are medians over ``--repeats`` runs.

Timings are wall-clock on a shared machine: compare ratios inside one run, not across runs.
On a GPU, run it with ``--model Qwen/Qwen3.6-27B --context 30000 --piece 832 --retain 13312``
and the deterministic flags given in docs/serving.md and docs/gpu.md (pass them after ``--``).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from eval.server import ServerProcess, output_record
from eval.tiny_model import cached_build
from serving.profile import PROFILES

ROOT = Path(__file__).resolve().parents[1]


def first_token(server: ServerProcess, prompt: list[int]) -> tuple[float, int]:
    """Seconds to a one-token answer and prompt tokens read (prompt - reused)."""
    started = time.perf_counter()
    record = output_record(server.generate(prompt, 1))
    return time.perf_counter() - started, len(prompt) - record["cached_tokens"]


def cold_read_seconds(server: ServerProcess, prompt: list[int], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        server.flush_cache()
        times.append(first_token(server, prompt)[0])
    return statistics.median(times)


def edit_at(prompt: list[int], position: int, width: int = 24) -> list[int]:
    """Remove ``width`` tokens at ``position`` (an agent deleting a few lines)."""
    return prompt[:position] + prompt[position + width:]


def edit_cost_rows(server: ServerProcess, prompt: list[int], piece: int, repeats: int) -> list[tuple]:
    n = len(prompt)
    last_piece = (n - 1) // piece * piece + 8
    cases = [("edit in the last piece", last_piece), ("edit at 90 %", n * 9 // 10),
             ("edit at 50 %", n // 2), ("edit at 10 %", n // 10)]
    rows = []
    samples = {"cold read": [], "same text again": []}
    for _ in range(repeats):
        server.flush_cache()
        samples["cold read"].append(first_token(server, prompt))
        samples["same text again"].append(first_token(server, prompt))
    for label, position in cases:
        samples[label] = []
        for _ in range(repeats):
            server.flush_cache()
            first_token(server, prompt)
            samples[label].append(first_token(server, edit_at(prompt, position)))
    samples["last edit sent again"] = []
    for _ in range(repeats):
        server.flush_cache()
        first_token(server, prompt)
        edited = edit_at(prompt, n // 10)
        first_token(server, edited)
        samples["last edit sent again"].append(first_token(server, edited))
    for label, values in samples.items():
        rows.append((label, statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)))
    return rows


def build_parser():
    from eval.cli_types import Parser, int_at_least

    parser = Parser(prog="python -m eval.bench_exact", description=(
        "Benchmark of the exact cache on two servers, one after the other: the cold-read cost of fixed B-token "
        "pieces against stock SGLang chunking, and what an edit costs (time to the first token, tokens read) "
        "for edits at several depths of the prompt. Wall-clock on a shared machine: compare ratios inside one "
        "run, not across runs. Details: eval/bench_exact.py."))
    parser.add_argument("--model", type=Path, default=None, metavar="DIR",
                        help="model directory or name (default: the tiny model, built once under .artifacts)")
    parser.add_argument("--context", type=int_at_least(1), default=7680, metavar="N", help="prompt tokens")
    parser.add_argument("--piece", type=int_at_least(1), default=832, metavar="B", help="exact's piece size B")
    parser.add_argument("--retain", type=int_at_least(1), default=3328, metavar="R",
                        help="exact's retained-state interval R")
    parser.add_argument("--repeats", type=int_at_least(1), default=3, metavar="K",
                        help="runs per measurement; the median is printed")
    parser.add_argument("--serving-profile", default="matched", choices=list(PROFILES),
                        help="the SGLang settings both servers share (serving/profile.py; default matched)")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "bench-exact", metavar="DIR",
                        help="output directory (the two server logs)")
    parser.add_argument("server_args", nargs="*", metavar="SGLANG_FLAG",
                        help="extra SGLang flags for both servers, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model = args.model or cached_build(ROOT / ".artifacts")
    rng = random.Random(0)
    prompt = [rng.randrange(10, 400) for _ in range(args.context)]
    # Both servers share one serving profile (serving/profile.py): the same recurrent-state strategy
    # (no_buffer, which SGLang accepts only with overlap scheduling off), kernels and graphs.
    common = ["--max-total-tokens", str(2 * args.context + 1024), "--max-running-requests", "1",
              "--serving-profile", args.serving_profile, *args.server_args]

    print(f"[bench] {model.name}: {args.context}-token prompt, B={args.piece}, R={args.retain}, "
          f"median of {args.repeats}", flush=True)
    stock = ServerProcess(str(model), args.out / "radix.log", [*common, "--cache-policy", "radix"])
    with stock:
        stock_cold = cold_read_seconds(stock, prompt, args.repeats)
    exact_args = [*common, "--max-mamba-cache-size", "64", "--cache-policy", "exact",
                  "--cache-policy-set", f"piece_tokens={args.piece}",
                  "--cache-policy-set", f"retain_every={args.retain}"]
    exact = ServerProcess(str(model), args.out / "exact.log", exact_args)
    with exact:
        exact_cold = cold_read_seconds(exact, prompt, args.repeats)
        rows = edit_cost_rows(exact, prompt, args.piece, args.repeats)
    print_results(args, stock_cold, exact_cold, rows)
    return 0


def print_results(args, stock_cold: float, exact_cold: float, rows) -> None:
    print()
    print("Cold-read cost of fixed pieces (same prompt, cache flushed)")
    print(f"  stock SGLang chunking : {stock_cold:8.3f} s")
    print(f"  exact, {args.piece}-token pieces: {exact_cold:8.3f} s")
    print(f"  ratio exact / stock   : {exact_cold / stock_cold:8.3f}")
    print()
    print(f"What an edit costs with the exact cache ({args.context} tokens, 24 tokens removed)")
    print(f"  {'case':<24} {'first token (s)':>16} {'tokens read':>12}")
    for label, seconds, read in rows:
        print(f"  {label:<24} {seconds:>16.3f} {read:>12}")


if __name__ == "__main__":
    sys.exit(main())
