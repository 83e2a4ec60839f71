"""Step results, the summary table and the exit status of ``python -m eval.gpu_check``.

A step reports PASS, FAIL or SKIP. SKIP means the step did not apply (a GPU-only step in a CPU
dry run, a step left out by ``--only``) and never fails the check; a step that should have run
but could not (its prerequisite failed, the time ran out) is a FAIL, because nothing was shown.
Pure data and formatting: no torch, no SGLang, so the exit logic is unit-tested on fake results.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
STATUSES = (PASS, FAIL, SKIP)
DETAIL_CHARS = 110  # the table's detail column; the JSON report keeps every message in full


@dataclass
class StepResult:
    """One row of the summary: ``checks`` lists each assertion as ``[ok, message]``, ``data``
    what was measured (numbers a reader of the JSON wants, e.g. error ratios, cached tokens)."""

    name: str
    status: str
    seconds: float = 0.0
    budget_s: float | None = None
    detail: str = ""
    checks: list[list] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}: one of {', '.join(STATUSES)}")

    @property
    def over_budget(self) -> bool:
        return self.budget_s is not None and self.seconds > self.budget_s


class Checks:
    """The assertions of one step, collected instead of raised, so one run reports every broken
    property rather than the first."""

    def __init__(self) -> None:
        self.items: list[list] = []
        self.data: dict = {}

    def expect(self, ok: bool, message: str) -> bool:
        self.items.append([bool(ok), message])
        return bool(ok)

    def note(self, key: str, value) -> None:
        self.data[key] = value

    @property
    def failures(self) -> list[str]:
        return [message for ok, message in self.items if not ok]

    def result(self, name: str, summary: str = "") -> StepResult:
        """PASS when every expectation held (and there was at least one), else FAIL whose detail
        starts with the first failed message."""
        failed = self.failures
        if not self.items:
            return StepResult(name, FAIL, detail="the step checked nothing", checks=[], data=self.data)
        status = FAIL if failed else PASS
        passed = len(self.items) - len(failed)
        detail = f"{len(failed)} of {len(self.items)} checks failed: {failed[0]}" if failed else \
            (summary or f"{passed} checks")
        return StepResult(name, status, detail=detail, checks=list(self.items), data=dict(self.data))


def exit_status(results: list[StepResult]) -> int:
    """1 when any step failed, else 0 (SKIP is not a failure; an empty run is)."""
    if not results:
        return 1
    return 1 if any(r.status == FAIL for r in results) else 0


def _short(text: str, width: int = DETAIL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def table(results: list[StepResult]) -> str:
    """The summary printed at the end: one row per step, then the verdict."""
    name_width = max([len("step")] + [len(r.name) for r in results])
    lines = [f"{'step':<{name_width}}  result  seconds  budget  detail",
             f"{'-' * name_width}  ------  -------  ------  ------"]
    for r in results:
        budget = f"{r.budget_s:6.0f}" if r.budget_s is not None else "     -"
        flag = " (over budget)" if r.over_budget else ""
        lines.append(f"{r.name:<{name_width}}  {r.status:<6}  {r.seconds:7.1f}  {budget}  {_short(r.detail + flag)}")
    failed = [r.name for r in results if r.status == FAIL]
    verdict = f"FAILED: {', '.join(failed)}" if failed else "PASSED" if results else "FAILED: nothing ran"
    lines.append(verdict)
    return "\n".join(lines)


def write_json(path: Path, results: list[StepResult], meta: dict) -> Path:
    """The full report: every step with its checks and data, plus ``meta`` (arguments, device,
    total time, exit status)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {**meta, "exit_status": exit_status(results), "steps": [asdict(r) for r in results]}
    path.write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
    return path
