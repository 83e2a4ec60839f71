"""One server against router + N workers, per policy, on the same trace (``eval.cluster bench``).

Per policy, one run after the other (never two runs at once on a small machine):

Each run is an arm (``eval/arms.py``: a name, a policy and its settings, as ``eval.bench_policies`` takes them).

1. **single**: ``eval.bench_policies.run_arm``: one server, the trace replayed with forced
   decoding, events ingested with every check, and for ``exact`` the calls whose reuse equals
   ``exact_cache.replay``'s prediction;
2. **cluster**, once per router policy: ``Cluster`` (N workers with the same serving flags, the
   router in front), the same replay through the router (with the affinity header when the router
   policy is ``manual``), the workers' events merged and ingested with every check (a rid served
   twice fails), and measured: which worker served each call, conversations split across
   workers, calls per worker, and for ``exact`` the prediction replayed *per worker* over the calls
   that worker admitted, in its queue order.

The table compares the prefix / moved / read shares of both (difference in points), counts split
conversations and prints the throughput ratio cluster / single measured in this run (calls per
second of the replay; on a 2-core machine N workers share the same two cores, so the ratio is
bounded by the hardware, and it is printed as measured).

The tiny model is random: the numbers measure the cache machinery and the routing, not the real
model's quality.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eval.arms import Arm
from eval.cluster.affinity import load, served_by, split_conversations
from eval.cluster.cluster import Cluster
from eval.server import wait_for_events_in

SHARES = ("prefix_reused_share", "moved_share", "read_share")


def per_worker_prediction(calls, events: dict[str, list[dict]], where: dict[str, str], run: str,
                          piece: int, retain: int) -> dict:
    """exact: per worker, the calls whose reuse equals ``exact_cache.replay`` over the calls that
    worker admitted (in its queue order), and the totals."""
    from eval.bench_policies import exact_agreement

    result, equal, total = {}, 0, 0
    for worker, rows in events.items():
        mine = [c for c in calls if where.get(c.rid(run)) == worker]
        agreement = exact_agreement(mine, {e["rid"]: e for e in rows}, run, piece, retain)
        result[worker] = agreement
        equal, total = equal + agreement["equal"], total + agreement["calls"]
    return {"per_worker": result, "equal": equal, "calls": total}


def run_cluster(arm: Arm | str, model_dir: Path, calls, out: Path, workers: int, concurrency: int, run: str,
                router_policy: str) -> dict:
    """Serve ``arm`` (or a policy name, with its defaults) on ``workers`` workers behind the router,
    replay, stop, ingest, measure."""
    from eval.bench_policies import bench_settings, serving_args, trace_sizes

    arm = arm if isinstance(arm, Arm) else Arm(arm, arm)
    from eval.cluster.router_client import for_router
    from eval.replay.run import replay
    from eval.report import ingest
    from eval.soak import client

    out.mkdir(parents=True, exist_ok=True)
    (out / "client.jsonl").unlink(missing_ok=True)
    args = serving_args(arm, *trace_sizes(calls), concurrency)
    affinity = router_policy == "manual"
    cluster = Cluster(str(model_dir), out, workers, args, router_policy,
                      env={"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}).start()
    try:
        def send(path, payload):
            body, headers = for_router(payload, affinity)
            return client.request(cluster.url, path, body, timeout=3600, headers=headers)

        started = time.monotonic()
        replay(send, calls[:1], out, run, 1, progress=sys.stderr)
        replay(send, calls, out, run, concurrency, progress=sys.stderr)
        wall = time.monotonic() - started
        events = wait_for_events_in(cluster.events_paths(), [c.rid(run) for c in calls], timeout=60.0)
    finally:
        cluster.stop()
    rows, failures = ingest(list(cluster.events_paths().values()), out / "report", client_path=out / "client.jsonl",
                            policy=arm.policy)
    where = served_by(events)
    result = {"arm": arm.name, "policy": arm.policy, "settings": dict(arm.settings), "router_policy": router_policy,
              "serving_profile": arm.serving_profile,
              "workers": workers, "replay_s": round(wall, 1),
              "checks_failed": failures, "server_args": args, "fatal_lines": cluster.fatal_lines(),
              "split_conversations": split_conversations(where), "load": load(where, events),
              "conversations": len({c.conversation for c in calls})}
    if arm.policy == "exact":
        settings = bench_settings(arm)
        result["exact_prediction"] = per_worker_prediction(calls, events, where, run, int(settings["piece_tokens"]),
                                                           int(settings["retain_every"]))
    (out / "cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def shares(report: Path) -> dict[str, float]:
    summary = json.loads((report / "summary.json").read_text())["all"]
    return {key: summary[key] for key in SHARES}


def share_cells(values: dict[str, float]) -> str:
    return " / ".join(f"{values[key]:.1%}" for key in SHARES)


def max_gap_points(a: dict[str, float], b: dict[str, float]) -> float:
    return max(abs(a[key] - b[key]) for key in SHARES) * 100.0


def table(results: dict[str, dict], calls: int) -> str:
    """One column per (arm, setup); rows as in docs/cluster.md."""
    columns = [(name, setup) for name, setups in results.items() for setup in setups]
    head = [f"{name} {setup}" for name, setup in columns]
    lines = [f"{calls} calls; the tiny random model on CPU (cache machinery and routing, not quality)", "",
             "| | " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]

    def row(label, cell):
        lines.append(f"| {label} | " + " | ".join(cell(results[p][a], results[p]["single"]) for p, a in columns) + " |")

    row("prefix / moved / read", lambda r, s: share_cells(r["shares"]))
    row("largest share gap to single, points", lambda r, s: f"{max_gap_points(r['shares'], s['shares']):.2f}")
    row("conversations split across workers",
        lambda r, s: "" if "split_conversations" not in r else f"{len(r['split_conversations'])}/{r['conversations']}")
    row("calls per worker",
        lambda r, s: "" if "load" not in r else " / ".join(str(v["calls"]) for v in r["load"].values()))
    row("exact: calls equal to exact_cache.replay (per worker)",
        lambda r, s: f"{r['exact_prediction']['equal']}/{r['exact_prediction']['calls']}" if "exact_prediction" in r else "")
    row("replay wall time, s", lambda r, s: f"{r['replay_s']:.0f}")
    row("throughput ratio to single", lambda r, s: f"{s['replay_s'] / r['replay_s']:.2f}" if r["replay_s"] else "n/a")
    row("checks", lambda r, s: "pass" if not r["checks_failed"] and not r.get("fatal_lines") else "FAILED")
    return "\n".join(lines)


def bench(trace_path: Path, out: Path, arms: list[Arm | str], workers: int, router_policies: list[str],
          concurrency: int, model_dir: Path, run: str = "cluster") -> dict:
    """``arms``: ``Arm`` values, or policy names (each with its defaults)."""
    from eval.bench_policies import run_arm
    from eval.traces import read_trace

    calls = read_trace(trace_path)
    results: dict[str, dict] = {}
    for arm in (a if isinstance(a, Arm) else Arm(a, a) for a in arms):
        print(f"eval.cluster bench: {arm.name} ({arm.describe()}): one server", file=sys.stderr, flush=True)
        single = run_arm(arm, model_dir, calls, out / arm.name / "single", concurrency, run)
        single["shares"] = shares(out / arm.name / "single" / "report")
        results[arm.name] = {"single": single}
        for router_policy in router_policies:
            setup = f"{workers}w-{router_policy}"
            print(f"eval.cluster bench: {arm.name}: router ({router_policy}) + {workers} workers", file=sys.stderr,
                  flush=True)
            result = run_cluster(arm, model_dir, calls, out / arm.name / setup, workers, concurrency, run,
                                 router_policy)
            result["shares"] = shares(out / arm.name / setup / "report")
            results[arm.name][setup] = result
    text = table(results, len(calls))
    (out / "table.md").write_text(text + "\n")
    (out / "cluster_bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)
    return results


def failed(results: dict[str, dict]) -> list[str]:
    """What makes the run fail (exit 1): a failed check, a fatal log line, exact's reuse off its
    prediction, a conversation split under the affinity rule, a share more than 1 point off."""
    problems = []
    for policy, arms in results.items():
        single = arms["single"]
        for arm, r in arms.items():
            name = f"{policy} {arm}"
            if r["checks_failed"] or r.get("fatal_lines"):
                problems.append(f"{name}: checks failed")
            prediction = r.get("exact_prediction")
            if prediction and prediction["equal"] != prediction["calls"]:
                problems.append(f"{name}: exact reuse differs from its prediction")
            if r.get("router_policy") == "manual":
                if r["split_conversations"]:
                    problems.append(f"{name}: conversations split: {r['split_conversations'][:5]}")
                if max_gap_points(r["shares"], single["shares"]) > 1.0:
                    problems.append(f"{name}: shares more than 1 point from the single server")
    return problems
