"""The side-by-side table of BCP arms (``docs/eval.md`` §5.9): one section per group of rows
(setup, accuracy, BCP secondary, agent behaviour, tokens, by class, relocation, compute, latency,
checks), each row one value per arm plus the paper's plain/SCR numbers where it reports them.

``build`` returns the whole result: the rows, the paired statistics, per-question numbers, and why
an arm is not a result (``not_a_result``), which every output and plot then carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from eval.bcp import stats
from eval.bcp.compare_arms import Arm
from eval.bcp.compare_numbers import (citations, count, mean, mean_ci, median, num, pct, question_tokens, ratio_ci,
                                      wilcoxon_p)
from eval.bcp.manifest import manifest_render

PAPER = {  # docs/eval.md §0.3 / §5.9: plain SGLang and SCR on BCP-830 (reported)
    "accuracy": ("60.2%", "60.2%"), "pflops": ("10.98", "7.14"), "ratio": ("1", "0.650"), "relocated_share": ("0", "7.8%"),
}
NO_PAPER = ("—", "—")
STAMP = "NOT A RESULT"  # heads the table, the CSV and every plot title of a comparison with a not_a_result arm


@dataclass
class Table:
    """What the sections read: the arms (the first is the baseline), question ids, verdicts,
    per-question tokens, paired statistics and the A/A noise floor; ``rows`` collects the output."""

    arms: list[Arm]
    qids: list[str]
    correct: dict[str, dict[str, bool]]
    tokens: dict[str, dict[str, dict]]
    paired: dict[str, dict]
    floor: dict | None
    margin: float
    seed: int
    rows: list

    @property
    def base(self) -> Arm:
        return self.arms[0]

    def row(self, group: str, label: str, fn: Callable[[Arm], object], paper: tuple[str, str] = NO_PAPER) -> None:
        self.rows.append((group, label, [str(fn(a)) for a in self.arms], paper))

    def tok(self, arm: Arm, key: str) -> list:
        return [self.tokens[arm.name][q][key] for q in self.qids if q in self.tokens[arm.name]]

    def share(self, arm: Arm, key: str) -> float | None:
        total = sum(self.tok(arm, "P"))
        return sum(self.tok(arm, key)) / total if total else None

    def per_question(self, arm: Arm, key: str) -> list:
        return [arm.per_question[q].get(key) or 0 for q in self.qids if q in arm.per_question]


def _server_arg_diff(base: Arm, arm: Arm) -> str:
    if arm is base:
        return ""
    a, b = base.manifest.get("server", {}).get("args", {}), arm.manifest.get("server", {}).get("args", {})
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k}={b.get(k)}" for k in keys[:12]) + (" …" if len(keys) > 12 else "")


def setup_rows(t: Table) -> None:
    def search(a, key):
        return a.manifest["agent"]["config"]["search"][key]

    def git(a):
        state = a.manifest["run"]["git"]
        return (state.get("commit") or "?")[:10] + ("+dirty" if state.get("dirty") else "")

    t.row("setup", "policy", lambda a: a.policy)
    t.row("setup", "model", lambda a: a.manifest.get("model", {}).get("served"))
    t.row("setup", "SGLang", lambda a: a.manifest.get("server", {}).get("sglang_version"))
    t.row("setup", "server kind", lambda a: a.manifest.get("server", {}).get("kind"))
    t.row("setup", "retriever (k, snippet tokens)", lambda a: (
        f"{a.manifest.get('retrieval', {}).get('backend')} (k={search(a, 'k')}, {search(a, 'snippet_max_tokens')})"))
    t.row("setup", "agent config", lambda a: f"{a.manifest['agent']['config']['mode']} {a.manifest['agent'].get('fingerprint')}")
    t.row("setup", "enable/preserve thinking (render)",
          lambda a: "{enable_thinking}/{preserve_thinking}".format(**a.manifest["agent"]["chat_template_kwargs"])
          + f" ({manifest_render(a.manifest)})")
    t.row("setup", "questions; concurrency; seed",
          lambda a: f"{len(a.records)}; {a.manifest['run']['concurrency']}; {a.manifest['run'].get('seed')}")
    t.row("setup", "git commit", git)
    t.row("setup", "server args differing from " + t.base.name, lambda a: _server_arg_diff(t.base, a) or "—")


def _paired_text(t: Table, a: Arm, fmt: Callable[[dict], str]) -> str:
    return "—" if a is t.base else fmt(t.paired[a.name])


def _accuracy(t: Table, a: Arm) -> str:
    s = stats.arm_summary([t.correct[a.name][q] for q in t.qids])
    return f"{100 * s['accuracy']:.1f}% [{100 * s['wilson'][0]:.1f}, {100 * s['wilson'][1]:.1f}]"


def _noise_floor(t: Table, a: Arm) -> str:
    if t.floor is None:
        return "—"
    if a is t.base:
        return f"{t.floor['discordance']:.3f} (b {t.floor['b']}, c {t.floor['c']})"
    return f"{t.paired[a.name]['paired']['discordance']:.3f} here"


def accuracy_rows(t: Table) -> None:
    g, base, margin = "accuracy", t.base.name, t.margin
    t.row(g, "accuracy [Wilson 95%]", lambda a: _accuracy(t, a), PAPER["accuracy"])
    t.row(g, f"Δ vs {base} [paired bootstrap 95%]", lambda a: _paired_text(t, a, lambda p: "{:+.1f} pp [{:+.1f}, {:+.1f}]".format(
        100 * p["bootstrap"]["diff"], 100 * p["bootstrap"]["low"], 100 * p["bootstrap"]["high"])))
    t.row(g, "b / c / discordance", lambda a: _paired_text(t, a, lambda p: "{} / {} / {:.3f}".format(
        p["paired"]["b"], p["paired"]["c"], p["paired"]["discordance"])))
    t.row(g, "exact McNemar p", lambda a: _paired_text(t, a, lambda p: f"{p['paired']['mcnemar_p']:.3g}"))
    t.row(g, f"TOST ±{100 * margin:g} pp (90% CI)", lambda a: _paired_text(t, a, lambda p: "{} [{:+.1f}, {:+.1f}]".format(
        "equivalent" if p["tost"]["equivalent"] else "not shown equivalent",
        100 * p["tost"]["ci_low"], 100 * p["tost"]["ci_high"])))
    t.row(g, f"A/A discordance (noise floor: {base} twice)", lambda a: _noise_floor(t, a))
    t.row(g, "completed", lambda a: f"{a.summary['completed']}/{a.summary['questions']}")
    t.row(g, "judged; judge failures (counted wrong)", lambda a: f"{a.summary['judged']}; {a.summary['judge_parse_errors']}")


def secondary_rows(t: Table) -> None:
    m = {a.name: a.summary.get("metrics", {}) for a in t.arms}
    g = "BCP secondary"
    t.row(g, "evidence recall", lambda a: num(m[a.name].get("recall"), 1) + ("%" if m[a.name].get("recall") is not None else ""))
    t.row(g, "search calls per question", lambda a: num(m[a.name].get("search_calls"), 2))
    t.row(g, "calibration error (needs >= 100 judged)",
          lambda a: f"{num(m[a.name].get('calibration_error'), 1)}% ({m[a.name].get('calibration_items', 0)} items)")
    t.row(g, "citations coverage / precision / recall", lambda a: citations(m[a.name].get("citations")))


def behaviour_rows(t: Table) -> None:
    g, pq = "agent behaviour", t.per_question
    t.row(g, "LM calls per question (mean / median)",
          lambda a: f"{num(mean(pq(a, 'lm_calls')))} / {num(median(pq(a, 'lm_calls')), 1)}")
    t.row(g, "task steps per question", lambda a: num(mean(pq(a, "steps"))))
    t.row(g, "free edit turns; edits accepted / rejected",
          lambda a: f"{sum(pq(a, 'free_ctx_turns'))}; {sum(pq(a, 'ctx_accepted'))} / {sum(pq(a, 'ctx_rejected'))}")
    t.row(g, "nudges; rollbacks", lambda a: f"{sum(pq(a, 'nudges'))}; {sum(pq(a, 'retries_on_limit'))}")
    t.row(g, "status counts",
          lambda a: ", ".join(f"{k} {v}" for k, v in sorted(count(r["status"] for r in a.records.values()).items())))


def token_rows(t: Table) -> None:
    g, tok = "tokens per question", t.tok
    t.row(g, "prompt P", lambda a: num(mean(tok(a, "P")), 0))
    t.row(g, "prefix-reused R (% of P)", lambda a: f"{num(mean(tok(a, 'R')), 0)} ({pct(t.share(a, 'R'))})")
    t.row(g, "moved M (% of P)", lambda a: f"{num(mean(tok(a, 'M')), 0)} ({pct(t.share(a, 'M'))})", PAPER["relocated_share"])
    t.row(g, "read F (% of P)", lambda a: f"{num(mean(tok(a, 'F')), 0)} ({pct(t.share(a, 'F'))})")
    t.row(g, "decode D", lambda a: num(mean(tok(a, "D")), 0))
    t.row(g, "requests per question; abandoned requests", lambda a: f"{num(mean(tok(a, 'requests')))}; {len(a.abandoned)}")


def _class_shares(a: Arm, klass: str) -> str:
    rows = [r for _, _, r in a.requests if r.klass == klass]
    p = sum(r.prompt_tokens for r in rows)
    if not rows:
        return "0"
    return (f"{len(rows)} req; R {pct(sum(r.prefix_reused for r in rows) / p if p else None)}, "
            f"M {pct(sum(r.moved for r in rows) / p if p else None)}, F {pct(sum(r.read for r in rows) / p if p else None)}")


def _relocation(a: Arm) -> str:
    rows = [r for _, _, r in a.requests]
    moved = [r for r in rows if r.moved > 0]
    edited = [r for r in rows if r.klass == "edited"]
    non_radix = sum(r.prompt_tokens - r.prefix_reused for r in rows)
    return (f"{len(moved)} req; {num(sum(r.moved for r in edited) / len(edited), 1) if edited else '—'} per edited; "
            f"{pct(sum(r.moved for r in rows) / non_radix if non_radix else None)} of non-radix")


def class_and_relocation_rows(t: Table) -> None:
    for klass in ("first", "append", "edited"):
        t.row("by class", klass, lambda a, klass=klass: _class_shares(a, klass))
    t.row("relocation", "requests with relocation; moved per edited request; share of non-radix", _relocation)


def compute_rows(t: Table) -> tuple[dict, dict]:
    """The compute section; returns the PFLOPs intervals and ratios for ``stats.json``."""
    g, base, tok = "compute", t.base, t.tok
    pf = {a.name: mean_ci(tok(a, "pflops"), t.seed) for a in t.arms}
    t.row(g, "prefix-reuse PFLOPs per question [95% CI]", lambda a: "{:.4g} [{:.4g}, {:.4g}]".format(*pf[a.name]), PAPER["pflops"])
    ratio = {a.name: ratio_ci(tok(base, "pflops"), tok(a, "pflops"), t.seed) for a in t.arms[1:]}
    t.row(g, f"ratio vs {base.name} [paired bootstrap 95%]",
          lambda a: "1" if a is base else "{:.3f} [{:.3f}, {:.3f}]".format(*ratio[a.name]), PAPER["ratio"])
    t.row(g, "naive PFLOPs per question (no cache)", lambda a: f"{mean(tok(a, 'naive')):.4g}")
    t.row(g, "PFLOPs with attention per question (approx.)", lambda a: f"{mean(tok(a, 'attn')):.4g}")
    t.row(g, "Wilcoxon signed-rank p (per-question PFLOPs)",
          lambda a: "—" if a is base else wilcoxon_p(tok(base, "pflops"), tok(a, "pflops")))
    return pf, ratio


def _latency(a: Arm) -> str:
    secs = [c["seconds"] for c in a.client_rows if c.get("usage")]
    if not secs:
        return "—"
    return f"{np.percentile(secs, 50):.2f} / {np.percentile(secs, 90):.2f} s"


def latency_and_check_rows(t: Table) -> None:
    # Latency is secondary, and without streaming there is no TTFT.
    t.row("latency", "request seconds p50 / p90", _latency)
    t.row("latency", "wall seconds per question (mean)", lambda a: num(mean([r.get("wall_s") or 0 for r in a.records.values()])))
    t.row("checks", "accounting and join checks", lambda a: "pass" if not a.checks else f"FAIL ({len(a.checks)})")
    t.row("checks", "requests ingested", lambda a: str(len(a.requests) + len(a.abandoned)))


def _table(arms: list[Arm], margin: float, body_params: float, pair_flops: int, resamples: int, seed: int,
           aa: Arm | None) -> Table:
    """The per-arm verdicts, tokens and paired statistics the sections read."""
    base = arms[0]
    qids = list(base.manifest["dataset"]["question_ids"])
    correct = {a.name: {q: bool(a.per_question.get(q, {}).get("correct")) for q in qids} for a in arms}
    floor = None
    if aa is not None:
        floor = stats.noise_floor(correct[base.name], {q: bool(aa.per_question.get(q, {}).get("correct")) for q in qids})
    tokens = {a.name: question_tokens(a, body_params, pair_flops) for a in arms}
    paired = {a.name: stats.compare_arms(correct[base.name], correct[a.name], margin=margin,
                                         num_resamples=resamples, seed=seed) for a in arms[1:]}
    return Table(arms, qids, correct, tokens, paired, floor, margin, seed, rows=[])


def build(arms: list[Arm], *, margin: float, notes: list[str], body_params: float, pair_flops: int,
          resamples: int = 10_000, seed: int = 0, aa: Arm | None = None) -> dict:
    t = _table(arms, margin, body_params, pair_flops, resamples, seed, aa)
    for section in (setup_rows, accuracy_rows, secondary_rows, behaviour_rows, token_rows, class_and_relocation_rows):
        section(t)
    pf, ratio = compute_rows(t)
    latency_and_check_rows(t)
    reasons = {a.name: list(a.summary.get("not_a_result") or []) + [f"check failed: {c}" for c in a.checks] for a in arms}
    return {"arms": [a.name for a in arms], "policies": [a.policy for a in arms], "baseline": t.base.name,
            "margin": margin, "rows": [{"group": g, "row": l, "values": v, "paper": list(p)} for g, l, v, p in t.rows],
            "notes": notes, "not_a_result": {name: r for name, r in reasons.items() if r},
            "checks": {a.name: a.checks for a in arms},
            "stats": {"paired": t.paired, "pflops": pf, "ratio": ratio, "noise_floor": t.floor},
            "per_question": {a.name: {q: {"correct": t.correct[a.name][q], **t.tokens[a.name].get(q, {})} for q in t.qids}
                             for a in arms}}
