"""``python -m eval.traces SUBCOMMAND ...``: a small dispatcher; each subcommand's work lives in its module.

* ``synth --out FILE [--questions N] [--seed S] [--small] [--with-messages] [--tokenizer DIR]``: BCP-shaped
  CLM agent traces from the scripted stand-in (``eval/traces/synth.py``).
"""

from __future__ import annotations

import argparse
import sys


def add_synth(subparsers) -> None:
    from eval.traces import synth

    parser = subparsers.add_parser("synth", help="BCP-shaped CLM agent traces without a GPU")
    parser.add_argument("--out", required=True, help="trace file to write (JSONL)")
    parser.add_argument("--questions", type=int, default=synth.DEFAULT_QUESTIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--with-messages", action="store_true", help="store each call's message list too")
    parser.add_argument("--small", action="store_true",
                        help="the small preset (6,144-token budget, short documents; tests and smoke runs)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer directory (default: the tiny model's, built once under .artifacts)")
    parser.set_defaults(run=synth.main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.traces", description="Agent-run trace tools.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_synth(subparsers)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
