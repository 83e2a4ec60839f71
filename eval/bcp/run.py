"""BrowseComp-Plus runs: ``run`` (the agent over the questions, journaled and resumable),
``judge`` (grade the finished run files) and ``score`` (metrics of §1.9).

    python -m eval.bcp.run run   --dataset DIR --server URL --policy radix --out runs/radix \\
                                 [--config eval/bcp/bcp.yaml] [--set KEY=VALUE ...] [--index DIR] \\
                                 [--limit N | --subset N] [--events FILE] [--server-trace FILE] [--run-id ID]
                                 [--judge-server URL]
    python -m eval.bcp.run judge --run runs/radix --judge-server URL [--judge-model NAME]
    python -m eval.bcp.run score --run runs/radix

Run directory (``eval_spec.md`` §5.5)::

    manifest.json            model, policy, server args, agent config, retrieval, dataset fingerprint,
                             question order, git commit, seeds (``compare`` checks these)
    journal.jsonl            start/done lines (``eval/bcp/journal.py``)
    questions/<qid>.json     the BCP run file (§1.7) plus extras (rids, steps, tokens, agent counters)
    trajectories/<qid>.json  the final message list of the question
    client_requests.jsonl    one row per LM request (rid, qid, turn, usage, timing, prompt sha256)
    events.jsonl             the server's --cache-events lines of this run's rids (copied)
    trace.jsonl              with --server-trace: the run's calls with their exact token ids (``eval/bcp/trace.py``)
    judge/<qid>.json         judgments;  scores.json, per_question.csv, summary.json after ``score``

Every request id is ``<run_id>.<qid>.<turn:04d>`` (``<qid>~<attempt>`` for a question re-run after an
interruption), so the accounting groups requests into questions by the rid up to its last dot.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from eval.bcp import journal as journal_mod
from eval.bcp.client import ChatClient, Post, http_get, http_post
from eval.bcp.config import DEFAULT_CONFIG, AgentConfig, load_config, parse_override

MANIFEST = "manifest.json"
SCHEMA = 1
ROOT = Path(__file__).resolve().parents[2]

# Server settings that must be equal across the arms of a comparison; the others are recorded and
# shown, since a policy legitimately brings its own (the exact launcher sets chunked prefill etc.).
SERVER_KEYS_MUST_MATCH = ("model_path", "served_model_name", "dtype", "kv_cache_dtype", "context_length",
                          "tp_size", "dp_size", "tool_call_parser", "reasoning_parser", "chat_template",
                          "mamba_ssm_dtype", "device", "sampling_backend", "revision")
# Server settings that vary between launches and say nothing about the experiment.
SERVER_KEYS_VOLATILE = ("host", "port", "random_seed", "log_requests", "file_storage_path", "nccl_port",
                        "dist_init_addr", "internal_states", "decode_log_interval", "log_level")


# ---- manifest pieces


def git_state(root: Path = ROOT) -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


# The code that shapes a trajectory. The git commit is recorded too, but not compared: a shared
# checkout moves on while the arms run, and what matters is that the agent's code did not change.
AGENT_CODE = ("agent.py", "clm.py", "client.py", "config.py", "tools.py", "retrieval.py", "run.py")


def code_fingerprint() -> str:
    h = hashlib.sha256()
    for name in AGENT_CODE:
        path = Path(__file__).with_name(name)
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b"") + b"\0")
    return h.hexdigest()[:16]


def dataset_fingerprint(queries, corpus_fingerprint: str) -> str:
    h = hashlib.sha256(corpus_fingerprint.encode())
    for q in queries:
        h.update(json.dumps([q.query_id, q.text, q.answer, list(q.evidence_docids), list(q.gold_docids)]).encode())
    return h.hexdigest()


def server_description(base_url: str | None) -> dict:
    """What the server says about itself (``/server_info``, ``/v1/models``); {} without a server."""
    if not base_url:
        return {}
    info: dict[str, Any] = {}
    try:
        raw = http_get(base_url, "/server_info")
    except Exception:  # older servers
        try:
            raw = http_get(base_url, "/get_server_info")
        except Exception as exc:
            return {"error": f"server_info unavailable: {exc}"}
    info["args"] = {k: v for k, v in sorted(raw.items())
                    if k not in SERVER_KEYS_VOLATILE and (v is None or isinstance(v, (str, int, float, bool)))}
    info["sglang_version"] = raw.get("version")
    try:
        models = http_get(base_url, "/v1/models")
        info["served_model"] = models["data"][0]["id"]
    except Exception:
        info["served_model"] = None
    return info


def comparable(manifest: dict) -> dict:
    """The parts of a manifest that must be equal between arms of a comparison (everything but
    the policy and what a launch varies)."""
    server_args = manifest.get("server", {}).get("args", {})
    return {
        "model": manifest.get("model"),
        "server_args": {k: server_args.get(k) for k in SERVER_KEYS_MUST_MATCH},
        "sglang_version": manifest.get("server", {}).get("sglang_version"),
        "server_kind": manifest.get("server", {}).get("kind"),
        "agent_config": manifest.get("agent", {}).get("config"),
        "retrieval": manifest.get("retrieval"),
        "dataset": manifest.get("dataset", {}).get("fingerprint"),
        "questions": manifest.get("dataset", {}).get("question_ids"),
        "concurrency": manifest.get("run", {}).get("concurrency"),
        "agent_code": manifest.get("run", {}).get("code_fingerprint"),
    }


# ---- the run


@dataclasses.dataclass
class RunSetup:
    run_dir: Path
    run_id: str
    policy: str
    config: AgentConfig
    queries: list  # data.Query
    make_toolbox: Callable[[], Any]
    post: Post
    model: str
    manifest: dict
    events_source: Path | None = None
    trace_source: Path | None = None  # the server's --cache-trace file -> run_dir/trace.jsonl
    concurrency: int = 1
    server_log: Path | None = None  # copied to run_dir/server.log at the end (for `eval.report ingest --log`)
    judge: Any = None  # an object with .grade(query, record) -> dict (inline judging)
    progress: bool = True


def _append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")


def prepare_manifest(run_dir: Path, manifest: dict) -> None:
    """Write the manifest, or on resume check that the run is the same run."""
    path = run_dir / MANIFEST
    if path.exists():
        old = json.loads(path.read_text())
        if comparable(old) != comparable(manifest) or old.get("policy") != manifest.get("policy") \
                or old.get("run_id") != manifest.get("run_id"):
            diff = sorted(k for k in comparable(old) if comparable(old)[k] != comparable(manifest)[k])
            raise SystemExit(f"{run_dir} holds a different run (differs in {diff or ['policy/run_id']}); "
                             f"use another --out")
        # Keep what earlier invocations recorded (creation time, the judge) and count the resumptions.
        manifest = {**old, **{k: v for k, v in manifest.items() if v is not None or k not in old},
                    "created": old.get("created"), "resumed": old.get("resumed", 0) + 1}
    journal_mod.write_json_atomic(path, manifest)


def execute(setup: RunSetup) -> list[dict]:
    """Run every question not yet finished; returns all run records (old and new)."""
    from tqdm import tqdm

    from eval.bcp.agent import Agent

    run_dir = setup.run_dir
    jr = journal_mod.Journal(run_dir)
    done = jr.reconcile()
    if done:
        jr.note_resume()
    prepare_manifest(run_dir, setup.manifest)
    client_log = run_dir / "client_requests.jsonl"
    lock = threading.Lock()  # journal, records and the client log are shared by the workers

    def log_row(row: dict) -> None:
        with lock:
            _append_jsonl(client_log, row)

    client = ChatClient(setup.post, model=setup.model, sampling=setup.config.sampling(),
                        chat_template_kwargs=setup.config.chat_template_kwargs, cache_salt=setup.config.cache_salt,
                        max_retries=setup.config.max_retries, protocol=setup.config.tool_protocol, log=log_row)
    agent = Agent(setup.config, client, setup.make_toolbox, model_name=setup.model)
    records = {r["query_id"]: r for r in jr.records()}
    judged = {qid: j.get("correct") for qid, j in read_judgments(run_dir).items() if qid in records}
    bar = tqdm(total=len(setup.queries), initial=sum(1 for q in setup.queries if jr.is_done(q.query_id)),
               desc=f"bcp {setup.policy}", unit="q", disable=not setup.progress)

    def postfix():
        finished = [records[q.query_id] for q in setup.queries if q.query_id in records]
        tokens = sum(r["tokens"]["prompt"] + r["tokens"]["completion"] for r in finished)
        shown = {"done": sum(r["status"] == "completed" for r in finished), "tok": tokens}
        grades = [v for v in judged.values() if v is not None]
        if setup.judge is not None and grades:
            shown["acc"] = f"{sum(grades) / len(finished):.1%}"
        bar.set_postfix(shown)

    def work(query) -> None:
        with lock:
            attempt = jr.start(query.query_id)
        prefix = journal_mod.rid_prefix(setup.run_id, query.query_id, attempt)
        result = agent.run(query.query_id, query.text, prefix)
        record = {**result.record, "attempt": attempt, "policy": setup.policy, "run_id": setup.run_id}
        journal_mod.write_json_atomic(run_dir / "trajectories" / f"{journal_mod.safe_qid(query.query_id)}.json",
                                      {"query_id": query.query_id, "attempt": attempt, "messages": result.messages})
        judgment = judge_one(setup.judge, query, record, run_dir) if setup.judge is not None else None
        with lock:
            if judgment is not None:
                judged[query.query_id] = judgment.get("correct")
            jr.finish(query.query_id, attempt, record)
            records[query.query_id] = record

    pending = [q for q in setup.queries if not jr.is_done(q.query_id)]
    postfix()
    try:
        if setup.concurrency <= 1:
            for query in pending:
                work(query)
                bar.update(1)
                postfix()
        else:
            # Questions are started in dataset order, at most `concurrency` at a time.
            pool = ThreadPoolExecutor(max_workers=setup.concurrency)
            try:
                for future in as_completed([pool.submit(work, q) for q in pending]):
                    future.result()
                    bar.update(1)
                    postfix()
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()
        if setup.events_source is not None:
            collect_events(setup.events_source, run_dir, setup.run_id, [r for rec in records.values() for r in rec["rids"]])
        if setup.server_log is not None and Path(setup.server_log).exists():
            (run_dir / "server.log").write_bytes(Path(setup.server_log).read_bytes())
    if setup.trace_source is not None:  # a finished run only: an exception above is not masked
        from eval.bcp.trace import collect_trace

        collect_trace(setup.trace_source, run_dir, list(records.values()), setup.config.chat_template_kwargs)
    return [records[q.query_id] for q in setup.queries if q.query_id in records]


def collect_events(source: Path, run_dir: Path, run_id: str, rids: list[str], timeout: float = 30.0) -> int:
    """Copy the server's events of this run's requests into ``run_dir/events.jsonl``; returns how many."""
    from eval.server import wait_for_events

    wait_for_events(source, rids, timeout=timeout)
    prefix = f"{run_id}."
    lines = []
    if Path(source).exists():
        for line in Path(source).read_text().splitlines():
            if line.strip() and json.loads(line).get("rid", "").startswith(prefix):
                lines.append(line)
    (run_dir / "events.jsonl").write_text("".join(l + "\n" for l in lines))
    return len(lines)


# ---- judging and scoring


def judge_one(judge, query, record: dict, run_dir: Path) -> dict:
    """Grade one run record (completed ones only; others are wrong without a judgment, §1.7) and
    store ``judge/<qid>.json``. A judge reply that does not parse is a judge failure: recorded,
    counted wrong, never a result."""
    path = run_dir / "judge" / f"{journal_mod.safe_qid(query.query_id)}.json"
    if record.get("status") != "completed":
        judgment = {"query_id": query.query_id, "judged": False, "correct": False, "parse_error": False,
                    "reason": f"status {record.get('status')!r}: scored wrong without judging"}
    else:
        response = record["result"][-1]["output"]
        try:
            judgment = dict(judge.grade(query, response))
        except Exception as exc:  # a judge that fails is recorded, not fatal
            judgment = {"correct": False, "parse_error": True, "judge_error": f"{type(exc).__name__}: {exc}"}
        judgment = {"query_id": query.query_id, "judged": True, **judgment}
        judgment["correct"] = bool(judgment.get("correct")) and not judgment.get("parse_error")
    journal_mod.write_json_atomic(path, judgment)
    return judgment


class JudgeAdapter:
    """Wraps ``eval/bcp/judge.py``'s ``Judge`` as ``grade(query, response) -> dict``: the verdict,
    and ``parse_error`` (with the parser's reason and the raw judge text) when the reply is not a
    judgment."""

    def __init__(self, judge):
        self.judge = judge

    def grade(self, query, response: str) -> dict:
        result = self.judge.judge(query.text, response, query.answer)
        judgment = result.judgment
        return {"correct": result.correct, "parse_error": result.error is not None, "error": result.error,
                "confidence": result.confidence, "extracted_answer": judgment.extracted_answer if judgment else None,
                "cached": result.cached, "key": result.key, "raw": result.raw}

    def describe(self) -> dict:
        return {"model": self.judge.model, "decoding": self.judge.decoding,
                "template_sha256": hashlib.sha256(self.judge.template.encode()).hexdigest()[:16]}


def load_run(run_dir: Path) -> tuple[dict, list[dict]]:
    manifest = json.loads((run_dir / MANIFEST).read_text())
    records = journal_mod.Journal(run_dir).records()
    return manifest, records


def judge_run(run_dir: Path, judge, queries_by_id: dict) -> list[dict]:
    manifest, records = load_run(run_dir)
    out = []
    for record in records:
        out.append(judge_one(judge, queries_by_id[record["query_id"]], record, run_dir))
    manifest["judge"] = judge.describe() if hasattr(judge, "describe") else {}
    journal_mod.write_json_atomic(run_dir / MANIFEST, manifest)
    return out


def read_judgments(run_dir: Path) -> dict[str, dict]:
    judged = {}
    for path in sorted((run_dir / "judge").glob("*.json")) if (run_dir / "judge").is_dir() else []:
        data = json.loads(path.read_text())
        judged[str(data["query_id"])] = data
    return judged


PER_QUESTION_FIELDS = ("query_id", "status", "judged", "correct", "parse_error", "confidence", "search_calls",
                       "recall", "lm_calls", "steps", "free_ctx_turns", "ctx_accepted", "ctx_rejected", "nudges",
                       "retries_on_limit", "prompt_tokens", "completion_tokens", "wall_s")


def score(run_dir: Path, queries_by_id: dict) -> dict:
    """Metrics of the run (§1.9) from run files + judgments; writes scores.json, per_question.csv,
    summary.json. Unjudged or unparsable questions count wrong; their numbers are reported."""
    import csv

    from eval.bcp import metrics

    manifest, records = load_run(run_dir)
    judgments = read_judgments(run_dir)
    rows = []
    for record in records:
        qid = record["query_id"]
        judgment = judgments.get(qid, {})
        query = queries_by_id[qid]
        evidence = set(query.evidence_docids)
        retrieved = set(record.get("retrieved_docids") or [])
        stats = record.get("agent_stats", {})
        rows.append({
            "query_id": qid, "status": record["status"], "judged": bool(judgment.get("judged")),
            "correct": bool(judgment.get("correct")), "parse_error": bool(judgment.get("parse_error")),
            "confidence": judgment.get("confidence"),
            "search_calls": sum(v for k, v in record.get("tool_call_counts", {}).items() if "search" in k or "retrieval" in k),
            "recall": (len(retrieved & evidence) / len(evidence)) if evidence else None,
            "lm_calls": stats.get("lm_calls", 0), "steps": record.get("steps", 0),
            "free_ctx_turns": stats.get("free_ctx_turns", 0), "ctx_accepted": stats.get("ctx_accepted", 0),
            "ctx_rejected": stats.get("ctx_rejected", 0), "nudges": stats.get("nudges", 0),
            "retries_on_limit": stats.get("retries_on_limit", 0),
            "prompt_tokens": record["tokens"]["prompt"], "completion_tokens": record["tokens"]["completion"],
            "wall_s": record.get("wall_s"),
        })
    evaluated = metrics_input(records, judgments, queries_by_id)
    scores = metrics.score_run(evaluated)
    scores = scores if isinstance(scores, dict) else dataclasses.asdict(scores)
    n = len(rows)
    summary = {
        "run_id": manifest.get("run_id"), "policy": manifest.get("policy"), "questions": n,
        "completed": sum(r["status"] == "completed" for r in rows),
        "judged": sum(r["judged"] for r in rows),
        "judge_parse_errors": sum(r["parse_error"] for r in rows),
        "correct": sum(r["correct"] for r in rows),
        "not_a_result": not_a_result_reasons(manifest, rows),
        "metrics": scores,
        "tokens": {"prompt": sum(r["prompt_tokens"] for r in rows), "completion": sum(r["completion_tokens"] for r in rows)},
    }
    journal_mod.write_json_atomic(run_dir / "scores.json", {"summary": summary, "per_question": rows})
    journal_mod.write_json_atomic(run_dir / "summary.json", summary)
    journal_mod.write_json_atomic(run_dir / "evaluation_summary.json", metrics.bcp_summary(
        scores, llm=str(manifest.get("model", {}).get("served")), retriever=manifest.get("retrieval", {}).get("backend", ""),
        date=time.strftime("%Y-%m-%d")))
    with open(run_dir / "per_question.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PER_QUESTION_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return summary


def metrics_input(records: list[dict], judgments: dict, queries_by_id: dict) -> list[dict]:
    """One evaluation record per question, in the shape ``metrics.score_run`` reads."""
    out = []
    for record in records:
        qid = record["query_id"]
        judgment = judgments.get(qid, {})
        query = queries_by_id[qid]
        out.append({
            "query_id": qid, "status": record["status"],
            "correct": (bool(judgment.get("correct")) if judgment.get("judged") and not judgment.get("parse_error")
                        else None),
            "parse_error": bool(judgment.get("parse_error")), "confidence": judgment.get("confidence"),
            "retrieved_docids": record.get("retrieved_docids") or [], "evidence_docids": list(query.evidence_docids),
            "gold_docids": list(query.gold_docids), "tool_call_counts": record.get("tool_call_counts") or {},
            "response": record["result"][-1]["output"] if record.get("result") else "",
        })
    return out


def not_a_result_reasons(manifest: dict, rows: list[dict]) -> list[str]:
    reasons = []
    if manifest.get("not_a_result"):
        reasons.append(str(manifest["not_a_result"]))
    if manifest.get("server", {}).get("kind") != "real":
        reasons.append(f"server kind {manifest.get('server', {}).get('kind')!r}")
    parse_errors = sum(r["parse_error"] for r in rows)
    if parse_errors:
        reasons.append(f"{parse_errors} judge failure(s): the judge's output did not parse")
    unjudged = sum(1 for r in rows if r["status"] == "completed" and not r["judged"])
    if unjudged:
        reasons.append(f"{unjudged} completed question(s) not judged")
    return reasons


# ---- command line


def _dataset_and_searcher(args):
    from eval.bcp import data, retrieval

    dataset = data.load_dataset(args.dataset)
    config = load_config(args.config, dict(parse_override(s) for s in args.set or []))
    searcher = retrieval.Searcher(dataset.corpus, args.index, snippet_max_tokens=config.search.snippet_max_tokens)
    return dataset, config, searcher


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


def cmd_run(args) -> int:
    dataset, config, searcher = _dataset_and_searcher(args)
    queries = select_queries(dataset.queries, args.limit, args.subset, args.subset_seed)
    server = server_description(args.server)
    model = args.model or server.get("served_model") or "default"
    run_id = args.run_id or args.out.name.replace(".", "_")
    manifest = {
        "schema": SCHEMA, "run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "policy": args.policy,
        "model": {"served": model, "path": server.get("args", {}).get("model_path")},
        "server": {"url": args.server, "kind": args.server_kind, **server, "launch_command": args.server_command},
        "agent": {"config": config.to_dict(), "fingerprint": config.fingerprint(),
                  "chat_template_kwargs": config.chat_template_kwargs, "prompts": prompts_fingerprint()},
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
    judge = None
    if args.judge_server:
        judge = make_judge(args.judge_server, args.judge_model, args.out / "judge_cache.jsonl", args.judge_max_tokens)
        manifest["judge"] = judge.describe()
    setup = RunSetup(run_dir=args.out, run_id=run_id, policy=args.policy, config=config, queries=queries,
                     make_toolbox=make_toolbox_factory(searcher, config),
                     post=http_post(args.server, timeout=config.request_timeout_s), model=model, manifest=manifest,
                     events_source=args.events, trace_source=args.server_trace, server_log=args.server_log,
                     concurrency=args.concurrency,
                     judge=judge, progress=not args.no_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    records = execute(setup)
    print(f"{len(records)} questions in {args.out} ({sum(r['status'] == 'completed' for r in records)} completed)")
    if judge is not None:
        summary = score(args.out, {q.query_id: q for q in dataset.queries})
        print(json.dumps(summary, indent=1))
    return 0


def prompts_fingerprint() -> str:
    from eval.bcp import agent

    text = json.dumps([agent.QUERY_PROMPT, agent.CLM_SYSTEM, agent.CONTEXT_TOOL, agent.SUBMIT_TOOL, agent.NUDGE,
                       agent.URGENT, agent.FINALIZE, agent.LEDGER, agent.NO_TOOL_CALL])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_judge(url: str, model: str | None, cache_path: Path, max_tokens: int = 4096):
    from eval.bcp import judge as judge_mod

    if not model:
        try:
            model = http_get(url, "/v1/models")["data"][0]["id"]
        except Exception:
            model = "default"
    return JudgeAdapter(judge_mod.Judge(url, model=model, cache_path=cache_path, max_tokens=max_tokens))


def cmd_judge(args) -> int:
    from eval.bcp import data

    manifest, _ = load_run(args.run)
    dataset = data.load_dataset(Path(args.dataset or manifest["dataset"]["path"]))
    judge = make_judge(args.judge_server, args.judge_model, args.run / "judge_cache.jsonl", args.judge_max_tokens)
    judgments = judge_run(args.run, judge, {q.query_id: q for q in dataset.queries})
    summary = score(args.run, {q.query_id: q for q in dataset.queries})
    failures = sum(bool(j.get("parse_error")) for j in judgments)
    print(f"{len(judgments)} judged, {failures} judge failure(s); accuracy {summary['metrics'].get('accuracy')}")
    if summary["not_a_result"]:
        print("NOT A RESULT: " + "; ".join(summary["not_a_result"]))
    return 0


def cmd_score(args) -> int:
    from eval.bcp import data

    manifest, _ = load_run(args.run)
    dataset = data.load_dataset(Path(args.dataset or manifest["dataset"]["path"]))
    summary = score(args.run, {q.query_id: q for q in dataset.queries})
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bcp.run", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the agent over the questions (resumable)")
    run.add_argument("--dataset", type=Path, required=True)
    run.add_argument("--server", required=True, help="base URL of the policy server")
    run.add_argument("--policy", required=True, help="the server's --cache-policy (recorded; compare keys on it)")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    run.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (YAML value)")
    run.add_argument("--index", type=Path, default=None, help="bm25s index directory (built and saved if absent)")
    run.add_argument("--limit", type=int, default=None, help="the first N questions")
    run.add_argument("--subset", type=int, default=None, help="a stable seeded subset of N questions")
    run.add_argument("--subset-seed", type=int, default=0)
    run.add_argument("--concurrency", type=int, default=1,
                     help="questions in flight at once (same in every arm; <= the scr side sessions)")
    run.add_argument("--events", type=Path, default=None, help="the server's --cache-events file")
    run.add_argument("--server-trace", type=Path, default=None,
                     help="the server's --cache-trace file: the run's calls with their exact token ids are "
                     "written to OUT/trace.jsonl")
    run.add_argument("--server-log", type=Path, default=None, help="the server's log, copied into the run at the end")
    run.add_argument("--run-id", default=None, help="rid prefix (default: the --out folder name)")
    run.add_argument("--model", default=None, help="model name to send (default: the server's)")
    run.add_argument("--server-kind", default="real", choices=("real", "stub"))
    run.add_argument("--server-command", default=None, help="the server's launch command, recorded verbatim")
    run.add_argument("--not-a-result", default=None, metavar="REASON", help="stamp the run (tests, smoke runs)")
    run.add_argument("--judge-server", default=None, help="judge each question as it finishes")
    run.add_argument("--judge-model", default=None)
    run.add_argument("--judge-max-tokens", type=int, default=4096)
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=cmd_run)
    judge = commands.add_parser("judge", help="judge a run's completed questions, then score")
    judge.add_argument("--run", type=Path, required=True)
    judge.add_argument("--judge-server", required=True)
    judge.add_argument("--judge-model", default=None)
    judge.add_argument("--judge-max-tokens", type=int, default=4096)
    judge.add_argument("--dataset", type=Path, default=None, help="default: the manifest's")
    judge.set_defaults(func=cmd_judge)
    score_parser = commands.add_parser("score", help="metrics from run files and judgments")
    score_parser.add_argument("--run", type=Path, required=True)
    score_parser.add_argument("--dataset", type=Path, default=None)
    score_parser.set_defaults(func=cmd_score)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
