"""The four figures of a BCP comparison (``plots/``), drawn with ``eval/plots.py``: accuracy with
its intervals, per-question PFLOPs against the baseline, where prompt tokens came from, and the
CDF of read tokens. A comparison that is not a result says so in every title, in red."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from eval import plots as figs
from eval.bcp import stats
from eval.bcp.compare_table import STAMP

OUTCOME_COLOURS = {(True, True): "tab:green", (True, False): "tab:orange", (False, True): "tab:blue",
                   (False, False): "0.6"}  # (baseline correct, arm correct)


def accuracy_ci(result: dict, axes) -> str:
    """Accuracy per arm with Wilson intervals, and the paired differences with the margin band."""
    ax1, ax2 = axes
    arms, base, pq = result["arms"], result["baseline"], result["per_question"]
    for i, arm in enumerate(arms):
        s = stats.arm_summary([v["correct"] for v in pq[arm].values()])
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
    return "Accuracy per arm and paired differences"


def _pflops_points(ax, result: dict) -> list[float]:
    arms, base, pq = result["arms"], result["baseline"], result["per_question"]
    points = []
    for arm, marker in zip(arms[1:], "os^"):
        for q, v in pq[arm].items():
            x, y = pq[base][q].get("pflops", 0), v.get("pflops", 0)
            if x > 0 and y > 0:
                ax.scatter(x, y, marker=marker, color=OUTCOME_COLOURS[(pq[base][q]["correct"], v["correct"])], s=18)
                points += [x, y]
    return points


def pflops_paired(result: dict, ax) -> str:
    """Per-question PFLOPs of each arm against the baseline's, coloured by who was right."""
    from matplotlib.lines import Line2D

    arms, base = result["arms"], result["baseline"]
    points = _pflops_points(ax, result)
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
    return f"Per-question PFLOPs vs {base}"


def provenance_stack(result: dict, ax) -> str:
    """Shares of prompt tokens reused, moved and read, per arm."""
    shares = {"R": [], "M": [], "F": []}
    for arm in result["arms"]:
        total = {k: sum(v.get(k, 0) for v in result["per_question"][arm].values()) for k in ("P", "R", "M", "F")}
        for k in shares:
            shares[k].append(total[k] / total["P"] if total["P"] else 0)
    figs.stacked_bars(ax, result["arms"], [("prefix-reused", shares["R"], "tab:green"), ("moved", shares["M"], "tab:purple"),
                                           ("read", shares["F"], "tab:red")])
    ax.set_ylabel("share of prompt tokens")
    ax.legend(fontsize=8)
    return "Where prompt tokens came from"


def forwarded_cdf(result: dict, ax) -> str:
    """CDF of the tokens each question had read (forwarded) by the model."""
    for arm in result["arms"]:
        figs.cdf_step(ax, [v.get("F", 0) for v in result["per_question"][arm].values()], arm)
    ax.set_xlabel("read tokens per question")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=8)
    return "Read (forwarded) tokens per question"


# file name -> (figure width, height, columns, drawing function returning the title)
FIGURES: dict[str, tuple[float, float, int, Callable]] = {
    "accuracy_ci.png": (9, 3.6, 2, accuracy_ci),
    "pflops_paired.png": (5.2, 4.6, 1, pflops_paired),
    "provenance_stack.png": (6, 3.6, 1, provenance_stack),
    "forwarded_cdf.png": (5.5, 3.6, 1, forwarded_cdf),
}


def plots(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = (STAMP + " — ") if result["not_a_result"] else ""
    written = []
    for name, (width, height, ncols, draw) in FIGURES.items():
        fig, axes = figs.subplots(width, height, ncols=ncols)
        title = draw(result, axes)
        fig.suptitle(stamp + title, color="red" if stamp else "black", fontsize=10)
        written.append(figs.save(fig, out / name, dpi=110))
    return written
