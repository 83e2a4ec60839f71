"""What exact's split-invariant prefill attention costs on CPU: CPU time of a cold read, exact vs radix.

``python -m eval.bench_split_invariance [--model DIR] [--lengths 600,2000,4000,8000] [--repeats 4]``

Under ``exact`` on CPU the prefill attention runs in calls of fixed shape, the 64 query rows of a
tile of absolute positions over the keys before them (``patches/cpu/attention.py``
``tiled_attention``), so a row's bits do not depend on where the forward that read it started or
ended (what ``cut=kept`` needs, ``docs/exact.md`` §5.10); radix keeps SGLang's torch-native path.
This starts a radix and an exact server (``cut=kept``, B = 832) with the same SGLang flags, one
after the other (never two at once: an idle scheduler busy-polls a core), reads a random prompt of
each length cold (``/flush_cache`` first, one generated token) and prints, per policy and length,
the least CPU time (user + system) of the server's processes over ``--repeats`` reads (in rounds
over the lengths), and the ratio exact / radix measured in this run. CPU time, not wall time: on
the shared 2-core box wall times varied 4x run to run. CPU time varies too while other jobs hold
the cores (one run's four 600-token exact reads in a row took 8.7 s each, its next reads 0.5 s
for 2,000 tokens), so the least of several reads is kept. Not a test. Loopback only.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from eval.server import ServerProcess, output_record
from eval.tiny_model import cached_build

ROOT = Path(__file__).resolve().parents[1]
POLICY_ARGS = {"radix": ["--cache-policy", "radix"],
               "exact": ["--max-mamba-cache-size", "64", "--cache-policy", "exact",
                         "--cache-policy-set", "cut=kept", "--cache-policy-set", "piece_tokens=832"]}


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants alive now."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def cold_read_cpu(server: ServerProcess, prompt: list[int]) -> float:
    """CPU seconds of the server's processes for one cold read of ``prompt`` (one token out)."""
    server.flush_cache()
    before = tree_cpu_seconds(server.process.pid)
    record = output_record(server.generate(prompt, 1))
    spent = tree_cpu_seconds(server.process.pid) - before
    if record["cached_tokens"]:
        raise RuntimeError(f"a cold read reused {record['cached_tokens']} tokens")
    return spent


def least_cpu(server: ServerProcess, prompts: dict[int, list[int]], repeats: int) -> dict[int, float]:
    """Per prompt length, the least of ``repeats`` cold reads, taken in rounds over all lengths so
    that a burst of load on the shared box does not fall on every sample of one length."""
    samples: dict[int, list[float]] = {n: [] for n in prompts}
    for _ in range(repeats):
        for n, prompt in prompts.items():
            samples[n].append(cold_read_cpu(server, prompt))
    return {n: min(values) for n, values in samples.items()}


def format_table(lengths: list[int], seconds: dict[str, dict[int, float]], repeats: int) -> str:
    """The measured CPU seconds per length, radix and exact side by side, and their ratio."""
    lines = [f"CPU time of the server's processes for a cold read (least of {repeats}), measured in one run:",
             "| prompt tokens | radix CPU s | exact (cut=kept) CPU s | exact / radix |", "|---:|---:|---:|---:|"]
    for n in lengths:
        radix, exact = seconds["radix"][n], seconds["exact"][n]
        lines.append(f"| {n:,} | {radix:.2f} | {exact:.2f} | {exact / radix:.2f} |")
    return "\n".join(lines)


def parse_lengths(text: str) -> list[int]:
    """``"600,2000"`` -> ``[600, 2000]``; ``ValueError`` unless every length is an integer >= 2."""
    lengths = [int(part) for part in text.split(",") if part.strip()]
    if not lengths or min(lengths) < 2:
        raise ValueError(f"{text!r}: prompt lengths must be integers >= 2")
    return lengths


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, existing_dir, int_at_least

    parser = Parser(prog="python -m eval.bench_split_invariance", description=" ".join(__doc__.split("\n\n")[2].split()))
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the tiny model, built once under .artifacts)")
    parser.add_argument("--lengths", default="600,2000,4000,8000", metavar="LIST", help="prompt lengths, comma-separated")
    parser.add_argument("--repeats", type=int_at_least(1), default=4, metavar="K", help="cold reads per point; the least")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "bench_split_invariance", metavar="DIR",
                        help="output directory (the server logs)")
    args = parser.parse_args(argv)
    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as exc:
        parser.error(f"--lengths {exc}")
    model = args.model or cached_build(ROOT / ".artifacts")
    rng = random.Random(0)
    prompts = {n: [rng.randrange(10, 400) for _ in range(n)] for n in lengths}
    common = ["--max-total-tokens", str(2 * max(lengths) + 1024), "--max-running-requests", "1",
              "--serving-profile", "matched"]
    seconds: dict[str, dict[int, float]] = {}
    for policy, extra in POLICY_ARGS.items():
        print(f"[bench] {policy}: starting", file=sys.stderr, flush=True)
        with ServerProcess(str(model), args.out / f"{policy}.log", [*common, *extra]) as server:
            output_record(server.generate(prompts[lengths[0]][:64], 1))  # warm-up
            seconds[policy] = least_cpu(server, prompts, args.repeats)
    print(format_table(lengths, seconds, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
