"""Token provenance and PFLOPs per request, checked, and side by side across policies.

``python -m eval.report ingest (--log server.log | --events events.jsonl) --out DIR``
    ``[--events FILE] [--client client.jsonl] [--model-config config.json] [--policy NAME]``
    ``[--max-blocks K] [--moved-counted-once]``

Reads a server log (SGLang ``Finish:`` lines and SCR's splice/trace lines, see
``eval/accounting/server_log.py``) or a ``--cache-events`` file, writes ``DIR/requests.csv``
(one row per request, ``CSV_FIELDS``) and ``DIR/summary.json``, and runs the checks. With both
``--log`` and ``--events`` the rows come from the log and are checked against the events (X1);
with ``--client`` every client request must join exactly one server row (C1). ``--events`` may be
repeated (the workers of ``eval.cluster``): the files are merged in finishing order and a rid in
two of them fails. Each events file's start-up record is copied into ``summary.json``
(``startup``) and checked (S1): its policy must be ``--policy`` when given, and several files
must come from servers with one policy and one set of settings. Any failed check
is printed and the command exits with status 1: the run is not reportable. PFLOPs use Qwen3.6-27B
(N_body = 24,353,201,664; 393,216 FLOPs per query-key pair) unless ``--model-config`` names
another model's config.json.

``python -m eval.report compare --run radix=DIR --run exact=DIR --run scr=DIR --out DIR [--baseline radix]``

Reads ingested run directories and writes ``DIR/table.md``, ``DIR/table.csv``, ``DIR/table.json``
and the plots ``DIR/provenance_stack.png`` and ``DIR/read_cdf.png``
(``eval/accounting/compare.py``); exits 1 when a run's checks failed.

Both exit 2 on a usage error (a flag, a missing or unreadable input).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

from eval.accounting import server_log
from eval.accounting.flops import QWEN36_27B, flops_per_pair, geometry_from_config, n_body
from eval.cli_types import Parser, UsageError, existing_file, int_at_least, run_main, run_spec, usage
from eval.accounting.provenance import check, check_against_events, check_client, rows_from_events, summary
from policy.events import read_events

CSV_FIELDS = ("rid", "policy", "conversation", "session", "prev_prompt_tokens", "class", "prompt_tokens",
              "cached_tokens", "prefix_reused", "moved", "read", "decode", "blocks", "pflops", "pflops_naive",
              "pflops_attn_approx")


def read_client(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def path_list(paths: Path | Sequence[Path] | None) -> list:
    """``--events`` as given (one path, several, or none) as a list."""
    return [] if paths is None else [paths] if isinstance(paths, (str, Path)) else list(paths)


def merged_events(paths: Path | Sequence[Path]) -> list:
    """The request events of one events file, or of several (one per worker behind a router),
    merged in finishing order. A rid in two files is a ``ValueError``: a call is served once."""
    paths = path_list(paths)
    events, seen = [], {}
    for path in paths:
        for event in read_events(str(path)):
            if event.rid in seen and len(paths) > 1:
                raise ValueError(f"rid {event.rid} is in {seen[event.rid]} and in {path}")
            seen[event.rid] = path
            events.append(event)
    return events if len(paths) == 1 else sorted(events, key=lambda e: e.finished_ts)


def startup_checks(events_paths: Path | Sequence[Path] | None, policy: str | None) -> tuple[dict, list[str]]:
    """Each events file's last start-up record (None for a server from before them) and check S1:
    a record whose policy is not ``policy`` (when given), or workers whose records differ in
    policy or settings (several files: one cluster must run one configuration)."""
    from eval.bcp.startup import last_startup, startup_mismatches

    records = {str(path): last_startup(path) for path in path_list(events_paths)}
    failures = [f"S1 {path}: {problem}" for path, record in records.items() if record is not None and policy
                for problem in startup_mismatches(record, policy, {})]
    configs = {json.dumps([r.get("policy"), r.get("settings")], sort_keys=True) for r in records.values() if r}
    if len(configs) > 1:
        failures.append(f"S1: the events files come from servers with different policies or settings: {sorted(configs)}")
    return records, failures


def ingest(events_path: Path | Sequence[Path] | None, out: Path, model_config: Path | None = None, *,
           log_path: Path | None = None,
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
            failures += check_against_events(rows, merged_events(events_path))
        extra = {"max_blocks": server_log.max_blocks(parsed, max_blocks), "scr_banner": parsed.banner,
                 "moved_count_in_cached": moved_count_in_cached}
    else:
        rows = rows_from_events(merged_events(events_path), body, pair)
        if policy is not None:
            rows = [dataclasses.replace(row, policy=policy) for row in rows]
        failures = check(rows, body)
    if client_path is not None:
        failures += check_client(rows, read_client(client_path))
    startups, startup_failures = startup_checks(events_path, policy)
    failures += startup_failures
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            record = dataclasses.asdict(row)
            record["class"] = record.pop("klass")
            writer.writerow({k: "" if record[k] is None else record[k] for k in CSV_FIELDS})
    result = {**summary(rows), **extra, "n_body": body, "flops_per_pair": pair, "startup": startups,
              "sources": {"log": _str(log_path), "events": _paths(events_path), "client": _str(client_path)},
              "checks_failed": failures}
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    return rows, failures


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _paths(paths: Path | Sequence[Path] | None) -> str | list[str] | None:
    if paths is None or isinstance(paths, (str, Path)):
        return _str(paths)
    return [str(p) for p in paths]


PROG = "python -m eval.report"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0] + "\n\nExit status: 0 done, 1 a check failed, "
                    "2 a usage error (flags, missing or unreadable input).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{ingest,compare}")
    _add_ingest(commands)
    _add_compare(commands)
    args = parser.parse_args(argv)
    if args.command == "compare":
        # an unreadable or malformed input (OSError, ValueError, KeyError) is a usage error: exit 2
        return run_main(PROG, lambda: _compare(args), usage(OSError, ValueError, KeyError))
    if args.log is None and args.events is None:
        parser.error("ingest needs --log or --events")

    def body() -> int:
        rows, failures = ingest(args.events, args.out, args.model_config, log_path=args.log, client_path=args.client,
                                policy=args.policy, max_blocks=args.max_blocks,
                                moved_count_in_cached=1 if args.moved_counted_once else 2)
        print(f"{len(rows)} requests -> {args.out / 'requests.csv'}, {args.out / 'summary.json'}")
        for failure in failures:
            print(f"CHECK FAILED {failure}", file=sys.stderr)
        return 1 if failures else 0

    return run_main(PROG, body, usage(OSError, ValueError, KeyError))


def _add_ingest(commands) -> None:
    parser = commands.add_parser(
        "ingest", help="server log or events file -> requests.csv + summary.json, checked",
        description="Read a server log and/or a --cache-events file, write DIR/requests.csv and DIR/summary.json, "
                    "and run the checks (exit 1 when one fails). Give --log, --events, or both (then the rows "
                    "come from the log and are checked against the events).")
    parser.add_argument("--log", type=existing_file, default=None, metavar="FILE",
                        help="server log (SGLang Finish lines and SCR's splice/trace lines)")
    parser.add_argument("--events", type=existing_file, action="append", default=None, metavar="FILE",
                        help="the server's --cache-events file; repeat it for the workers behind a router "
                             "(eval.cluster): their events are merged in finishing order, a rid in two files fails")
    parser.add_argument("--client", type=existing_file, default=None, metavar="FILE",
                        help="client.jsonl (eval.workload, eval.replay): every client request must join one row (C1)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (requests.csv, summary.json)")
    parser.add_argument("--model-config", type=existing_file, default=None, metavar="FILE",
                        help="the model's config.json for N_body and FLOPs per query-key pair "
                             "(default: Qwen3.6-27B's numbers)")
    parser.add_argument("--policy", default=None, metavar="NAME",
                        help="policy name for the rows (default: from the log or the events); checked against the "
                             "events files' start-up records (S1)")
    parser.add_argument("--max-blocks", type=int_at_least(1), default=None, metavar="K",
                        help="SCR's K (blocks per request) when the log has no SCR banner (default: from the banner)")
    parser.add_argument("--moved-counted-once", action="store_true",
                        help="the server's cached_tokens counts relocated rows once, not twice")


def _add_compare(commands) -> None:
    parser = commands.add_parser(
        "compare", help="ingested runs -> side-by-side table and plots",
        description="Read directories written by 'ingest' and write DIR/table.md, table.csv, table.json, "
                    "provenance_stack.png and read_cdf.png (exit 1 when a run's checks failed).")
    parser.add_argument("--run", type=run_spec, action="append", required=True, metavar="NAME=DIR",
                        help="an ingested run and its name in the table; repeat for each run")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument("--baseline", default=None, metavar="NAME",
                        help="the run the ratios are to (default: the run named radix, else the first)")


def _compare(args) -> int:
    from eval.accounting import compare

    names = [name for name, _ in args.run]
    if len(set(names)) != len(names):
        raise UsageError(f"run names repeat: {names}")
    missing = [f"{name}={path}" for name, path in args.run if not path.is_dir()]
    if missing:
        raise UsageError(f"--run {', '.join(missing)}: no such directory")
    result = compare.compare(dict(args.run), args.out, baseline=args.baseline)
    print(result["markdown"])
    print(f"-> {', '.join(str(p) for p in result['files'])}")
    for name, failures in result["checks_failed"].items():
        for failure in failures:
            print(f"CHECK FAILED [{name}] {failure}", file=sys.stderr)
    return 1 if any(result["checks_failed"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
