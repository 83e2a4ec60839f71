"""BrowseComp-Plus runs: `run` puts the agent to the questions (journaled and resumable), `judge`
grades the finished run files, and `score` computes the metrics (docs/eval.md §1.9).

    python -m eval.bcp.run run   --dataset DIR --server URL --policy radix --out runs/radix \\
                                 [--policy-set KEY=VALUE ...] [--events FILE] [--config eval/bcp/bcp.yaml] \\
                                 [--set KEY=VALUE ...] [--render default|preserve] [--index DIR] \\
                                 [--limit N | --subset N] \\
                                 [--snippet-tokenizer auto|words|DIR] [--server-trace FILE] [--run-id ID] \\
                                 [--judge-server URL]
    python -m eval.bcp.run judge --run runs/radix --judge-server URL [--judge-model NAME]
    python -m eval.bcp.run score --run runs/radix

Run directory (docs/eval.md §5.5):

    manifest.json            model, policy, server args, the server's start-up record, agent config,
                             rendering (eval/render.py), retrieval (snippet unit), dataset fingerprint,
                             question order, git commit, seeds (compare checks these)
    journal.jsonl            start/done lines (eval/bcp/journal.py)
    questions/<qid>.json     the BCP run file (§1.7) plus extras (rids, steps, tokens, agent counters)
    trajectories/<qid>.json  the final message list of the question
    client_requests.jsonl    one row per LM request (rid, qid, turn, usage, timing, prompt sha256)
    events.jsonl             the server's --cache-events lines of this run's rids (copied)
    trace.jsonl              with --server-trace: the run's calls with their exact token ids (eval/bcp/trace.py)
    judge/<qid>.json         judgments;  scores.json, per_question.csv, summary.json after `score`

With --events, the events file's last start-up record must name the same policy and the settings
given with --policy-set; a mismatch fails the run before any question is sent (exit 1).
Exit statuses: 0 done, 1 a check failed, 2 a usage error (flags, missing dataset or index).
"""
# Spec: docs/eval.md

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from eval import render as render_mod
from eval.bcp.client import http_post
from eval.bcp.config import AgentConfig
from eval.bcp.execute import RunSetup, execute
from eval.bcp.judging import judge_run, make_judge
from eval.bcp.manifest import (SCHEMA, DifferentRun, code_fingerprint, dataset_fingerprint, git_state,
                               load_manifest, prompts_fingerprint)
from eval.bcp.run_cli import build_parser
from eval.bcp.scoring import score
from eval.bcp.server_info import server_description
from eval.cli_types import CheckFailed, UsageError, run_main, usage

PROG = "python -m eval.bcp.run"


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


# ---- inputs (each failure is a one-line usage error)


def load_agent_config(path: Path, assignments: list[tuple[str, str]]) -> AgentConfig:
    from eval.bcp.config import load_config, override_value

    try:
        return load_config(path, {key: override_value(raw) for key, raw in assignments})
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"agent config {path}: {exc}") from None


def apply_render(config: AgentConfig, render: str | None, assignments: list[tuple[str, str]]) -> AgentConfig:
    """``config`` with the ``preserve_thinking`` of ``--render`` (None: unchanged). The flag
    overrides the config file, as ``--set`` does; a ``--set preserve_thinking`` that says otherwise
    is a usage error, since the run could not say which one was meant."""
    if render is None:
        return config
    wanted = render_mod.preserve_thinking(render)
    if any(key == "preserve_thinking" for key, _ in assignments) and config.preserve_thinking != wanted:
        raise UsageError(f"--render {render} means preserve_thinking={str(wanted).lower()}, but --set "
                         f"preserve_thinking={str(config.preserve_thinking).lower()}; give one of them")
    return config.replace(preserve_thinking=wanted)


def load_dataset(path: Path):
    from eval.bcp import data

    try:
        return data.load_dataset(path)
    except data.DataError as exc:
        raise UsageError(f"dataset: {exc}") from None


def check_index_dir(index: Path | None) -> None:
    from eval.bcp.retrieval import index_dir_problem

    problem = index_dir_problem(index) if index is not None else None
    if problem:
        raise UsageError(f"--index: {problem}")


def policy_settings(policy: str, assignments: list[tuple[str, str]]) -> dict:
    from eval.bcp.startup import given_settings
    from policy.registry import PolicyError

    try:
        return given_settings(policy, assignments)
    except PolicyError as exc:
        raise UsageError(f"--policy-set: {exc}") from None


def check_startup(events: Path | None, policy: str, settings: dict) -> dict | None:
    """The server's last start-up record, checked against what this run was told (CheckFailed on a
    mismatch); None without --events, or with a warning when the file has no start-up record."""
    from eval.bcp.startup import last_startup, startup_mismatches

    if events is None:
        return None
    record = last_startup(events)
    if record is None:
        _warn(f"{events} has no start-up record (a server from before start-up records?); "
              "the manifest records startup: null")
        return None
    problems = startup_mismatches(record, policy, settings)
    if problems:
        raise CheckFailed(f"the server behind {events} is not the one this run was told about:\n  "
                          + "\n  ".join(problems))
    return record


def make_searcher(dataset, index: Path | None, config: AgentConfig, tokenizer_choice: str, server_args: dict):
    from eval.bcp import retrieval, snippets

    try:
        tokenizer, name = snippets.choose_tokenizer(tokenizer_choice, server_args, _warn)
    except snippets.TokenizerError as exc:
        raise UsageError(f"--snippet-tokenizer: {exc}") from None
    return retrieval.Searcher(dataset.corpus, index, snippet_max_tokens=config.search.snippet_max_tokens,
                              tokenizer=tokenizer, tokenizer_name=name or "")


def make_toolbox_factory(searcher, config: AgentConfig) -> Callable[[], Any]:
    from eval.bcp import tools

    def make():
        return tools.ToolBox(searcher, k=config.search.k, get_document=config.search.get_document)

    return make


def select_queries(queries, limit: int | None, subset_n: int | None, seed: int):
    from eval.bcp import data

    if subset_n:
        queries = data.subset(queries, subset_n, seed)
    return queries[:limit] if limit else queries


# ---- run


def run_manifest(args, *, run_id: str, model: str, server: dict, startup: dict | None, config: AgentConfig,
                 searcher, dataset, queries) -> dict:
    """The manifest of a new run (``eval/bcp/manifest.py`` says which parts ``compare`` checks)."""
    return {
        "schema": SCHEMA, "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "policy": args.policy,
        "model": {"served": model, "path": server.get("args", {}).get("model_path")},
        "server": {"url": args.server, "kind": args.server_kind, **server, "launch_command": args.server_command},
        "startup": startup,
        "agent": {"config": config.to_dict(), "fingerprint": config.fingerprint(),
                  "chat_template_kwargs": config.chat_template_kwargs, "prompts": prompts_fingerprint()},
        "render": render_mod.from_kwargs(config.chat_template_kwargs),
        "retrieval": searcher.describe(),
        "dataset": {"path": str(args.dataset), "fingerprint": dataset_fingerprint(queries, searcher.fingerprint),
                    "total_queries": len(dataset.queries), "question_ids": [q.query_id for q in queries],
                    "selection": {"limit": args.limit, "subset": args.subset, "subset_seed": args.subset_seed}},
        "run": {"concurrency": args.concurrency, "order": "dataset order", "seed": config.seed, "git": git_state(),
                "code_fingerprint": code_fingerprint(),
                "events_source": str(args.events) if args.events else None,
                "trace_source": str(args.server_trace) if args.server_trace else None},
        "not_a_result": args.not_a_result,
    }


def cmd_run(args) -> int:
    config = apply_render(load_agent_config(args.config, args.set), args.render, args.set)
    settings = policy_settings(args.policy, args.policy_set)
    dataset = load_dataset(args.dataset)
    check_index_dir(args.index)
    startup = check_startup(args.events, args.policy, settings)
    server = server_description(args.server)
    searcher = make_searcher(dataset, args.index, config, args.snippet_tokenizer, server.get("args", {}))
    queries = select_queries(dataset.queries, args.limit, args.subset, args.subset_seed)
    model = args.model or server.get("served_model") or "default"
    run_id = args.run_id or args.out.name.replace(".", "_")
    manifest = run_manifest(args, run_id=run_id, model=model, server=server, startup=startup, config=config,
                            searcher=searcher, dataset=dataset, queries=queries)
    judge = None
    if args.judge_server:
        judge = make_judge(args.judge_server, args.judge_model, args.out / "judge_cache.jsonl", args.judge_max_tokens)
        manifest["judge"] = judge.describe()
    setup = RunSetup(run_dir=args.out, run_id=run_id, policy=args.policy, config=config, queries=queries,
                     make_toolbox=make_toolbox_factory(searcher, config),
                     post=http_post(args.server, timeout=config.request_timeout_s), model=model, manifest=manifest,
                     events_source=args.events, trace_source=args.server_trace, server_log=args.server_log,
                     concurrency=args.concurrency, judge=judge, progress=not args.no_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    records = execute(setup)
    print(f"{len(records)} questions in {args.out} ({sum(r['status'] == 'completed' for r in records)} completed)")
    if judge is not None:
        summary = score(args.out, {q.query_id: q for q in dataset.queries})
        print(json.dumps(summary, indent=1))
    return 0


# ---- judge and score


def _run_and_dataset(run_dir: Path, dataset: Path | None):
    """A finished run's directory and its dataset (the manifest's unless ``dataset`` is given)."""
    try:
        manifest = load_manifest(run_dir)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--run {run_dir}: not a run directory ({exc})") from None
    return load_dataset(Path(dataset or manifest["dataset"]["path"]))


def cmd_judge(args) -> int:
    dataset = _run_and_dataset(args.run, args.dataset)
    judge = make_judge(args.judge_server, args.judge_model, args.run / "judge_cache.jsonl", args.judge_max_tokens)
    judgments = judge_run(args.run, judge, {q.query_id: q for q in dataset.queries})
    summary = score(args.run, {q.query_id: q for q in dataset.queries})
    failures = sum(bool(j.get("parse_error")) for j in judgments)
    print(f"{len(judgments)} judged, {failures} judge failure(s); accuracy {summary['metrics'].get('accuracy')}")
    if summary["not_a_result"]:
        print("NOT A RESULT: " + "; ".join(summary["not_a_result"]))
    return 0


def cmd_score(args) -> int:
    dataset = _run_and_dataset(args.run, args.dataset)
    summary = score(args.run, {q.query_id: q for q in dataset.queries})
    print(json.dumps(summary, indent=1))
    return 0


COMMANDS = {"run": cmd_run, "judge": cmd_judge, "score": cmd_score}


def main(argv: list[str] | None = None) -> int:
    args = build_parser(PROG, __doc__).parse_args(argv)
    # UsageError -> 2, CheckFailed -> 1 ("check failed"), another run in --out -> 2
    return run_main(f"{PROG} {args.command}", lambda: COMMANDS[args.command](args), usage(DifferentRun))


if __name__ == "__main__":
    sys.exit(main())
