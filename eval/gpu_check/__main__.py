"""``python -m eval.gpu_check``: run the steps, print the summary table, write the JSON report,
exit 1 when any step failed."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tiny model is built locally; nothing is downloaded
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from eval.gpu_check import cli, report, runner, steps  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = cli.parse_args(argv)
    ctx = runner.Context(device=args.device, out=args.out, quick=args.quick, time_limit_s=args.time_limit)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"[gpu-check] device {args.device}{' (dry run)' if args.device == 'cpu' else ''}, out {args.out}"
          f"{', quick' if args.quick else ''}", flush=True)
    results = runner.run_steps(ctx, steps.select(args.only), progress=lambda line: print(line, flush=True))
    results.append(runner.time_row(ctx, results))
    print("\n" + report.table(results))
    meta = {"device": args.device, "quick": args.quick, "only": args.only, "time_limit_s": args.time_limit,
            "total_s": round(ctx.elapsed(), 1), "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path = report.write_json(args.out / "report.json", results, meta)
    print(f"report: {path}; server logs: {ctx.log_dir}")
    return report.exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
