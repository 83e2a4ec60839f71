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
   workers, calls per worker, trace calls with no event (lost), for ``exact`` the prediction
   replayed *per worker* over the calls that worker admitted, in its queue order, and what the
   single run predicts for this assignment of conversations to workers (``predicted_calls``:
   radix and scr read a shared prefix once more on each worker).

The table compares the prefix / moved / read shares with the single server's and with the
prediction (difference in points), counts split conversations and prints the throughput ratio
cluster / single measured in this run (calls per second of the replay; on a 2-core machine N
workers share the same two cores, so the ratio is bounded by the hardware, and it is printed as
measured). ``failed`` says what makes the bench exit 1: a fault, never the assignment itself.

The tiny model is random: the numbers measure the cache machinery and the routing, not the real
model's quality.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping

from eval.arms import Arm
from eval.cluster.affinity import load, manual_branches, routing_key, served_by, split_conversations
from eval.cluster.cluster import Cluster
from eval.server import request_events, wait_for_events_in

SHARES = ("prefix_reused_share", "moved_share", "read_share")


def replayed_reuse(calls, events: Mapping[str, dict], run: str, piece: int, retain: int) -> dict[str, int]:
    """rid -> ``exact_cache.replay``'s reuse for the calls of ``events`` (one server's) under the grid
    rule (``eval.bench_policies.replayed_reuse``); per call, so the predicted shares can be summed."""
    from eval.bench_policies import replayed_reuse as replay
    from exact_cache.replay import ReplayTree

    return replay(calls, events.values(), run, ReplayTree(piece, retain))


def per_worker_prediction(calls, events: dict[str, list[dict]], where: dict[str, str], run: str,
                          piece: int, retain: int) -> dict:
    """exact: per worker, the calls whose reuse equals ``exact_cache.replay`` over the calls that
    worker admitted (in its queue order), the totals, and the predicted reuse of every call
    (``predicted``: rid -> tokens), from which the cluster's predicted shares are summed."""
    result, predicted = {}, {}
    for worker, rows in events.items():
        mine = [c for c in calls if where.get(c.rid(run)) == worker]
        served = {e["rid"]: e for e in rows}
        reuse = replayed_reuse(mine, served, run, piece, retain)
        differ = [{"rid": rid, "served": served[rid]["prefix_reused"], "predicted": p}
                  for rid, p in reuse.items() if served[rid]["prefix_reused"] != p]
        result[worker] = {"calls": len(reuse), "equal": len(reuse) - len(differ), "differ": differ[:20],
                          "share": (len(reuse) - len(differ)) / len(reuse) if reuse else 0.0}
        predicted.update(reuse)
    equal = sum(r["equal"] for r in result.values())
    return {"per_worker": result, "equal": equal, "calls": len(predicted), "predicted": predicted}


def lost_calls(calls, run: str, where: Mapping[str, str]) -> list[str]:
    """The trace's rids that no worker has an event for: a call the cluster lost (sorted).

    A lost call would otherwise only shrink the shares' denominator, which no share check sees."""
    return sorted(c.rid(run) for c in calls if c.rid(run) not in where)


def first_calls(calls, run: str) -> set[str]:
    """The rid of each conversation's lowest turn in the trace.

    On one server such a call can reuse nothing of its own conversation, so whatever it reused
    came from another conversation (a shared prefix such as the system prompt): the only calls
    whose reuse depends on which conversations share a worker."""
    lowest: dict[str, int] = {}
    for call in calls:
        lowest[call.conversation] = min(call.turn, lowest.get(call.conversation, call.turn))
    return {c.rid(run) for c in calls if c.turn == lowest[c.conversation]}


def another_came_first(rid: str, where: Mapping[str, str], cluster: Mapping[str, dict]) -> bool:
    """Whether a call of another conversation was queued on ``rid``'s worker before ``rid`` (the
    cluster's own ``queued_ts``): only then can a shared prefix be in that worker's cache for it."""
    worker, mine = where[rid], routing_key(rid)
    queued = cluster[rid]["queued_ts"]
    return any(other_worker == worker and routing_key(other) != mine and cluster[other]["queued_ts"] < queued
               for other, other_worker in where.items() if other in cluster)


def predicted_calls(policy: str, calls, run: str, single: Mapping[str, dict], cluster: Mapping[str, dict],
                    where: Mapping[str, str], exact_reuse: Mapping[str, int] | None = None) -> dict[str, dict]:
    """rid -> predicted ``prefix_reused`` / ``moved`` / ``read`` / ``prompt_tokens`` of each call
    the cluster served, for this assignment of conversations to workers.

    * exact: the reuse is ``exact_reuse`` (``exact_cache.replay`` per worker,
      ``per_worker_prediction``), nothing moves, the rest is read.
    * radix, scr: the single server's values, except a conversation's first call
      (``first_calls``), whose reuse there came from other conversations: it keeps its single-run
      ``prefix_reused`` only if another conversation's call was queued before it on its worker
      (``another_came_first``), else the worker reads those tokens (its reuse is 0). Its ``moved``
      also came from another conversation (scr's content-matched session) and follows the same
      rule. The trace's very first call is replayed alone on both sides, so it is first on its
      worker and reused nothing in the single run either.

    ``single``, ``cluster``: rid -> event of the single run and of the cluster (merged workers);
    ``where``: rid -> worker (``affinity.served_by``). A call missing from a side it needs is left
    out (lost calls and the single run's own checks report it)."""
    firsts = first_calls(calls, run)
    result = {}
    for call in calls:
        rid = call.rid(run)
        if rid not in where or rid not in cluster:
            continue
        if policy == "exact":
            if exact_reuse is None or rid not in exact_reuse:
                continue
            prompt, reused, moved = cluster[rid]["prompt_tokens"], exact_reuse[rid], 0
        else:
            if rid not in single:
                continue
            event = single[rid]
            prompt, reused, moved = event["prompt_tokens"], event["prefix_reused"], event["moved"]
            if rid in firsts and not another_came_first(rid, where, cluster):
                reused, moved = 0, 0
        result[rid] = {"prompt_tokens": prompt, "prefix_reused": reused, "moved": moved,
                       "read": prompt - reused - moved}
    return result


def token_shares(rows: Iterable[Mapping]) -> dict[str, float]:
    """Prefix / moved / read shares of all prompt tokens, summed over ``rows`` (events or
    predictions): the formula of ``eval.accounting.provenance.summary``, so a prediction and a
    report's summary are compared on the same definition."""
    rows = list(rows)
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {f"{f}_share": (sum(r[f] for r in rows) / prompt if prompt else 0.0)
            for f in ("prefix_reused", "moved", "read")}


def prediction_differs(predicted: Mapping[str, dict], cluster: Mapping[str, dict]) -> list[dict]:
    """The calls whose served (prefix_reused, moved, read) differ from the prediction: where to
    look when the share gap to the prediction is large."""
    keys = ("prefix_reused", "moved", "read")
    return [{"rid": rid, "served": [cluster[rid][k] for k in keys], "predicted": [p[k] for k in keys]}
            for rid, p in predicted.items() if any(cluster[rid][k] != p[k] for k in keys)]


def cluster_prediction(policy: str, calls, run: str, single: Mapping[str, dict] | None,
                       events: Mapping[str, list[dict]], where: Mapping[str, str],
                       exact_prediction: dict | None = None) -> dict:
    """What the single server's run predicts for this cluster run (``predicted_calls``): the
    shares (``predicted_shares``) and the calls off the prediction (``prediction_differs``, count
    and the first 20). Empty when there is nothing to predict from (no single-run events, or
    exact without its per-worker replay): ``failed`` then reports the missing prediction."""
    exact_reuse = (exact_prediction or {}).get("predicted")
    if (policy == "exact" and exact_reuse is None) or (policy != "exact" and not single):
        return {}
    cluster = {e["rid"]: e for rows in events.values() for e in rows}
    predicted = predicted_calls(policy, calls, run, single or {}, cluster, where, exact_reuse)
    differs = prediction_differs(predicted, cluster)
    return {"predicted_shares": token_shares(predicted.values()), "predicted_calls": len(predicted),
            "prediction_differs": {"calls": len(differs), "first": differs[:20]}}


def measure(policy: str, calls, run: str, events: Mapping[str, list[dict]],
            single_events: Mapping[str, dict] | None = None, grid: tuple[int, int] | None = None) -> dict:
    """A cluster run's measurements from its per-worker events (worker -> event dicts) alone, so
    the bench's rules can be tested without a server: who served what, split conversations, load,
    lost calls, exact's per-worker prediction (``grid``: its piece and retain_every) and the
    prediction from the single run (``cluster_prediction``)."""
    where = served_by(events)
    result = {"split_conversations": split_conversations(where), "load": load(where, events),
              "conversations": len({c.conversation for c in calls}),
              "calls": len(calls), "lost_calls": lost_calls(calls, run, where)}
    if policy == "exact":
        result["exact_prediction"] = per_worker_prediction(calls, events, where, run, *grid)
    result.update(cluster_prediction(policy, calls, run, single_events, events, where,
                                     result.get("exact_prediction")))
    return result


def run_cluster(arm: Arm | str, model_dir: Path, calls, out: Path, workers: int, concurrency: int, run: str,
                router_policy: str, single_events: Mapping[str, dict] | None = None) -> dict:
    """Serve ``arm`` (or a policy name, with its defaults) on ``workers`` workers behind the router,
    replay, stop, ingest, measure, and predict from ``single_events`` (rid -> event of the single
    server's run of the same trace; ``cluster_prediction``)."""
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
        metrics = cluster.router_metrics()
    finally:
        cluster.stop()
    rows, failures = ingest(list(cluster.events_paths().values()), out / "report", client_path=out / "client.jsonl",
                            policy=arm.policy)
    settings = bench_settings(arm)
    grid = (int(settings["piece_tokens"]), int(settings["retain_every"])) if arm.policy == "exact" else None
    result = {"arm": arm.name, "policy": arm.policy, "settings": dict(arm.settings), "router_policy": router_policy,
              "serving_profile": arm.serving_profile,
              "workers": workers, "replay_s": round(wall, 1),
              "checks_failed": failures, "server_args": args, "fatal_lines": cluster.fatal_lines(),
              "router_branches": manual_branches(metrics) if metrics is not None else None,
              **measure(arm.policy, calls, run, events, single_events, grid)}
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
    row("largest share gap to prediction, points",
        lambda r, s: f"{max_gap_points(r['shares'], r['predicted_shares']):.2f}" if "predicted_shares" in r else "")
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
        single_events = {e["rid"]: e for e in request_events(out / arm.name / "single" / "events.jsonl")}
        results[arm.name] = {"single": single}
        for router_policy in router_policies:
            setup = f"{workers}w-{router_policy}"
            print(f"eval.cluster bench: {arm.name}: router ({router_policy}) + {workers} workers", file=sys.stderr,
                  flush=True)
            result = run_cluster(arm, model_dir, calls, out / arm.name / setup, workers, concurrency, run,
                                 router_policy, single_events)
            result["shares"] = shares(out / arm.name / setup / "report")
            results[arm.name][setup] = result
    text = table(results, len(calls))
    (out / "table.md").write_text(text + "\n")
    (out / "cluster_bench.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)
    return results


def failed(results: dict[str, dict]) -> list[str]:
    """What makes the run fail (exit 1): only a fault, never what the assignment of conversations
    to workers explains.

    Every run: a failed check or a fatal log line; exact's reuse off its prediction (one server's
    ``exact_cache.replay``, or per worker in the cluster); a trace call with no event in a cluster
    run (lost). Under the ``manual`` router policy also: a conversation split across workers, and
    for radix / scr a share more than 1 point from what the single run predicts for this
    assignment (``predicted_calls``). The gap to the single server is not a rule: each worker
    reads the shared system prompt once, which a correct run shows as a gap."""
    problems = []
    for policy, arms in results.items():
        for arm, r in arms.items():
            name = f"{policy} {arm}"
            if r["checks_failed"] or r.get("fatal_lines"):
                problems.append(f"{name}: checks failed")
            prediction = r.get("exact_prediction")
            if prediction and prediction["equal"] != prediction["calls"]:
                problems.append(f"{name}: exact reuse differs from its prediction")
            if r.get("lost_calls"):
                problems.append(f"{name}: {len(r['lost_calls'])} calls lost (no event): {r['lost_calls'][:5]}")
            if r.get("router_policy") == "manual":
                problems += manual_problems(name, r)
    return problems


def manual_problems(name: str, r: dict) -> list[str]:
    """The rules that hold only under conversation affinity (``failed``): no split conversation,
    no call routed without its key (the router's own count, when it answered), and for radix /
    scr the shares within 1 point of the prediction (exact's per-call equality is the stronger
    rule, checked for every run)."""
    problems = []
    if r["split_conversations"]:
        problems.append(f"{name}: conversations split: {r['split_conversations'][:5]}")
    keyless = (r.get("router_branches") or {}).get("no_routing_id")
    if keyless:
        problems.append(f"{name}: {keyless} calls reached the router without a routing key")
    if r.get("policy") == "exact":
        if "exact_prediction" not in r:
            problems.append(f"{name}: no per-worker exact prediction")
    elif "predicted_shares" not in r:
        problems.append(f"{name}: no prediction from the single run to compare with")
    elif max_gap_points(r["shares"], r["predicted_shares"]) > 1.0:
        problems.append(f"{name}: shares more than 1 point from the prediction "
                        f"({max_gap_points(r['shares'], r['predicted_shares']):.2f})")
    return problems
