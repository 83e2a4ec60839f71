"""Side-by-side table and plots over ingested runs (``docs/eval.md`` §5.9-§5.10, the token part).

Input: run directories written by ``python -m eval.report ingest`` (``requests.csv`` and
``summary.json``), by name. Output in ``out``:

* ``table.md`` / ``table.csv`` / ``table.json``: per run, prompt-token shares (prefix-reused,
  moved, read) for all requests and for the edited ones, PFLOPs per request and per
  conversation (primary 2·N_body·(read + decode), naive, and with attention, approximate), and
  their ratios to the baseline run (``radix`` when present), plus whether the run's checks passed;
* ``provenance_stack.png``: stacked bars of the prefix/moved/read shares per run, all requests
  and edited ones;
* ``read_cdf.png``: the CDF of read tokens per request, one line per run.

The runs' trajectories need not be identical (each arm's agent saw its own replies), so the
table shows the request and prompt-token counts next to the ratios.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from eval import plots

# (key, label, format); shares are fractions of the prompt tokens of the rows they cover.
METRICS = (
    ("requests", "requests", "{:d}"),
    ("conversations", "conversations", "{:d}"),
    ("edited_requests", "edited requests", "{:d}"),
    ("prompt_tokens", "prompt tokens", "{:,d}"),
    ("decode_tokens", "decode tokens", "{:,d}"),
    ("prefix_share", "prefix-reused share of prompt, all", "{:.1%}"),
    ("moved_share", "moved share of prompt, all", "{:.1%}"),
    ("read_share", "read share of prompt, all", "{:.1%}"),
    ("edited_prefix_share", "prefix-reused share of prompt, edited", "{:.1%}"),
    ("edited_moved_share", "moved share of prompt, edited", "{:.1%}"),
    ("edited_read_share", "read share of prompt, edited", "{:.1%}"),
    ("requests_with_relocation", "requests with relocation", "{:d}"),
    ("blocks", "relocated blocks", "{:d}"),
    ("pflops_per_request", "PFLOPs per request", "{:.6g}"),
    ("pflops_per_request_ratio", "  ratio to {baseline}", "{:.3f}"),
    ("pflops_per_conversation", "PFLOPs per conversation", "{:.6g}"),
    ("pflops_per_conversation_ratio", "  ratio to {baseline}", "{:.3f}"),
    ("naive_pflops_per_conversation", "naive PFLOPs per conversation (no cache)", "{:.6g}"),
    ("attn_pflops_per_conversation", "PFLOPs per conversation with attention (approx.)", "{:.6g}"),
    ("attn_pflops_per_conversation_ratio", "  ratio to {baseline}", "{:.3f}"),
    ("checks", "checks", "{}"),
)
COLOURS = {"prefix_reused": "#4c72b0", "moved": "#55a868", "read": "#c44e52"}


def read_run(path: Path) -> tuple[list[dict], dict]:
    with open(path / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in ("prompt_tokens", "prefix_reused", "moved", "read", "decode", "blocks"):
            row[key] = int(row[key])
        for key in ("pflops", "pflops_naive", "pflops_attn_approx"):
            row[key] = float(row[key])
    return rows, json.loads((path / "summary.json").read_text())


def _shares(rows: list[dict]) -> dict[str, float]:
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {k: (sum(r[k] for r in rows) / prompt if prompt else 0.0) for k in ("prefix_reused", "moved", "read")}


def metrics(rows: list[dict], summary: dict) -> dict:
    edited = [r for r in rows if r["class"] == "edited"]
    conversations = len({r["conversation"] for r in rows})
    everything, only_edited = _shares(rows), _shares(edited)
    total = {k: sum(r[k] for r in rows) for k in ("pflops", "pflops_naive", "pflops_attn_approx")}
    failed = summary.get("checks_failed", [])
    return {
        "requests": len(rows), "conversations": conversations, "edited_requests": len(edited),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows), "decode_tokens": sum(r["decode"] for r in rows),
        "prefix_share": everything["prefix_reused"], "moved_share": everything["moved"],
        "read_share": everything["read"], "edited_prefix_share": only_edited["prefix_reused"],
        "edited_moved_share": only_edited["moved"], "edited_read_share": only_edited["read"],
        "requests_with_relocation": sum(1 for r in rows if r["moved"] > 0), "blocks": sum(r["blocks"] for r in rows),
        "pflops_per_request": total["pflops"] / len(rows) if rows else 0.0,
        "pflops_per_conversation": total["pflops"] / conversations if conversations else 0.0,
        "naive_pflops_per_conversation": total["pflops_naive"] / conversations if conversations else 0.0,
        "attn_pflops_per_conversation": total["pflops_attn_approx"] / conversations if conversations else 0.0,
        "checks": "pass" if not failed else f"FAILED ({len(failed)})",
    }


def add_ratios(table: dict[str, dict], baseline: str) -> None:
    base = table[baseline]
    for values in table.values():
        for key in ("pflops_per_request", "pflops_per_conversation", "attn_pflops_per_conversation"):
            values[f"{key}_ratio"] = values[key] / base[key] if base[key] else float("nan")


def markdown(table: dict[str, dict], baseline: str) -> str:
    names = list(table)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for key, label, fmt in METRICS:
        cells = [fmt.format(table[name][key]) for name in names]
        lines.append(f"| {label.format(baseline=baseline)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_provenance(runs: dict[str, list[dict]], path: Path) -> None:
    labels, stacks = [], {k: [] for k in COLOURS}
    for name, rows in runs.items():
        for subset, selected in (("all", rows), ("edited", [r for r in rows if r["class"] == "edited"])):
            labels.append(f"{name}\n{subset}")
            shares = _shares(selected)
            for key in COLOURS:
                stacks[key].append(shares[key] * 100)
    fig, ax = plots.subplots(1.2 * len(labels) + 2, 4.5)
    plots.stacked_bars(ax, labels, [(key.replace("_", "-"), stacks[key], colour) for key, colour in COLOURS.items()],
                       width=0.7)
    ax.set_ylabel("share of prompt tokens (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Where prompt tokens came from")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, frameon=False)
    plots.save(fig, path)


def plot_read_cdf(runs: dict[str, list[dict]], path: Path) -> None:
    fig, ax = plots.subplots(6, 4.5)
    for name, rows in runs.items():
        plots.cdf_step(ax, [r["read"] for r in rows], name)
    ax.set_xlabel("read tokens per request (run through the model)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title("CDF of read tokens per request")
    ax.grid(alpha=0.3)
    ax.legend()
    plots.save(fig, path)


def compare(run_dirs: dict[str, Path], out: Path, baseline: str | None = None) -> dict:
    if not run_dirs:
        raise ValueError("no runs to compare")
    runs, table, failed = {}, {}, {}
    for name, path in run_dirs.items():
        rows, summary = read_run(Path(path))
        runs[name], table[name] = rows, metrics(rows, summary)
        failed[name] = summary.get("checks_failed", [])
    baseline = baseline or ("radix" if "radix" in table else next(iter(table)))
    if baseline not in table:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(table)}")
    add_ratios(table, baseline)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(table, baseline)
    (out / "table.md").write_text(text + "\n")
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["metric", *table])
        for key, _, _ in METRICS:
            writer.writerow([key, *(table[name][key] for name in table)])
    (out / "table.json").write_text(json.dumps(
        {"baseline": baseline, "runs": {n: str(p) for n, p in run_dirs.items()}, "table": table,
         "checks_failed": failed}, indent=2, sort_keys=True))
    plot_provenance(runs, out / "provenance_stack.png")
    plot_read_cdf(runs, out / "read_cdf.png")
    files = [out / n for n in ("table.md", "table.csv", "table.json", "provenance_stack.png", "read_cdf.png")]
    return {"table": table, "markdown": text, "baseline": baseline, "files": files, "checks_failed": failed}
