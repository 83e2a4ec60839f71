"""Side-by-side comparison of BCP runs under different cache policies (``eval_spec.md`` §5.8-§5.10).

    python -m eval.bcp.compare --runs radix=runs/radix exact=runs/exact [scr=runs/scr] --out compare/NAME \\
        [--baseline radix] [--margin 3] [--model-config MODEL/config.json] [--ignore KEY ...]

The first run (or ``--baseline``) is the reference of the paired statistics. The command refuses
(exit 2) to compare runs whose manifests differ in anything but the policy (model, server settings
that must match, SGLang version, agent config, retrieval, dataset and question list, concurrency,
the agent code's fingerprint; ``run.comparable``; the git commit is shown, not compared); ``--ignore KEY`` lets a named difference through and prints it in
the table. Each run must have been scored (``python -m eval.bcp.run judge|score``).

Token accounting comes from each run's ``events.jsonl`` (the server's ``--cache-events`` lines of
the run's rids) through ``eval.report.ingest``; only the requests of a question's final attempt
count towards it (requests of an interrupted attempt are reported as abandoned). Writes
``table.md``, ``table.csv``, ``table.json``, ``stats.json`` and ``plots/*.png``. When any run is not
a result (judge failures, unjudged questions, a stub server, a run stamped ``--not-a-result``) the
table and every plot carry "NOT A RESULT" and the reasons.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eval.bcp import journal as journal_mod
from eval.bcp import stats
from eval.bcp.run import MANIFEST, comparable

PAPER = {  # eval_spec.md §0.3 / §5.9: plain SGLang and SCR on BCP-830 (reported)
    "accuracy": ("60.2%", "60.2%"), "pflops": ("10.98", "7.14"), "ratio": ("1", "0.650"), "relocated_share": ("0", "7.8%"),
}
STAMP = "NOT A RESULT"


class CompareError(Exception):
    """Runs that cannot be compared; the message says why."""


@dataclass
class Arm:
    name: str
    path: Path
    manifest: dict
    summary: dict
    per_question: dict[str, dict]  # qid -> score row
    records: dict[str, dict]  # qid -> run record
    requests: list = field(default_factory=list)  # accounting rows of final attempts
    abandoned: list = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    client_rows: list[dict] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.manifest.get("policy", "?")


# ---- loading


def load_arm(name: str, path: Path, out: Path, model_config: Path | None) -> Arm:
    from eval import report

    manifest = json.loads((path / MANIFEST).read_text())
    scores_path = path / "scores.json"
    if not scores_path.exists():
        raise CompareError(f"{path}: not scored; run `python -m eval.bcp.run judge --run {path} ...` first")
    scores = json.loads(scores_path.read_text())
    records = {r["query_id"]: r for r in journal_mod.Journal(path).records()}
    arm = Arm(name, path, manifest, scores["summary"], {r["query_id"]: r for r in scores["per_question"]}, records)
    client = path / "client_requests.jsonl"
    arm.client_rows = [json.loads(l) for l in client.read_text().splitlines() if l.strip()] if client.exists() else []
    events = path / "events.jsonl"
    if not events.exists() or not events.read_text().strip():
        arm.checks.append("E0 no events.jsonl (run without --events?): no token accounting")
        return arm
    rows, failures = report.ingest(events, out / "accounting" / name, model_config)
    arm.checks += failures
    final = {(journal_mod.safe_qid(q), r.get("attempt", 0)): q for q, r in records.items()}
    for row in rows:
        parsed = journal_mod.parse_rid(row.rid)
        qid = final.get((parsed[1], parsed[2])) if parsed else None
        (arm.requests if qid is not None else arm.abandoned).append((qid, parsed[3] if parsed else -1, row))
    # C1: every final-attempt client request has exactly one event, with the same prompt count.
    by_rid = {row.rid: row for _, _, row in arm.requests}
    wanted = [rid for r in records.values() for rid in r.get("rids", [])]
    missing = [rid for rid in wanted if rid not in by_rid]
    if missing:
        arm.checks.append(f"C1 {len(missing)} request(s) without an event, e.g. {missing[:3]}")
    usage = {c["rid"]: c.get("usage") or {} for c in arm.client_rows}
    mismatched = [rid for rid, row in by_rid.items() if usage.get(rid, {}).get("prompt_tokens") not in (None, row.prompt_tokens)]
    if mismatched:
        arm.checks.append(f"C1 client prompt_tokens != event prompt_tokens for {mismatched[:3]}")
    policies = {row.policy for _, _, row in arm.requests}
    if policies and policies != {arm.policy}:
        arm.checks.append(f"I3 events say policy {sorted(policies)}, the manifest says {arm.policy!r}")
    return arm


def check_comparable(arms: list[Arm], ignore: set[str], same_policy: bool = False) -> list[str]:
    """Differences other than the policy; raises CompareError unless every one is ignored."""
    base = comparable(arms[0].manifest)
    notes, problems = [], []
    for arm in arms[1:]:
        other = comparable(arm.manifest)
        for key in base:
            if base[key] != other[key]:
                detail = _diff_detail(base[key], other[key])
                line = f"{arm.name} vs {arms[0].name}: {key} differs{detail}"
                (notes if key in ignore else problems).append(line)
    policies = [a.policy for a in arms]
    if not same_policy and len(set(policies)) != len(policies):
        problems.append(f"two runs share a policy: {policies}")
    if problems:
        raise CompareError("runs differ in more than the policy:\n  " + "\n  ".join(problems))
    return notes


def _diff_detail(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return f" ({', '.join(f'{k}: {a.get(k)!r} vs {b.get(k)!r}' for k in keys[:6])})"
    return f" ({str(a)[:60]!r} vs {str(b)[:60]!r})"


# ---- per-question numbers


def question_tokens(arm: Arm, body_params: float, pair_flops: int) -> dict[str, dict]:
    from eval.accounting.flops import naive_pflops, with_attention_pflops

    out = {q: {"P": 0, "R": 0, "M": 0, "F": 0, "D": 0, "requests": 0, "pflops": 0.0, "naive": 0.0, "attn": 0.0}
           for q in arm.records}
    for qid, _, row in arm.requests:
        t = out[qid]
        t["P"] += row.prompt_tokens
        t["R"] += row.prefix_reused
        t["M"] += row.moved
        t["F"] += row.read
        t["D"] += row.decode
        t["requests"] += 1
        t["pflops"] += row.pflops
        t["naive"] += naive_pflops(row.prompt_tokens, row.decode, body_params)
        t["attn"] += with_attention_pflops(row.prompt_tokens, row.read, row.decode, body_params, pair_flops)
    return out


def _mean_ci(values: list[float], seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(x.mean()), float(lo), float(hi)


def _ratio_ci(base: list[float], arm: list[float], seed: int = 0, resamples: int = 10_000) -> tuple[float, float, float]:
    """Ratio of means arm/base with a paired bootstrap over questions."""
    a, b = np.asarray(base, dtype=float), np.asarray(arm, dtype=float)
    if a.size == 0 or a.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(resamples, a.size))
    den = a[idx].sum(axis=1)
    ratios = np.where(den > 0, b[idx].sum(axis=1) / np.where(den > 0, den, 1), np.nan)
    lo, hi = np.nanquantile(ratios, [0.025, 0.975])
    return float(b.sum() / a.sum()), float(lo), float(hi)


# ---- the table


def _pct(x, digits=1) -> str:
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{100 * x:.{digits}f}%"


def _num(x, digits=2) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def build(arms: list[Arm], *, margin: float, notes: list[str], body_params: float, pair_flops: int,
          resamples: int = 10_000, seed: int = 0, aa: Arm | None = None) -> dict:
    base = arms[0]
    qids = list(base.manifest["dataset"]["question_ids"])
    correct = {a.name: {q: bool(a.per_question.get(q, {}).get("correct")) for q in qids} for a in arms}
    floor = None
    if aa is not None:
        floor = stats.noise_floor(correct[base.name], {q: bool(aa.per_question.get(q, {}).get("correct")) for q in qids})
    tokens = {a.name: question_tokens(a, body_params, pair_flops) for a in arms}
    paired = {a.name: stats.compare_arms(correct[base.name], correct[a.name], margin=margin,
                                         num_resamples=resamples, seed=seed) for a in arms[1:]}
    reasons = {a.name: list(a.summary.get("not_a_result") or []) + [f"check failed: {c}" for c in a.checks] for a in arms}
    table: list[tuple[str, str, list[str], tuple[str, str]]] = []  # (group, row, values, paper)

    def row(group, label, values, paper=("—", "—")):
        table.append((group, label, [str(v) for v in values], paper))

    def per_arm(fn):
        return [fn(a) for a in arms]

    # setup
    row("setup", "policy", per_arm(lambda a: a.policy))
    row("setup", "model", per_arm(lambda a: a.manifest.get("model", {}).get("served")))
    row("setup", "SGLang", per_arm(lambda a: a.manifest.get("server", {}).get("sglang_version")))
    row("setup", "server kind", per_arm(lambda a: a.manifest.get("server", {}).get("kind")))
    row("setup", "retriever (k, snippet tokens)", per_arm(lambda a: (
        f"{a.manifest.get('retrieval', {}).get('backend')} "
        f"(k={a.manifest['agent']['config']['search']['k']}, {a.manifest['agent']['config']['search']['snippet_max_tokens']})")))
    row("setup", "agent config", per_arm(lambda a: f"{a.manifest['agent']['config']['mode']} {a.manifest['agent'].get('fingerprint')}"))
    row("setup", "enable/preserve thinking", per_arm(lambda a: "{enable_thinking}/{preserve_thinking}".format(**a.manifest["agent"]["chat_template_kwargs"])))
    row("setup", "questions; concurrency; seed", per_arm(lambda a: f"{len(a.records)}; {a.manifest['run']['concurrency']}; {a.manifest['run'].get('seed')}"))
    row("setup", "git commit", per_arm(lambda a: (a.manifest["run"]["git"].get("commit") or "?")[:10] + ("+dirty" if a.manifest["run"]["git"].get("dirty") else "")))
    row("setup", "server args differing from " + base.name, per_arm(lambda a: _server_arg_diff(base, a) or "—"))

    # accuracy
    def acc(a):
        s = stats.arm_summary([correct[a.name][q] for q in qids])
        return f"{100 * s['accuracy']:.1f}% [{100 * s['wilson'][0]:.1f}, {100 * s['wilson'][1]:.1f}]"

    row("accuracy", "accuracy [Wilson 95%]", per_arm(acc), PAPER["accuracy"])
    row("accuracy", f"Δ vs {base.name} [paired bootstrap 95%]", per_arm(lambda a: "—" if a is base else (
        "{:+.1f} pp [{:+.1f}, {:+.1f}]".format(100 * paired[a.name]["bootstrap"]["diff"], 100 * paired[a.name]["bootstrap"]["low"],
                                              100 * paired[a.name]["bootstrap"]["high"]))))
    row("accuracy", "b / c / discordance", per_arm(lambda a: "—" if a is base else "{} / {} / {:.3f}".format(
        paired[a.name]["paired"]["b"], paired[a.name]["paired"]["c"], paired[a.name]["paired"]["discordance"])))
    row("accuracy", "exact McNemar p", per_arm(lambda a: "—" if a is base else f"{paired[a.name]['paired']['mcnemar_p']:.3g}"))
    row("accuracy", f"TOST ±{100 * margin:g} pp (90% CI)", per_arm(lambda a: "—" if a is base else "{} [{:+.1f}, {:+.1f}]".format(
        "equivalent" if paired[a.name]["tost"]["equivalent"] else "not shown equivalent",
        100 * paired[a.name]["tost"]["ci_low"], 100 * paired[a.name]["tost"]["ci_high"])))
    row("accuracy", f"A/A discordance (noise floor: {base.name} twice)", per_arm(
        lambda a: "—" if floor is None else (f"{floor['discordance']:.3f} (b {floor['b']}, c {floor['c']})" if a is base
                                             else f"{paired[a.name]['paired']['discordance']:.3f} here")))
    row("accuracy", "completed", per_arm(lambda a: f"{a.summary['completed']}/{a.summary['questions']}"))
    row("accuracy", "judged; judge failures (counted wrong)", per_arm(lambda a: f"{a.summary['judged']}; {a.summary['judge_parse_errors']}"))

    # BCP secondary
    m = {a.name: a.summary.get("metrics", {}) for a in arms}
    row("BCP secondary", "evidence recall", per_arm(lambda a: _num(m[a.name].get("recall"), 1) + ("%" if m[a.name].get("recall") is not None else "")))
    row("BCP secondary", "search calls per question", per_arm(lambda a: _num(m[a.name].get("search_calls"), 2)))
    row("BCP secondary", "calibration error (needs >= 100 judged)", per_arm(lambda a: f"{_num(m[a.name].get('calibration_error'), 1)}% ({m[a.name].get('calibration_items', 0)} items)"))
    row("BCP secondary", "citations coverage / precision / recall", per_arm(lambda a: _citations(m[a.name].get("citations"))))

    # agent behaviour
    def pq(a, key):
        return [a.per_question[q].get(key) or 0 for q in qids if q in a.per_question]

    row("agent behaviour", "LM calls per question (mean / median)", per_arm(lambda a: f"{_num(_mean(pq(a, 'lm_calls')))} / {_num(_median(pq(a, 'lm_calls')), 1)}"))
    row("agent behaviour", "task steps per question", per_arm(lambda a: _num(_mean(pq(a, "steps")))))
    row("agent behaviour", "free edit turns; edits accepted / rejected", per_arm(lambda a: f"{sum(pq(a, 'free_ctx_turns'))}; {sum(pq(a, 'ctx_accepted'))} / {sum(pq(a, 'ctx_rejected'))}"))
    row("agent behaviour", "nudges; rollbacks", per_arm(lambda a: f"{sum(pq(a, 'nudges'))}; {sum(pq(a, 'retries_on_limit'))}"))
    row("agent behaviour", "status counts", per_arm(lambda a: ", ".join(f"{k} {v}" for k, v in sorted(_count(r["status"] for r in a.records.values()).items()))))

    # tokens per question
    def tok(a, key):
        return [tokens[a.name][q][key] for q in qids if q in tokens[a.name]]

    def share(a, key):
        total = sum(tok(a, "P"))
        return sum(tok(a, key)) / total if total else None

    row("tokens per question", "prompt P", per_arm(lambda a: _num(_mean(tok(a, "P")), 0)))
    row("tokens per question", "prefix-reused R (% of P)", per_arm(lambda a: f"{_num(_mean(tok(a, 'R')), 0)} ({_pct(share(a, 'R'))})"))
    row("tokens per question", "moved M (% of P)", per_arm(lambda a: f"{_num(_mean(tok(a, 'M')), 0)} ({_pct(share(a, 'M'))})"), PAPER["relocated_share"])
    row("tokens per question", "read F (% of P)", per_arm(lambda a: f"{_num(_mean(tok(a, 'F')), 0)} ({_pct(share(a, 'F'))})"))
    row("tokens per question", "decode D", per_arm(lambda a: _num(_mean(tok(a, "D")), 0)))
    row("tokens per question", "requests per question; abandoned requests", per_arm(lambda a: f"{_num(_mean(tok(a, 'requests')))}; {len(a.abandoned)}"))

    # by class
    for klass in ("first", "append", "edited"):
        def by_class(a, klass=klass):
            rows = [r for _, _, r in a.requests if r.klass == klass]
            p = sum(r.prompt_tokens for r in rows)
            if not rows:
                return "0"
            return (f"{len(rows)} req; R {_pct(sum(r.prefix_reused for r in rows) / p if p else None)}, "
                    f"M {_pct(sum(r.moved for r in rows) / p if p else None)}, F {_pct(sum(r.read for r in rows) / p if p else None)}")
        row("by class", klass, per_arm(by_class))

    # relocation
    def relocation(a):
        rows = [r for _, _, r in a.requests]
        moved = [r for r in rows if r.moved > 0]
        edited = [r for r in rows if r.klass == "edited"]
        non_radix = sum(r.prompt_tokens - r.prefix_reused for r in rows)
        return (f"{len(moved)} req; {_num(sum(r.moved for r in edited) / len(edited), 1) if edited else '—'} per edited; "
                f"{_pct(sum(r.moved for r in rows) / non_radix if non_radix else None)} of non-radix")
    row("relocation", "requests with relocation; moved per edited request; share of non-radix", per_arm(relocation))

    # compute
    pf = {a.name: _mean_ci(tok(a, "pflops"), seed) for a in arms}
    row("compute", "prefix-reuse PFLOPs per question [95% CI]", per_arm(lambda a: "{:.4g} [{:.4g}, {:.4g}]".format(*pf[a.name])), PAPER["pflops"])
    ratio = {a.name: _ratio_ci(tok(base, "pflops"), tok(a, "pflops"), seed) for a in arms[1:]}
    row("compute", f"ratio vs {base.name} [paired bootstrap 95%]", per_arm(lambda a: "1" if a is base else "{:.3f} [{:.3f}, {:.3f}]".format(*ratio[a.name])), PAPER["ratio"])
    row("compute", "naive PFLOPs per question (no cache)", per_arm(lambda a: f"{_mean(tok(a, 'naive')):.4g}"))
    row("compute", "PFLOPs with attention per question (approx.)", per_arm(lambda a: f"{_mean(tok(a, 'attn')):.4g}"))
    def paired_wilcoxon(a):
        if a is base:
            return "—"
        try:
            from scipy.stats import wilcoxon

            diffs = np.asarray(tok(a, "pflops")) - np.asarray(tok(base, "pflops"))
            return "—" if not np.any(diffs) else f"{wilcoxon(diffs).pvalue:.3g}"
        except Exception:
            return "—"
    row("compute", "Wilcoxon signed-rank p (per-question PFLOPs)", per_arm(paired_wilcoxon))

    # latency (secondary; no streaming, so no TTFT)
    def latency(a):
        secs = [c["seconds"] for c in a.client_rows if c.get("usage")]
        if not secs:
            return "—"
        return f"{np.percentile(secs, 50):.2f} / {np.percentile(secs, 90):.2f} s"
    row("latency", "request seconds p50 / p90", per_arm(latency))
    row("latency", "wall seconds per question (mean)", per_arm(lambda a: _num(_mean([r.get("wall_s") or 0 for r in a.records.values()]))))

    # checks
    row("checks", "accounting and join checks", per_arm(lambda a: "pass" if not a.checks else f"FAIL ({len(a.checks)})"))
    row("checks", "requests ingested", per_arm(lambda a: str(len(a.requests) + len(a.abandoned))))

    stamped = {name: r for name, r in reasons.items() if r}
    return {"arms": [a.name for a in arms], "policies": [a.policy for a in arms], "baseline": base.name,
            "margin": margin, "rows": [{"group": g, "row": l, "values": v, "paper": list(p)} for g, l, v, p in table],
            "notes": notes, "not_a_result": stamped, "checks": {a.name: a.checks for a in arms},
            "stats": {"paired": paired, "pflops": pf, "ratio": ratio, "noise_floor": floor},
            "per_question": {a.name: {q: {"correct": correct[a.name][q], **tokens[a.name].get(q, {})} for q in qids} for a in arms}}


def _server_arg_diff(base: Arm, arm: Arm) -> str:
    if arm is base:
        return ""
    a, b = base.manifest.get("server", {}).get("args", {}), arm.manifest.get("server", {}).get("args", {})
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}={b.get(k)}" for k in keys[:12]) + (" …" if len(keys) > 12 else "")


def _citations(c) -> str:
    if not c:
        return "—"
    return f"{_num(c.get('coverage'), 1)} / {_num(c.get('precision'), 1)} / {_num(c.get('recall'), 1)}"


def _mean(values):
    return float(statistics.fmean(values)) if values else float("nan")


def _median(values):
    return float(statistics.median(values)) if values else float("nan")


def _count(items):
    out = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# ---- writing


def render_markdown(result: dict) -> str:
    arms = result["arms"]
    lines = []
    if result["not_a_result"]:
        lines.append(f"# {STAMP}\n")
        for name, reasons in result["not_a_result"].items():
            lines.append(f"* **{name}**: " + "; ".join(reasons))
        lines.append("")
    header = ["group", "row", *[f"{a} ({p})" if a != p else a for a, p in zip(arms, result["policies"])], "paper plain", "paper scr"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    group = None
    for r in result["rows"]:
        shown = r["group"] if r["group"] != group else ""
        group = r["group"]
        lines.append("| " + " | ".join([shown, r["row"], *[v.replace("|", "/") for v in r["values"]], *r["paper"]]) + " |")
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


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(render_markdown(result))
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["group", "row", *result["arms"], "paper plain", "paper scr"])
        for r in result["rows"]:
            writer.writerow([r["group"], r["row"], *r["values"], *r["paper"]])
        if result["not_a_result"]:
            writer.writerow([STAMP, "; ".join(f"{k}: {', '.join(v)}" for k, v in result["not_a_result"].items())])
    table = {k: result[k] for k in ("arms", "policies", "baseline", "margin", "rows", "notes", "not_a_result", "checks")}
    (out / "table.json").write_text(json.dumps(table, indent=1))
    (out / "stats.json").write_text(json.dumps({"not_a_result": result["not_a_result"], **result["stats"],
                                                "per_question": result["per_question"]}, indent=1, default=float))
    plots(result, out / "plots")


def plots(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    arms, base = result["arms"], result["baseline"]
    pq = result["per_question"]
    stamp = (STAMP + " — ") if result["not_a_result"] else ""
    written = []

    def finish(fig, name, title):
        fig.suptitle(stamp + title, color="red" if stamp else "black", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)

    # 1. accuracy with Wilson CIs, and paired differences with the margin band
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for i, arm in enumerate(arms):
        outcomes = [v["correct"] for v in pq[arm].values()]
        s = stats.arm_summary(outcomes)
        ax1.errorbar(i, 100 * s["accuracy"], yerr=[[100 * (s["accuracy"] - s["wilson"][0])], [100 * (s["wilson"][1] - s["accuracy"])]],
                     fmt="o", capsize=5)
    ax1.set_xticks(range(len(arms)), arms)
    ax1.set_ylabel("accuracy % (Wilson 95%)")
    margin = 100 * result["margin"]
    ax2.axvspan(-margin, margin, color="0.9")
    for i, arm in enumerate(arms[1:]):
        b = result["stats"]["paired"][arm]["bootstrap"]
        ax2.errorbar(100 * b["diff"], i, xerr=[[100 * (b["diff"] - b["low"])], [100 * (b["high"] - b["diff"])]], fmt="o", capsize=5)
    ax2.axvline(0, color="k", lw=0.5)
    ax2.set_yticks(range(len(arms) - 1), [f"{a} − {base}" for a in arms[1:]])
    ax2.set_xlabel(f"accuracy difference, pp (band ±{margin:g})")
    finish(fig, "accuracy_ci.png", "Accuracy per arm and paired differences")

    # 2. per-question PFLOPs vs the baseline
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    colors = {(True, True): "tab:green", (True, False): "tab:orange", (False, True): "tab:blue", (False, False): "0.6"}
    points = []
    for arm, marker in zip(arms[1:], "os^"):
        for q, v in pq[arm].items():
            x, y = pq[base][q].get("pflops", 0), v.get("pflops", 0)
            if x > 0 and y > 0:
                ax.scatter(x, y, marker=marker, color=colors[(pq[base][q]["correct"], v["correct"])], s=18)
                points += [x, y]
    if points:
        lo, hi = min(points) / 2, max(points) * 2
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.7)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    handles = [Line2D([], [], ls="", marker=m, color="k", label=a) for a, m in zip(arms[1:], "os^")]
    handles += [Line2D([], [], ls="", marker="o", color=c, label=l) for c, l in
                (("tab:green", "correct in both"), ("tab:orange", f"{base} only"), ("tab:blue", "arm only"), ("0.6", "neither"))]
    ax.legend(handles=handles, fontsize=7)
    ax.set_xlabel(f"{base} PFLOPs per question")
    ax.set_ylabel("arm PFLOPs per question")
    finish(fig, "pflops_paired.png", f"Per-question PFLOPs vs {base}")

    # 3. prompt-token provenance shares
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels, parts = [], {"R": [], "M": [], "F": []}
    for arm in arms:
        total = {k: sum(v.get(k, 0) for v in pq[arm].values()) for k in ("P", "R", "M", "F")}
        labels.append(arm)
        for k in parts:
            parts[k].append(total[k] / total["P"] if total["P"] else 0)
    bottom = np.zeros(len(labels))
    for k, color in zip(("R", "M", "F"), ("tab:green", "tab:purple", "tab:red")):
        ax.bar(labels, parts[k], bottom=bottom, color=color, label={"R": "prefix-reused", "M": "moved", "F": "read"}[k])
        bottom += np.asarray(parts[k])
    ax.set_ylabel("share of prompt tokens")
    ax.legend(fontsize=8)
    finish(fig, "provenance_stack.png", "Where prompt tokens came from")

    # 4. CDF of read (forwarded) tokens per question
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for arm in arms:
        values = np.sort([v.get("F", 0) for v in pq[arm].values()])
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=arm)
    ax.set_xlabel("read tokens per question")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=8)
    finish(fig, "forwarded_cdf.png", "Read (forwarded) tokens per question")
    return written


def main(argv: list[str] | None = None) -> int:
    from eval.accounting.flops import QWEN36_27B, flops_per_pair, geometry_from_config, n_body

    parser = argparse.ArgumentParser(prog="python -m eval.bcp.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", required=True, metavar="NAME=DIR", help="two or three runs (first = baseline)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--baseline", default=None, help="the reference arm (default: the first)")
    parser.add_argument("--margin", type=float, default=3.0, help="equivalence margin in percentage points")
    parser.add_argument("--model-config", type=Path, default=None, help="config.json for N_body (default Qwen3.6-27B)")
    parser.add_argument("--aa", type=Path, default=None, metavar="DIR",
                        help="a second run of the baseline policy: its discordance with the baseline is the A/A noise floor")
    parser.add_argument("--ignore", action="append", default=[], help="a manifest key allowed to differ (see run.comparable)")
    parser.add_argument("--resamples", type=int, default=10_000)
    args = parser.parse_args(argv)
    try:
        specs = []
        for spec in args.runs:
            name, _, path = spec.partition("=") if "=" in spec else (None, None, spec)
            path = Path(path)
            if not (path / MANIFEST).exists():
                raise CompareError(f"{path}: no {MANIFEST}")
            specs.append((name or json.loads((path / MANIFEST).read_text())["policy"], path))
        if not 2 <= len(specs) <= 3:
            raise CompareError("compare takes two or three runs")
        if args.baseline:
            specs.sort(key=lambda s: s[0] != args.baseline)
        geometry = geometry_from_config(json.loads(args.model_config.read_text())) if args.model_config else QWEN36_27B
        arms = [load_arm(name, path, args.out, args.model_config) for name, path in specs]
        notes = check_comparable(arms, set(args.ignore))
        aa = None
        if args.aa is not None:
            aa = load_arm("A/A", args.aa, args.out, args.model_config)
            if aa.policy != arms[0].policy:
                raise CompareError(f"--aa {args.aa} has policy {aa.policy!r}, not the baseline's {arms[0].policy!r}")
            notes += check_comparable([arms[0], aa], set(args.ignore), same_policy=True)
        result = build(arms, margin=args.margin / 100, notes=notes, body_params=n_body(geometry),
                       pair_flops=flops_per_pair(geometry), resamples=args.resamples, aa=aa)
    except CompareError as exc:
        print(f"python -m eval.bcp.compare: refused: {exc}", file=sys.stderr)
        return 2
    write(result, args.out)
    print(render_markdown(result))
    print(f"-> {args.out}/table.md, table.csv, table.json, stats.json, plots/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
