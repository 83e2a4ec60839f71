"""Side-by-side comparison of BCP runs under different cache policies (docs/eval.md §5.8-§5.10).

    python -m eval.bcp.compare --run radix=runs/radix --run exact=runs/exact [--run scr=runs/scr] \\
        --out compare/NAME [--baseline radix] [--margin 3] [--model-config MODEL/config.json] [--ignore KEY ...] \\
        [--allow-render-mismatch]

The first run (or --baseline) is the reference of the paired statistics. The command refuses
(exit 2) to compare runs whose manifests differ in anything but the policy: the rendering of earlier
turns (eval/render.py; a manifest without `render` counts as what its chat_template_kwargs ask for),
model, server settings that must match, SGLang version, agent config, retrieval (snippet unit
included), dataset and question list, concurrency, and the agent code's fingerprint
(eval/bcp/manifest.py, `comparable`; the git commit is shown, not compared). --ignore KEY lets a
named difference through and prints it in the table; --allow-render-mismatch does so for the
rendering (the same as --ignore render). Each run must have been scored (python -m eval.bcp.run
judge|score).

Token accounting comes from each run's events.jsonl (the server's --cache-events lines of the
run's rids) through eval.report.ingest; only the requests of a question's final attempt count
towards it (requests of an interrupted attempt are reported as abandoned). Writes table.md,
table.csv, table.json, stats.json and plots/*.png. When any run is not a result (judge failures,
unjudged questions, a stub server, a run stamped --not-a-result) the table and every plot carry
"NOT A RESULT" and the reasons.

Exit statuses: 0 written, 2 a usage error (flags, a missing or unscored run, runs that cannot be
compared).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eval.bcp.compare_arms import RENDER, Arm, CompareError, check_comparable, load_arm
from eval.bcp.compare_output import render_markdown, write
from eval.bcp.compare_table import build
from eval.bcp.manifest import MANIFEST
from eval.cli_types import Parser, existing_dir, existing_file, int_at_least, run_main, run_spec, usage

PROG = "python -m eval.bcp.compare"


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description=__doc__)
    parser.add_argument("--run", type=run_spec, action="append", required=True, metavar="NAME=DIR",
                        help="a scored run and its name in the table; give two or three (the first is the "
                             "baseline unless --baseline says otherwise)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the table and plots go")
    parser.add_argument("--baseline", default=None, metavar="NAME", help="the reference arm (default: the first --run)")
    parser.add_argument("--margin", type=float, default=3.0, metavar="PP", help="equivalence margin in percentage points")
    parser.add_argument("--model-config", type=existing_file, default=None, metavar="FILE",
                        help="the model's config.json, for N_body (default: Qwen3.6-27B's geometry)")
    parser.add_argument("--aa", type=existing_dir, default=None, metavar="DIR",
                        help="a second run of the baseline policy: its discordance with the baseline is the "
                             "A/A noise floor")
    parser.add_argument("--ignore", action="append", default=[], metavar="KEY",
                        help="a manifest key allowed to differ (see manifest.comparable); repeatable")
    parser.add_argument("--allow-render-mismatch", action="store_true",
                        help="pair runs rendered differently (eval/render.py: default vs preserve); the table notes "
                             "it. Without it they are refused: the model saw different prompts")
    parser.add_argument("--resamples", type=int_at_least(1), default=10_000, metavar="N", help="bootstrap resamples")
    return parser


def ordered_runs(runs: list[tuple[str, Path]], baseline: str | None) -> list[tuple[str, Path]]:
    """The runs, checked (two or three, each a run directory), the baseline first."""
    for _, path in runs:
        if not (path / MANIFEST).exists():
            raise CompareError(f"{path}: no {MANIFEST}")
    if not 2 <= len(runs) <= 3:
        raise CompareError("compare takes two or three runs")
    return sorted(runs, key=lambda s: s[0] != baseline) if baseline else list(runs)


def load_aa(path: Path, arms: list[Arm], out: Path, model_config: Path | None, ignore: set[str]) -> tuple[Arm, list[str]]:
    """The A/A run (the baseline's policy again) and its differences let through with --ignore."""
    aa = load_arm("A/A", path, out, model_config)
    if aa.policy != arms[0].policy:
        raise CompareError(f"--aa {path} has policy {aa.policy!r}, not the baseline's {arms[0].policy!r}")
    return aa, check_comparable([arms[0], aa], ignore, same_policy=True)


def compare(args) -> dict:
    from eval.accounting.flops import QWEN36_27B, flops_per_pair, geometry_from_config, n_body

    specs = ordered_runs(args.run, args.baseline)
    geometry = geometry_from_config(json.loads(args.model_config.read_text())) if args.model_config else QWEN36_27B
    arms = [load_arm(name, path, args.out, args.model_config) for name, path in specs]
    ignore = set(args.ignore) | ({RENDER} if args.allow_render_mismatch else set())
    notes = check_comparable(arms, ignore)
    aa = None
    if args.aa is not None:
        aa, aa_notes = load_aa(args.aa, arms, args.out, args.model_config, ignore)
        notes += aa_notes
    return build(arms, margin=args.margin / 100, notes=notes, body_params=n_body(geometry),
                 pair_flops=flops_per_pair(geometry), resamples=args.resamples, aa=aa)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        result = compare(args)
        write(result, args.out)
        print(render_markdown(result))
        print(f"-> {args.out}/table.md, table.csv, table.json, stats.json, plots/")
        return 0

    return run_main(PROG, body, usage(CompareError, label="refused"))


if __name__ == "__main__":
    sys.exit(main())
