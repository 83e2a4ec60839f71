"""The files ``eval.bcp.compare`` writes: ``table.md``, ``table.csv``, ``table.json``,
``stats.json`` and ``plots/``. Whenever an arm is not a result, the table says "NOT A RESULT"
first, with the reasons."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from eval.bcp.compare_plots import plots
from eval.bcp.compare_table import STAMP


def _stamp_lines(result: dict) -> list[str]:
    if not result["not_a_result"]:
        return []
    lines = [f"# {STAMP}\n"]
    lines += [f"* **{name}**: " + "; ".join(reasons) for name, reasons in result["not_a_result"].items()]
    return lines + [""]


def _table_lines(result: dict) -> list[str]:
    header = ["group", "row", *[f"{a} ({p})" if a != p else a for a, p in zip(result["arms"], result["policies"])],
              "paper plain", "paper scr"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    group = None
    for r in result["rows"]:
        shown = r["group"] if r["group"] != group else ""
        group = r["group"]
        lines.append("| " + " | ".join([shown, r["row"], *[v.replace("|", "/") for v in r["values"]], *r["paper"]]) + " |")
    return lines


def render_markdown(result: dict) -> str:
    lines = _stamp_lines(result) + _table_lines(result)
    if result["notes"]:
        lines.append("\nDifferences let through with --ignore:\n")
        lines += [f"* {n}" for n in result["notes"]]
    failed = {k: v for k, v in result["checks"].items() if v}
    if failed:
        lines.append("\nFailed checks:\n")
        lines += [f"* {name}: {c}" for name, checks in failed.items() for c in checks]
    lines.append(f"\nBaseline of the paired statistics: {result['baseline']}; equivalence margin ±{100 * result['margin']:g} pp. "
                 "Comparisons other than scr vs plain are secondary (no multiplicity correction).")
    return "\n".join(lines) + "\n"


def write_csv(result: dict, path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["group", "row", *result["arms"], "paper plain", "paper scr"])
        for r in result["rows"]:
            writer.writerow([r["group"], r["row"], *r["values"], *r["paper"]])
        if result["not_a_result"]:
            writer.writerow([STAMP, "; ".join(f"{k}: {', '.join(v)}" for k, v in result["not_a_result"].items())])


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(render_markdown(result))
    write_csv(result, out / "table.csv")
    table = {k: result[k] for k in ("arms", "policies", "baseline", "margin", "rows", "notes", "not_a_result", "checks")}
    (out / "table.json").write_text(json.dumps(table, indent=1))
    (out / "stats.json").write_text(json.dumps({"not_a_result": result["not_a_result"], **result["stats"],
                                                "per_question": result["per_question"]}, indent=1, default=float))
    plots(result, out / "plots")
