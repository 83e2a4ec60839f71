"""Running the steps in order, each timed against its budget, with one shared context.

A step is a function ``run(ctx) -> StepResult``; an exception inside it is that step's FAIL (with
the traceback in the JSON), never the end of the check, so one broken step still leaves a full
table. A blocking preflight failure (no GPU seen on ``--device cuda``, SGLang not importable)
turns the remaining steps into FAILs that say why they did not run; so does the time limit.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eval.gpu_check.report import FAIL, SKIP, StepResult

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"


@dataclass
class Context:
    """What the steps share: the device, where to write, the model, answers kept for later steps."""

    device: str
    out: Path
    quick: bool = False
    time_limit_s: float = 600.0
    artifacts: Path = ARTIFACTS
    started: float = field(default_factory=time.monotonic)
    untimed_s: float = 0.0  # spent in untimed steps (the start-up's compilation), left out of elapsed()
    blocked: str | None = None  # why the remaining steps cannot run
    shared: dict = field(default_factory=dict)
    _model_dir: Path | None = None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def log_dir(self) -> Path:
        return self.out / "logs"

    def model_dir(self) -> Path:
        """The tiny model, built once under ``.artifacts`` (offline, a few seconds) and reused."""
        if self._model_dir is None:
            from eval.tiny_model import cached_build

            self._model_dir = cached_build(self.artifacts)
        return self._model_dir

    def elapsed(self) -> float:
        """Seconds counted against the time limit: all but the untimed steps'."""
        return time.monotonic() - self.started - self.untimed_s


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], StepResult]
    budget_s: float  # on one H200; the whole check must fit the time limit
    what: str  # one line for --help and the docs
    timed: bool = True  # False: outside the time limit and the budgets (the start-up's compilation)


def run_steps(ctx: Context, steps: list[Step], progress: Callable[[str], None] = print) -> list[StepResult]:
    results = []
    for step in steps:
        progress(f"[gpu-check] {step.name}: {step.what}")
        result = _run_one(ctx, step)
        results.append(result)
        progress(f"[gpu-check] {step.name}: {result.status} in {result.seconds:.1f} s - {result.detail}")
    return results


def _run_one(ctx: Context, step: Step) -> StepResult:
    budget = step.budget_s if ctx.cuda and step.timed else None
    if ctx.blocked:
        return StepResult(step.name, FAIL, budget_s=budget, detail=f"not run: {ctx.blocked}")
    if ctx.cuda and ctx.elapsed() > ctx.time_limit_s:
        return StepResult(step.name, FAIL, budget_s=budget,
                          detail=f"not run: the {ctx.time_limit_s:.0f} s time limit ran out")
    started = time.monotonic()
    try:
        result = step.run(ctx)
    except Exception as exc:  # the step's failure, not the check's: report it and go on
        result = StepResult(step.name, FAIL, detail=f"{type(exc).__name__}: {exc}",
                            data={"traceback": traceback.format_exc()})
    result.name = step.name
    result.seconds = time.monotonic() - started
    result.budget_s = budget
    if not step.timed:
        ctx.untimed_s += result.seconds
    return result


def time_row(ctx: Context, results: list[StepResult]) -> StepResult:
    """The last row: on CUDA, whether the whole check fit its time limit; on CPU, only how long it took."""
    total = ctx.elapsed()
    if not ctx.cuda:
        return StepResult("total-time", SKIP, seconds=total,
                          detail=f"CPU dry run took {total:.0f} s; the {ctx.time_limit_s:.0f} s limit applies on one GPU")
    over = [r.name for r in results if r.over_budget]
    status = "PASS" if total <= ctx.time_limit_s else FAIL
    detail = f"{total:.0f} s of {ctx.time_limit_s:.0f} s" + (f"; over their budget: {', '.join(over)}" if over else "")
    if ctx.untimed_s:
        detail += f" (untimed start-up {ctx.untimed_s:.0f} s not counted)"
    return StepResult("total-time", status, seconds=total, budget_s=ctx.time_limit_s, detail=detail)
