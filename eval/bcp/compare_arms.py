"""The arms of a BCP comparison: each run's manifest, scores, run records, client rows and token
accounting (``eval.report.ingest`` over its ``events.jsonl``), joined and checked, and the check
that the arms differ in nothing but the policy (``manifest.comparable``), the rendering of earlier
turns (``eval/render.py``) first."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from eval.bcp import journal as journal_mod
from eval.bcp.manifest import MANIFEST, comparable


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


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def read_arm(name: str, path: Path) -> Arm:
    """A scored run's manifest, scores, run records and client rows (no accounting yet)."""
    manifest = json.loads((path / MANIFEST).read_text())
    scores_path = path / "scores.json"
    if not scores_path.exists():
        raise CompareError(f"{path}: not scored; run `python -m eval.bcp.run judge --run {path} ...` first")
    scores = json.loads(scores_path.read_text())
    records = {r["query_id"]: r for r in journal_mod.Journal(path).records()}
    arm = Arm(name, path, manifest, scores["summary"], {r["query_id"]: r for r in scores["per_question"]}, records)
    arm.client_rows = _read_jsonl(path / "client_requests.jsonl")
    return arm


def split_attempts(arm: Arm, rows: list) -> None:
    """Accounting rows of each question's final attempt go to ``requests`` as (qid, turn, row);
    the others (interrupted attempts, unknown rids) to ``abandoned``."""
    final = {(journal_mod.safe_qid(q), r.get("attempt", 0)): q for q, r in arm.records.items()}
    for row in rows:
        parsed = journal_mod.parse_rid(row.rid)
        qid = final.get((parsed[1], parsed[2])) if parsed else None
        (arm.requests if qid is not None else arm.abandoned).append((qid, parsed[3] if parsed else -1, row))


def join_checks(arm: Arm) -> list[str]:
    """C1: every final-attempt client request has exactly one event, with the same prompt count;
    I3: the events name the manifest's policy."""
    failures = []
    by_rid = {row.rid: row for _, _, row in arm.requests}
    wanted = [rid for r in arm.records.values() for rid in r.get("rids", [])]
    missing = [rid for rid in wanted if rid not in by_rid]
    if missing:
        failures.append(f"C1 {len(missing)} request(s) without an event, e.g. {missing[:3]}")
    usage = {c["rid"]: c.get("usage") or {} for c in arm.client_rows}
    mismatched = [rid for rid, row in by_rid.items() if usage.get(rid, {}).get("prompt_tokens") not in (None, row.prompt_tokens)]
    if mismatched:
        failures.append(f"C1 client prompt_tokens != event prompt_tokens for {mismatched[:3]}")
    policies = {row.policy for _, _, row in arm.requests}
    if policies and policies != {arm.policy}:
        failures.append(f"I3 events say policy {sorted(policies)}, the manifest says {arm.policy!r}")
    return failures


def load_arm(name: str, path: Path, out: Path, model_config: Path | None) -> Arm:
    """One arm with its token accounting (written under ``out/accounting/<name>``) and checks."""
    from eval import report

    arm = read_arm(name, path)
    events = path / "events.jsonl"
    if not events.exists() or not events.read_text().strip():
        arm.checks.append("E0 no events.jsonl (run without --events?): no token accounting")
        return arm
    rows, failures = report.ingest(events, out / "accounting" / name, model_config)
    arm.checks += failures
    split_attempts(arm, rows)
    arm.checks += join_checks(arm)
    return arm


def _diff_detail(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return f" ({', '.join(f'{k}: {a.get(k)!r} vs {b.get(k)!r}' for k in keys[:6])})"
    return f" ({str(a)[:60]!r} vs {str(b)[:60]!r})"


RENDER = "render"  # the comparable key of the rendering; --allow-render-mismatch puts it into ``ignore``


def check_render(arms: list[Arm], ignore: set[str]) -> list[str]:
    """Runs rendered differently (``eval/render.py``) showed the model different prompts: neither
    their cache numbers nor their accuracy pair. A CompareError naming every arm's rendering,
    unless ``RENDER`` is ignored (then one note saying so)."""
    renders = {arm.name: comparable(arm.manifest)[RENDER] for arm in arms}
    if len(set(renders.values())) < 2:
        return []
    listed = ", ".join(f"{name} ({arm.path}) rendered {renders[name]!r}" for name, arm in zip(renders, arms))
    if RENDER not in ignore:
        raise CompareError(f"runs rendered differently: {listed}. The model saw different prompts (eval/render.py), "
                           "so neither their cache numbers nor their accuracy pair; --allow-render-mismatch "
                           "compares them anyway")
    return [f"render differs, let through: {listed}"]


def check_comparable(arms: list[Arm], ignore: set[str], same_policy: bool = False) -> list[str]:
    """Differences other than the policy; raises CompareError unless every one is ignored (the
    rendering is checked first, by ``check_render``)."""
    notes = check_render(arms, ignore)
    base = comparable(arms[0].manifest)
    problems = []
    for arm in arms[1:]:
        other = comparable(arm.manifest)
        for key in base:
            if key == RENDER:
                continue
            if base[key] != other[key]:
                line = f"{arm.name} vs {arms[0].name}: {key} differs{_diff_detail(base[key], other[key])}"
                (notes if key in ignore else problems).append(line)
    policies = [a.policy for a in arms]
    if not same_policy and len(set(policies)) != len(policies):
        problems.append(f"two runs share a policy: {policies}")
    if problems:
        raise CompareError("runs differ in more than the policy:\n  " + "\n  ".join(problems))
    return notes
