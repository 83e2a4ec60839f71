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
two of them fails, unless the earlier copy was served before a restart (below).

**Restarts.** A server that starts again on the same events file starts with an empty cache
(``policy.events``: its start-up record says ``restart``), so the run is split there: each event
belongs to a *start*, (file, the number of start-up records before it in the file; 0 for events
written before start-up records existed). ``summary.json`` keeps the run's totals (``all``) and
adds ``starts``, one entry per start that served requests: ``{"file", "start", "restart",
"requests", "prefix_reused_share", "moved_share", "read_share"}``; ``requests.csv`` has the
``start`` of each row. When a start is a restart, ingest prints one line to stderr::

    eval.report ingest: the run was split at <N> restart(s): the cache starts cold at each; reuse before and after is reported per start (summary.json "starts")

A rid served twice is a client's retry when the earlier copy's start is not the last of its file
(a restart of its server ended it): the later copy is kept, and the rid is listed in
``retried_after_restart``. Any other repeat across files still fails.

**Lost writes.** The events files' cut lines and ``lost`` markers (``serving/jsonl_append.py``)
go into ``summary.json`` as ``cut_lines`` (messages) and ``lost_records`` (the markers' sum); with
``--client``, ``missing_records`` (how many of the client's rids have no event; null without
``--client``), ``missing_rids`` (those rids) and, when some exist, one more C1 failure:
``C1: <n> answered calls have no event; the events files record <m> lost writes (disk full?)``.

Each events file's start-up record is copied into ``summary.json``
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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from eval.accounting import server_log
from eval.accounting.flops import QWEN36_27B, flops_per_pair, geometry_from_config, n_body
from eval.cli_types import Parser, UsageError, existing_file, int_at_least, run_main, run_spec, usage
from eval.accounting.provenance import (check, check_against_events, check_client, lost_writes_failure,
                                       missing_events, rows_from_events, summary)
from policy.events import event_of, is_startup, read_jsonl

CSV_FIELDS = ("rid", "policy", "conversation", "session", "prev_prompt_tokens", "class", "prompt_tokens",
              "cached_tokens", "prefix_reused", "moved", "read", "decode", "blocks", "pflops", "pflops_naive",
              "pflops_attn_approx", "start")
SPLIT_LINE = ("eval.report ingest: the run was split at {n} restart(s): the cache starts cold at each; "
              "reuse before and after is reported per start (summary.json \"starts\")")


def read_client(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def path_list(paths: Path | Sequence[Path] | None) -> list:
    """``--events`` as given (one path, several, or none) as a list."""
    return [] if paths is None else [paths] if isinstance(paths, (str, Path)) else list(paths)


@dataclass
class EventsFile:
    """One events file's request events, each with its start index (module docstring)."""

    path: str
    events: list  # (start index, RequestEvent), in file order
    restarts: dict  # start index -> whether that start was a restart
    last_start: int  # the start index of the file's last start (0: no start-up record)
    cut: list
    lost: int


def read_events_file(path) -> EventsFile:
    """An events file read once: its events tagged with their start, its starts, its health."""
    path = str(path)
    read = read_jsonl(path)
    start, restarts, events = 0, {0: False}, []
    for number, row in read.rows:
        if is_startup(row):
            start += 1
            restarts[start] = bool(row.get("restart", start > 1))
        else:
            events.append((start, event_of(path, number, row)))
    return EventsFile(path, events, restarts, start, read.cut, read.lost)


@dataclass
class MergedEvents:
    """The events of a run's files, merged: ``segments[i]`` is ``(file, start)`` of ``events[i]``."""

    events: list
    segments: list
    files: list  # EventsFile, in the order given
    retried: list  # rids whose earlier copy, served before a restart, was dropped

    def segment_of(self) -> dict:
        """rid -> (file, start) of its kept copy."""
        return dict(zip((e.rid for e in self.events), self.segments))

    def starts(self) -> list[tuple[str, int, bool]]:
        """(file, start, restart) of every start that served an event, in file then start order."""
        order = {f.path: i for i, f in enumerate(self.files)}
        restarts = {(f.path, start): flag for f in self.files for start, flag in f.restarts.items()}
        return [(path, start, restarts[path, start])
                for path, start in sorted(set(self.segments), key=lambda seg: (order[seg[0]], seg[1]))]


def merged_run(paths: Path | Sequence[Path]) -> MergedEvents:
    """The request events of one events file, or of several (one per worker behind a router),
    merged in finishing order, each with its start. A rid served twice keeps its later copy when
    the earlier one's start was ended by a restart (``retried``); otherwise a rid in two files is
    a ``ValueError`` (a call is served once), and one file keeps both copies."""
    files = [read_events_file(path) for path in path_list(paths)]
    tagged = [(event, (f.path, start)) for f in files for start, event in f.events]
    if len(files) > 1:
        tagged.sort(key=lambda item: item[0].finished_ts)
    kept, retried = _drop_retried(tagged, {f.path: f.last_start for f in files}, len(files) > 1)
    return MergedEvents([tagged[i][0] for i in kept], [tagged[i][1] for i in kept], files, retried)


def _drop_retried(tagged: list, last: dict, several: bool) -> tuple[list[int], list[str]]:
    """Indices of ``tagged`` to keep, and the rids retried after a restart (module docstring):
    an earlier copy whose start is not its file's last is dropped; any other copy in another
    file fails; copies in one start of one file (a single file) are all kept, as they always were."""
    kept: set[int] = set()
    copies: dict[str, list[int]] = {}
    retried: list[str] = []
    for i, (event, segment) in enumerate(tagged):
        for j in copies.get(event.rid, []):
            earlier = tagged[j][1]
            if earlier != segment and earlier[1] != last[earlier[0]]:
                kept.discard(j)
                retried += [] if event.rid in retried else [event.rid]
            elif several:
                raise ValueError(f"rid {event.rid} is in {earlier[0]} and in {segment[0]}")
        copies[event.rid] = [j for j in copies.get(event.rid, []) if j in kept] + [i]
        kept.add(i)
    return sorted(kept), retried


def merged_events(paths: Path | Sequence[Path]) -> list:
    """``merged_run``'s events alone."""
    return merged_run(paths).events


def start_summaries(rows: Sequence, merged: MergedEvents) -> list[dict]:
    """``summary.json``'s ``starts``: the shares of each start that served rows, by ``summary``'s
    rule for "all" (a log's rows join their start by rid)."""
    segment_of = merged.segment_of()
    entries = []
    for path, start, restart in merged.starts():
        block = summary([row for row in rows if segment_of.get(row.rid) == (path, start)])["all"]
        if block["requests"]:
            entries.append({"file": path, "start": start, "restart": restart, "requests": block["requests"],
                            **{key: block[key] for key in ("prefix_reused_share", "moved_share", "read_share")}})
    return entries


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
    merged = merged_run(events_path) if events_path is not None else None
    if log_path is not None:
        rows, failures, extra = _log_rows(log_path, merged, body, pair, policy, max_blocks, moved_count_in_cached)
    else:
        rows, failures, extra = _event_rows(merged, body, pair, policy)
    extra.update(write_health(merged), starts=start_summaries(rows, merged) if merged is not None else [])
    if client_path is not None:
        failures += _client_checks(rows, read_client(client_path), merged, extra)
    startups, startup_failures = startup_checks(events_path, policy)
    failures += startup_failures
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "requests.csv", rows)
    result = {**summary(rows), **extra, "n_body": body, "flops_per_pair": pair, "startup": startups,
              "sources": {"log": _str(log_path), "events": _paths(events_path), "client": _str(client_path)},
              "checks_failed": failures}
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    restarts = sum(1 for entry in result["starts"] if entry["restart"])
    if restarts:
        print(SPLIT_LINE.format(n=restarts), file=sys.stderr)
    return rows, failures


def _log_rows(log_path: Path, merged: MergedEvents | None, body: float, pair: int, policy: str | None,
              max_blocks: int | None, moved_count_in_cached: int) -> tuple[list, list[str], dict]:
    """Rows from a server log, checked (and against the events, X1, when there are some)."""
    with open(log_path, errors="replace") as f:
        parsed = server_log.parse_log(f)
    rows = server_log.rows_from_log(parsed, body, pair, policy=policy, moved_count_in_cached=moved_count_in_cached)
    failures = check(rows, body) + server_log.check_log(parsed, max_blocks)
    if merged is not None:
        failures += check_against_events(rows, merged.events)
        segment_of = merged.segment_of()
        rows = [dataclasses.replace(row, start=segment_of[row.rid][1]) if row.rid in segment_of else row
                for row in rows]
    extra = {"max_blocks": server_log.max_blocks(parsed, max_blocks), "scr_banner": parsed.banner,
             "moved_count_in_cached": moved_count_in_cached}
    return rows, failures, extra


def _event_rows(merged: MergedEvents, body: float, pair: int, policy: str | None) -> tuple[list, list[str], dict]:
    """Rows from the events files, checked."""
    rows = rows_from_events(merged.events, body, pair, merged.segments)
    if policy is not None:
        rows = [dataclasses.replace(row, policy=policy) for row in rows]
    return rows, check(rows, body), {}


def _client_checks(rows: list, client: list[dict], merged: MergedEvents | None, extra: dict) -> list[str]:
    """C1, and ``missing_records`` / ``missing_rids`` in ``extra``: how many of the client's rids, and
    which, have no event (no row, without events files), set beside the lost writes."""
    failures = check_client(rows, client)
    served = (e.rid for e in merged.events) if merged is not None else (r.rid for r in rows)
    missing = missing_events(client, served)
    extra.update(missing_records=len(missing), missing_rids=missing)
    if merged is not None:
        failures += lost_writes_failure(len(missing), extra["lost_records"])
    return failures


def _write_csv(path: Path, rows: list) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            record = dataclasses.asdict(row)
            record["class"] = record.pop("klass")
            writer.writerow({k: "" if record[k] is None else record[k] for k in CSV_FIELDS})


def write_health(merged: MergedEvents | None) -> dict:
    """``summary.json``'s fields on the events files' writes and retries (module docstring);
    ``missing_records`` is null until a client file says which calls were answered."""
    if merged is None:
        return {"retried_after_restart": [], "lost_records": 0, "cut_lines": [], "missing_records": None,
                "missing_rids": None}
    return {"retried_after_restart": merged.retried, "lost_records": sum(f.lost for f in merged.files),
            "cut_lines": [message for f in merged.files for message in f.cut], "missing_records": None,
            "missing_rids": None}


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
