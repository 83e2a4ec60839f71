"""``python -m eval.offline``: radix, exact and scr on any trace, offline, in about a minute.

    python -m eval.offline --trace FILE [--trace FILE ...] [--arm NAME=POLICY[:KEY=VALUE,...] ...]
        [--concurrency N] [--gpu-chunk N] [--decode-rate R] [--tokenizer qwen|tiny|DIR] [--out DIR]

Per trace (a synthetic set, an imported transcript, a recorded run; a second rendering of the
same questions is another ``--trace``), the calls are put in the order a replay with N
conversations in flight sends them (``arrival.py``) and served through the offline model of each
arm (``arms.py``: radix's tree model, ``exact_cache.replay``, SCR's own session table, diff and
planner), then tabled (``table.py``) with the GPU time estimate (``gpu_time.py``). On the default
synthetic set and the engine tier's small set every arm's prefix / moved / read share is within
0.5 points of ``eval.bench_policies``' served numbers (``docs/benchmark.md``;
``tests/engine/test_bench_policies.py`` checks the small set). Writes ``REPORT.md`` and
``offline.json`` under ``--out``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eval.offline import gpu_time, table
from eval.offline.arms import DEFAULT_ARMS, costs, from_option
from eval.offline.arrival import arrival_order

PROG = "python -m eval.offline"
DEFAULT_CONCURRENCY = 4  # eval.bench_policies' default


def message_end_id(calls, tokenizer: str | None) -> int:
    """``<|im_end|>`` in the trace's tokenizer: ``tokenizer`` (qwen, tiny or a folder), else Qwen3.6's
    when an id lies past the tiny tokenizer's vocabulary, else the tiny one's."""
    from eval.tiny_model import VOCAB_SIZE
    from eval.traces.importer import tokenizer_for

    if tokenizer is None:
        largest = max((max(c.prompt_ids + c.completion_ids, default=0) for c in calls), default=0)
        tokenizer = "qwen" if largest >= VOCAB_SIZE else "tiny"
    return tokenizer_for(tokenizer).convert_tokens_to_ids("<|im_end|>")


def floor(calls) -> tuple[float, float]:
    from eval.bench_cuts import floors

    new, _ = floors(calls)
    prompt = sum(len(c.prompt_ids) for c in calls)
    decode = sum(len(c.completion_ids) for c in calls)
    questions = len({c.conversation for c in calls})
    return new / prompt, table.prefix_reuse_pflops(new, decode, table.BODY_PARAMS) / questions


def measure(path: Path, concurrency: int = DEFAULT_CONCURRENCY, gpu_chunk: int = table.GPU_CHUNK,
            decode_rate: float = gpu_time.DECODE_RATE, tokenizer: str | None = None, arms=DEFAULT_ARMS) -> dict:
    """Every arm on one trace: the table's numbers, with the per-call costs kept under ``costs``."""
    from eval.traces import read_trace
    from eval.traces.format import trace_render

    calls = arrival_order(read_trace(path), concurrency)
    end = message_end_id(calls, tokenizer)
    curve = gpu_time.fit()
    rows, per_call = {}, {}
    for spec in arms:
        per_call[spec.name] = costs(spec, calls, end, gpu_chunk)
        rows[spec.name] = table.arm_row(calls, per_call[spec.name], curve, gpu_chunk, decode_rate)
        if spec.policy == "scr":
            rows[spec.name]["sessions"] = table.sessions(calls, per_call[spec.name])
    share, pflops = floor(calls)
    return {"trace": str(path), "render": trace_render(calls), "calls": len(calls),
            "questions": len({c.conversation for c in calls}), "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
            "concurrency": concurrency, "gpu_chunk": gpu_chunk, "decode_rate": decode_rate,
            "arms": table.with_ratios(rows), "floor_read_share": share, "floor_pflops_per_question": pflops,
            "costs": per_call, "order": [c.rid("offline") for c in calls]}


def report(results: list[dict], seconds: float) -> str:
    first = results[0]
    parts = ["Radix, exact and scr offline (Qwen3.6-27B geometry; the GPU seconds are an estimate)", ""]
    parts += [table.format_result(r) for r in results]
    parts.append(table.NOTE.format(chunk=first["gpu_chunk"], rate=first["decode_rate"]))
    parts.append(f"\nwall time: {seconds:.0f} s for {len(results)} trace(s)")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, existing_file, int_at_least, positive_number

    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0] + " " + __doc__.split("\n\n")[2].replace("\n", " "))
    parser.add_argument("--trace", type=existing_file, action="append", required=True, metavar="FILE",
                        help="a trace (eval/traces/format.py); repeat for several (one table each)")
    parser.add_argument("--concurrency", type=int_at_least(1), default=DEFAULT_CONCURRENCY, metavar="N",
                        help="conversations in flight in the arrival order (eval.bench_policies' --concurrency)")
    parser.add_argument("--gpu-chunk", type=int_at_least(1), default=table.GPU_CHUNK, metavar="N",
                        help="prefill chunk of radix and scr in the GPU time estimate, and exact kept's B")
    parser.add_argument("--decode-rate", type=positive_number, default=gpu_time.DECODE_RATE, metavar="R",
                        help="decoded tokens per second in the GPU time estimate")
    parser.add_argument("--tokenizer", default=None, metavar="qwen|tiny|DIR",
                        help="the trace's tokenizer, for exact's message ends (default: told by the ids)")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=POLICY[:KEY=VALUE,...]",
                        help="an arm beside the default ones (radix, exact, exact messages, exact kept, scr, scr rid), "
                        "repeatable: exact's piece_tokens, retain_every, cut, min_piece; any scr setting")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="write REPORT.md and offline.json here")
    args = parser.parse_args(argv)
    try:
        arms = DEFAULT_ARMS + tuple(from_option(text) for text in args.arm)
    except ValueError as exc:
        parser.error(str(exc))
    if len({a.name for a in arms}) < len(arms):
        parser.error("two arms share a name")
    started = time.monotonic()
    results = []
    for trace in args.trace:
        print(f"{PROG}: {trace} ...", file=sys.stderr, flush=True)
        results.append(measure(trace, args.concurrency, args.gpu_chunk, args.decode_rate, args.tokenizer, arms))
    text = report(results, time.monotonic() - started)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "REPORT.md").write_text(text + "\n")
        slim = [{k: v for k, v in r.items() if k not in ("costs", "order")} for r in results]
        (args.out / "offline.json").write_text(json.dumps(slim, indent=1) + "\n")
    return 0
