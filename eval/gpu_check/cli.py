"""The command line of ``python -m eval.gpu_check`` (``scripts/gpu_check.sh`` passes its arguments on)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.cli_types import name_list, positive_number
from eval.gpu_check.steps import NAMES, STEPS

DEFAULT_OUT = Path("runs/gpu_check")
TIME_LIMIT_S = 600.0


def build_parser() -> argparse.ArgumentParser:
    epilog = "steps:\n" + "\n".join(
        f"  {s.name:<10} {f'{s.budget_s:4.0f} s' if s.timed else 'untimed'}  {s.what}" for s in STEPS)
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description="The 10-minute end-to-end check on one GPU with the tiny model "
        "(docs/gpu.md, 'The 10-minute check'). Exit status 1 when any step fails.",
        epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): the check; cpu: a dry run of the same steps on CPU, GPU-only parts skipped")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where the JSON report and server logs go (default {DEFAULT_OUT})")
    parser.add_argument("--only", type=name_list(NAMES), default=None, metavar="STEP,...",
                        help=f"run only these steps: {', '.join(NAMES)}")
    parser.add_argument("--quick", action="store_true",
                        help="fewer exact cases and rotary rows (the neighbour runs and every step stay)")
    parser.add_argument("--time-limit", type=positive_number, default=TIME_LIMIT_S, metavar="SECONDS",
                        help=f"on cuda, the whole check must finish within this (default {TIME_LIMIT_S:.0f})")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)
