"""What exact's batch-invariant decode costs on CPU: decode time of B concurrent requests, exact vs radix.

``python -m eval.bench_batch_invariance [--model DIR] [--batches 1,2,4] [--tokens 64] [--repeats 3]``

``exact`` on CPU computes each row of a decode batch's matrix products alone
(``patches/row_invariance.py``) so a warm answer decoded beside others is bit-identical to the
cold one decoded alone. This starts a radix and an exact server with the same SGLang flags, one
after the other (never two at once: an idle scheduler busy-polls a core), sends B requests with
short prompts (decode dominates) at once, and prints the median wall time per policy and batch
size and the ratio exact / radix measured in this run. Not a test: timings on a shared box are
noisy; the ratio is what to read. Loopback only.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eval.server import ServerProcess
from eval.tiny_model import cached_build

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--max-total-tokens", "8192", "--max-mamba-cache-size", "32", "--chunked-prefill-size", "64",
          "--max-running-requests", "8", "--skip-server-warmup"]
POLICY_ARGS = {"radix": ["--cache-policy", "radix"],
               "exact": ["--cache-policy", "exact", "--cache-policy-set", "piece_tokens=64",
                         "--cache-policy-set", "retain_every=256"]}


def prompt(seed: int, length: int = 48) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 400) for _ in range(length)]


def measure(server: ServerProcess, batch: int, tokens: int, repeats: int, seed: int) -> float:
    """Median wall time of ``repeats`` rounds of ``batch`` concurrent requests (fresh prompts)."""
    times = []
    for repeat in range(repeats):
        prompts = [prompt(seed + 100 * repeat + n) for n in range(batch)]
        payload = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}
        start = time.perf_counter()
        with ThreadPoolExecutor(batch) as pool:
            list(pool.map(lambda ids: server.post("/generate", {"input_ids": ids, "sampling_params": payload}),
                          prompts))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, existing_dir, int_at_least

    parser = Parser(prog="python -m eval.bench_batch_invariance", description=" ".join(
        (__doc__.split("\n\n")[0] + "\n" + __doc__.split("\n\n")[2]).split()))
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the tiny model, built once under .artifacts)")
    parser.add_argument("--batches", default="1,2,4", metavar="LIST", help="comma-separated batch sizes")
    parser.add_argument("--tokens", type=int_at_least(1), default=64, metavar="N", help="decode tokens per request")
    parser.add_argument("--repeats", type=int_at_least(1), default=3, metavar="K",
                        help="rounds per point; the median is kept")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "bench_batch_invariance", metavar="DIR",
                        help="output directory (the server logs)")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: expected integers, got {args.batches!r}")
    if min(batches) < 1:
        parser.error(f"--batches {args.batches!r}: batch sizes must be >= 1")
    model = args.model or cached_build(ROOT / ".artifacts")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, float]] = {}
    for policy in ("radix", "exact"):
        server = ServerProcess(model_path=str(model), log_path=args.out / f"{policy}.log",
                               extra_args=[*COMMON, *POLICY_ARGS[policy]])
        print(f"[bench] {policy}: starting", file=sys.stderr, flush=True)
        with server:
            measure(server, 1, 4, 1, seed=1)  # warm-up
            results[policy] = {b: measure(server, b, args.tokens, args.repeats, seed=10 * b) for b in batches}
    print(f"Decode-dominated wall time, {args.tokens} tokens per request (median of {args.repeats}), measured in one run:")
    print("| concurrent requests | radix s | exact s | exact / radix |")
    print("|---:|---:|---:|---:|")
    for b in batches:
        radix, exact = results["radix"][b], results["exact"][b]
        print(f"| {b} | {radix:.2f} | {exact:.2f} | {exact / radix:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
