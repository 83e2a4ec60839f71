"""``python -m eval.report ingest --events FILE --out DIR [--model-config config.json]``.

Reads a server's ``--cache-events`` file, writes ``DIR/requests.csv`` (one row per request:
rid, policy, conversation, prompt_tokens, prefix_reused, moved, read, decode, class, pflops) and
``DIR/summary.json``, and runs the provenance checks (``eval/accounting/provenance.py``). Any
failed check is printed and the command exits with status 2: the run is not reportable.
PFLOPs use N_body of Qwen3.6-27B unless ``--model-config`` names another model's config.json.
(Ingesting plain SGLang/SCR server logs and ``compare`` are not built yet.)
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from pathlib import Path

from eval.accounting.flops import QWEN36_27B, geometry_from_config, n_body
from eval.accounting.provenance import check, rows_from_events, summary
from policy.events import read_events

CSV_FIELDS = ("rid", "policy", "conversation", "prompt_tokens", "prefix_reused", "moved", "read", "decode",
              "class", "pflops")


def ingest(events_path: Path, out: Path, model_config: Path | None = None) -> tuple[list, list[str]]:
    geometry = geometry_from_config(json.loads(model_config.read_text())) if model_config else QWEN36_27B
    body = n_body(geometry)
    rows = rows_from_events(read_events(str(events_path)), body)
    failures = check(rows, body)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            record = dataclasses.asdict(row)
            record["class"] = record.pop("klass")
            writer.writerow({k: record[k] for k in CSV_FIELDS})
    result = {**summary(rows), "n_body": body, "source": str(events_path), "checks_failed": failures}
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.report", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ingest_parser = commands.add_parser("ingest", help="events file -> requests.csv + summary.json")
    ingest_parser.add_argument("--events", type=Path, required=True)
    ingest_parser.add_argument("--out", type=Path, required=True)
    ingest_parser.add_argument("--model-config", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        rows, failures = ingest(args.events, args.out, args.model_config)
    except (OSError, ValueError) as exc:
        print(f"python -m eval.report: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(rows)} requests -> {args.out / 'requests.csv'}, {args.out / 'summary.json'}")
    for failure in failures:
        print(f"CHECK FAILED {failure}", file=sys.stderr)
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
