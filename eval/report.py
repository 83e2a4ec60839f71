"""Token provenance and PFLOPs per request, checked, and side by side across policies.

``python -m eval.report ingest (--log server.log | --events events.jsonl) --out DIR``
    ``[--events FILE] [--client client.jsonl] [--model-config config.json] [--policy NAME]``
    ``[--max-blocks K] [--moved-counted-once]``

Reads a server log (SGLang ``Finish:`` lines and SCR's splice/trace lines, see
``eval/accounting/server_log.py``) or a ``--cache-events`` file, writes ``DIR/requests.csv``
(one row per request, ``CSV_FIELDS``) and ``DIR/summary.json``, and runs the checks. With both
``--log`` and ``--events`` the rows come from the log and are checked against the events (X1);
with ``--client`` every client request must join exactly one server row (C1). Any failed check
is printed and the command exits with status 2: the run is not reportable. PFLOPs use Qwen3.6-27B
(N_body = 24,353,201,664; 393,216 FLOPs per query-key pair) unless ``--model-config`` names
another model's config.json.

``python -m eval.report compare --run radix=DIR --run exact=DIR --run scr=DIR --out DIR [--baseline radix]``

Reads ingested run directories and writes ``DIR/table.md``, ``DIR/table.csv``, ``DIR/table.json``
and the plots ``DIR/provenance_stack.png`` and ``DIR/read_cdf.png``
(``eval/accounting/compare.py``); exits 2 when a run's checks failed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

from eval.accounting import server_log
from eval.accounting.flops import QWEN36_27B, flops_per_pair, geometry_from_config, n_body
from eval.accounting.provenance import check, check_against_events, check_client, rows_from_events, summary
from policy.events import read_events

CSV_FIELDS = ("rid", "policy", "conversation", "session", "prev_prompt_tokens", "class", "prompt_tokens",
              "cached_tokens", "prefix_reused", "moved", "read", "decode", "blocks", "pflops", "pflops_naive",
              "pflops_attn_approx")


def read_client(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ingest(events_path: Path | None, out: Path, model_config: Path | None = None, *, log_path: Path | None = None,
           client_path: Path | None = None, policy: str | None = None, max_blocks: int | None = None,
           moved_count_in_cached: int = 2) -> tuple[list, list[str]]:
    """Rows and every failed check; writes ``out/requests.csv`` and ``out/summary.json``."""
    if events_path is None and log_path is None:
        raise ValueError("give --log or --events (or both)")
    geometry = geometry_from_config(json.loads(model_config.read_text())) if model_config else QWEN36_27B
    body, pair = n_body(geometry), flops_per_pair(geometry)
    extra: dict = {}
    if log_path is not None:
        with open(log_path, errors="replace") as f:
            parsed = server_log.parse_log(f)
        rows = server_log.rows_from_log(parsed, body, pair, policy=policy, moved_count_in_cached=moved_count_in_cached)
        failures = check(rows, body) + server_log.check_log(parsed, max_blocks)
        if events_path is not None:
            failures += check_against_events(rows, read_events(str(events_path)))
        extra = {"max_blocks": server_log.max_blocks(parsed, max_blocks), "scr_banner": parsed.banner,
                 "moved_count_in_cached": moved_count_in_cached}
    else:
        rows = rows_from_events(read_events(str(events_path)), body, pair)
        if policy is not None:
            rows = [dataclasses.replace(row, policy=policy) for row in rows]
        failures = check(rows, body)
    if client_path is not None:
        failures += check_client(rows, read_client(client_path))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            record = dataclasses.asdict(row)
            record["class"] = record.pop("klass")
            writer.writerow({k: "" if record[k] is None else record[k] for k in CSV_FIELDS})
    result = {**summary(rows), **extra, "n_body": body, "flops_per_pair": pair,
              "sources": {"log": _str(log_path), "events": _str(events_path), "client": _str(client_path)},
              "checks_failed": failures}
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    return rows, failures


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _run_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR")
    return name, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ingest_parser = commands.add_parser("ingest", help="server log or events file -> requests.csv + summary.json")
    ingest_parser.add_argument("--log", type=Path, default=None, help="server log (SGLang Finish lines, SCR lines)")
    ingest_parser.add_argument("--events", type=Path, default=None, help="--cache-events file")
    ingest_parser.add_argument("--client", type=Path, default=None, help="eval.workload's client.jsonl (check C1)")
    ingest_parser.add_argument("--out", type=Path, required=True)
    ingest_parser.add_argument("--model-config", type=Path, default=None)
    ingest_parser.add_argument("--policy", default=None, help="policy name (default: from the log or the events)")
    ingest_parser.add_argument("--max-blocks", type=int, default=None, help="K when the log has no SCR banner")
    ingest_parser.add_argument("--moved-counted-once", action="store_true",
                               help="the server's cached_tokens counts relocated rows once, not twice")
    compare_parser = commands.add_parser("compare", help="ingested runs -> side-by-side table and plots")
    compare_parser.add_argument("--run", type=_run_arg, action="append", required=True, metavar="NAME=DIR")
    compare_parser.add_argument("--out", type=Path, required=True)
    compare_parser.add_argument("--baseline", default=None, help="run the ratios are to (default: radix, else the first)")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return _compare(args)
    if args.log is None and args.events is None:
        parser.error("ingest needs --log or --events")
    try:
        rows, failures = ingest(args.events, args.out, args.model_config, log_path=args.log, client_path=args.client,
                                policy=args.policy, max_blocks=args.max_blocks,
                                moved_count_in_cached=1 if args.moved_counted_once else 2)
    except (OSError, ValueError, KeyError) as exc:
        print(f"python -m eval.report: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(rows)} requests -> {args.out / 'requests.csv'}, {args.out / 'summary.json'}")
    for failure in failures:
        print(f"CHECK FAILED {failure}", file=sys.stderr)
    return 2 if failures else 0


def _compare(args) -> int:
    from eval.accounting import compare

    names = [name for name, _ in args.run]
    if len(set(names)) != len(names):
        print(f"python -m eval.report: error: run names repeat: {names}", file=sys.stderr)
        return 2
    try:
        result = compare.compare(dict(args.run), args.out, baseline=args.baseline)
    except (OSError, ValueError, KeyError) as exc:
        print(f"python -m eval.report: error: {exc}", file=sys.stderr)
        return 2
    print(result["markdown"])
    print(f"-> {', '.join(str(p) for p in result['files'])}")
    for name, failures in result["checks_failed"].items():
        for failure in failures:
            print(f"CHECK FAILED [{name}] {failure}", file=sys.stderr)
    return 2 if any(result["checks_failed"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
