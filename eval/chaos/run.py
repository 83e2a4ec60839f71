"""The chaos scenarios: one policy, one server or the router with two workers, faults at set turns.

**alone** (one server, its events file on a disk that fills):

1. turns ``[0, a)`` of every conversation are replayed;
2. **disk full**: the disk under the events file is filled (``disk.py``), ``lost`` calls are
   sent one at a time (their answers come back; their events cannot be written), the disk is freed;
3. the rest of turns ``[a, b)``;
4. **restart**: the server is killed (SIGKILL, nothing in flight: between turns) and started again
   on the same events file with a **shrunk KV pool** (``--max-total-tokens`` = 1.5 x the longest call),
   so the tree evicts and scr's evict-then-retry can fire;
5. turns ``[b, T)``; then (exact) the probes: a few prompts read warm and cold (``probes.py``).

**router** (``eval.cluster``: the router with its ``manual`` affinity policy and two workers):

1. turns ``[0, a)``: every conversation is pinned to a worker;
2. turns ``[a, b)``, and while a call of a worker-1 conversation is in flight, worker-1 is
   **killed** (SIGKILL of its process group); the client retries (``eval/replay/retry.py``) until the router
   sends the call to worker-0;
3. **worker-1 restarted** on its port and events file; the router takes it back after its health check;
4. turns ``[b, T)``; then the probes on each worker that served calls after the kill.

Each scenario writes ``OUT/<policy>-<setup>/``: ``client.jsonl``, the servers' logs and events,
``report/`` (``eval.report ingest`` over every events file) and ``result.json`` (what happened:
phases, the killed calls, the retries, what the disk lost), which ``checks.py`` judges.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from eval.arms import Arm
from eval.chaos import disk as disks
from eval.chaos.checks import conversation_of
from eval.replay.retry import RetryingSend
from eval.chaos.probes import probe_exact
from eval.server import FATAL_MARKERS, ServerProcess, wait_for_events_in
from eval.soak import client

RUN = "chaos"
LOST_WRITES = 2  # calls answered while the disk is full


@dataclass(frozen=True)
class Plan:
    """Where the faults go: turns ``[0, a)``, ``[a, b)``, ``[b, T)``."""

    a: int
    b: int
    concurrency: int = 2
    lost: int = LOST_WRITES

    @classmethod
    def for_turns(cls, turns: int, concurrency: int = 2, lost: int = LOST_WRITES) -> "Plan":
        if turns < 3:
            raise ValueError(f"a chaos run needs at least 3 turns per conversation (one per phase), got {turns}")
        return cls(a=max(1, turns // 3), b=max(2, (2 * turns) // 3), concurrency=concurrency, lost=lost)


def phase(calls, low: int, high: int) -> list:
    return [c for c in calls if low <= c.turn < high]


def server_args(policy: str, calls, concurrency: int, pool: int | None = None) -> list[str]:
    from eval.bench_policies import serving_args, trace_sizes

    context, tokens = trace_sizes(calls)
    return serving_args(Arm(policy, policy), context, pool or tokens, concurrency)


def shrunk_pool(calls) -> int:
    """A KV pool of one and a half of the longest call (rounded up to 512 tokens): one call runs,
    the conversations' earlier prompts must be evicted for the next, and a relocation that needs
    rows finds the pool full (scr's evict-then-retry, docs/scr.md §10.3)."""
    longest = max(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    return -(-(3 * longest // 2) // 512) * 512


def fatal(logs: list[Path]) -> dict[str, list[str]]:
    found = {}
    for path in logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        lines = [line for line in text.splitlines() if any(m in line for m in FATAL_MARKERS)]
        if lines:
            found[str(path)] = lines[:5]
    return found


@dataclass
class Record:
    """What a scenario did, for the checks and the report."""

    policy: str
    setup: str
    out: Path
    events: list[Path] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    notes: dict = field(default_factory=dict)

    def save(self) -> dict:
        data = {"policy": self.policy, "setup": self.setup, "events": [str(p) for p in self.events],
                "logs": [str(p) for p in self.logs], **self.notes}
        (self.out / "result.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
        return data


def replay_phase(send, calls, out: Path, concurrency: int, progress=None) -> None:
    from eval.replay.run import replay

    if calls:
        replay(send, calls, out, RUN, concurrency, progress=progress)


def direct_send(base: str):
    def send(path, payload):
        return client.request(base, path, payload, timeout=600)
    return send


# ---------------------------------------------------------------------- alone


def run_alone(policy: str, calls, out: Path, model: Path, plan: Plan, allow_mount: bool = True) -> Record:
    out.mkdir(parents=True, exist_ok=True)
    (out / "client.jsonl").unlink(missing_ok=True)
    disk = disks.open_disk(out / "disk", allow_mount)
    events = disk.events_dir() / "events.jsonl"
    events.unlink(missing_ok=True)
    record = Record(policy, "alone", out, events=[events], notes={"disk": disk.kind})
    args = [*server_args(policy, calls, plan.concurrency), "--cache-events", str(events)]
    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", **disk.server_env(len(phase(calls, 0, plan.a)) + 1, plan.lost)}
    server = ServerProcess(str(model), out / "server-1.log", args, env=env, graceful_stop=False)
    record.logs.append(server.log_path)
    try:
        _alone_until_the_kill(server, record, disk, calls, out, events, plan)
        kill(server)
        record.notes["killed"] = {"server": "server-1", "between_turns": True, "after_turn": plan.b - 1}
        server = _alone_restart_server(policy, calls, out, model, plan, events, server.port, record)
        _alone_after_the_restart(server, record, policy, calls, out, events, plan)
    except Exception as exc:  # noqa: BLE001 - a scenario that stops is judged as far as it got
        record.notes["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
        if "events_at_end" not in record.notes:  # before the tmpfs (and the file on it) goes
            snapshot_events(record)
        disk.close()
    return record


def _alone_until_the_kill(server: ServerProcess, record: Record, disk, calls, out: Path, events: Path,
                          plan: Plan) -> None:
    """Turns before ``plan.a``; then up to ``plan.b`` with the disk full for a window of calls
    (their events lost), the rest after it is freed."""
    first, middle = phase(calls, 0, plan.a), phase(calls, plan.a, plan.b)
    server.start()
    send = RetryingSend(direct_send(server.url))
    replay_phase(send, first, out, plan.concurrency)
    wait_for_events_in({"e": events}, [c.rid(RUN) for c in first], timeout=30)
    disk.fill()
    # the last conversations' calls first (turn order kept): the first conversation's calls,
    # which relocate in the CI trace, keep their events
    candidates = sorted(middle, key=lambda c: (c.turn, [-ord(ch) for ch in c.conversation]))
    window = full_disk_window(send, candidates, out, server.log_path, events, plan.lost)
    record.notes["lost_window"] = [c.rid(RUN) for c in window]
    # when each was sent: the exact replay must still see the prompts whose events were lost
    record.notes["window_sent_ts"] = {c.rid(RUN): send.sent_at[c.rid(RUN)] for c in window}
    disk.free()
    rest = [c for c in middle if c not in window]
    replay_phase(send, rest, out, plan.concurrency)
    wait_for_events_in({"e": events}, [c.rid(RUN) for c in rest], timeout=30)


def _alone_restart_server(policy: str, calls, out: Path, model: Path, plan: Plan, events: Path, port: int,
                          record: Record) -> ServerProcess:
    """The second server (not started): same port and events file, a KV pool shrunk to what the
    remaining turns need."""
    pool = shrunk_pool(calls)
    args2 = [*server_args(policy, calls, plan.concurrency, pool), "--cache-events", str(events)]
    server = ServerProcess(str(model), out / "server-2.log", args2, env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"},
                           graceful_stop=False, port=port)
    record.logs.append(server.log_path)
    record.notes["restart_pool_tokens"] = pool
    return server


def _alone_after_the_restart(server: ServerProcess, record: Record, policy: str, calls, out: Path, events: Path,
                             plan: Plan) -> None:
    """The turns from ``plan.b`` on, on the restarted server; exact's probes after the snapshot."""
    server.start()
    send = RetryingSend(direct_send(server.url))
    last = phase(calls, plan.b, 10**9)
    replay_phase(send, last, out, plan.concurrency)
    wait_for_events_in({"e": events}, [c.rid(RUN) for c in last], timeout=30)
    record.notes["retried"] = send.retried()
    record.notes["after_restart"] = {"server-2": [c.rid(RUN) for c in last]}
    snapshot_events(record)
    if policy == "exact":
        record.notes["probes"] = probe_exact({"server-2": server.url}, last, RUN)


def full_disk_window(send, candidates, out: Path, log: Path, events: Path, lost: int) -> list:
    """Send ``candidates`` one at a time while the disk is full, until ``lost`` event writes have
    failed; the calls sent. On a real tmpfs the first events may still fit: the file's last page
    has room the filler cannot take, so the window runs until the writer reports losses."""
    window, start = [], lost_count(log)
    for call in candidates:
        before = lost_count(log)
        send.sent_at[call.rid(RUN)] = time.time()
        replay_phase(send, [call], out, 1)
        window.append(call)
        wait_event_or_loss(log, events, call.rid(RUN), before)
        if lost_count(log) - start >= lost:
            break
    return window


def lost_count(log: Path) -> int:
    """The writer's lost lines in a server log (``serving.jsonl_append.LOST_LINE``)."""
    from serving.jsonl_append import LOST_LINE

    return len(LOST_LINE.findall(log.read_text(errors="replace"))) if log.exists() else 0


def wait_event_or_loss(log: Path, events: Path, rid: str, before: int, timeout: float = 30.0) -> None:
    """Until ``rid``'s event is in the file or one more lost line is logged (the event is written
    as the request leaves the scheduler, just after its answer)."""
    from eval.server import request_events

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lost_count(log) > before or any(e["rid"] == rid for e in request_events(events)):
            return
        time.sleep(0.1)


def kill(server: ServerProcess) -> None:
    """SIGKILL to the server's whole process group (launcher, scheduler, detokenizer): a crash."""
    try:
        os.killpg(server.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.process.wait(timeout=30)


def snapshot_events(record: Record) -> None:
    """Copy each events file as it is now (before the probes add their own events)."""
    copies = []
    for path in record.events:
        copy = record.out / "events" / f"{path.parent.name}-{path.name}"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(path.read_bytes() if path.exists() else b"")
        copies.append(copy)
    record.notes["events_at_end"] = [str(p) for p in copies]


# ---------------------------------------------------------------------- router


def run_router(policy: str, calls, out: Path, model: Path, plan: Plan, workers: int = 2) -> Record:
    from eval.cluster.cluster import Cluster

    out.mkdir(parents=True, exist_ok=True)
    (out / "client.jsonl").unlink(missing_ok=True)
    args = server_args(policy, calls, plan.concurrency)
    cluster = Cluster(str(model), out, workers, args, "manual", env={"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"})
    record = Record(policy, "router", out, events=list(cluster.events_paths().values()),
                    logs=[cluster.worker_dir(i) / "server.log" for i in range(workers)])
    try:
        _router_scenario(cluster, record, policy, calls, out, plan, workers)
    except Exception as exc:  # noqa: BLE001 - a scenario that stops is judged as far as it got
        record.notes["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
        if "events_at_end" not in record.notes:
            snapshot_events(record)
    return record


def _router_scenario(cluster, record: Record, policy: str, calls, out: Path, plan: Plan, workers: int) -> None:
    """Turns before ``plan.a`` pin the conversations; the last worker is killed while it serves
    turns up to ``plan.b`` and restarted; the rest, then exact's probes."""
    from eval.cluster.router_client import for_router

    cluster.start()
    def via_router(path, payload):
        body, headers = for_router(payload, True)
        return client.request(cluster.url, path, body, timeout=600, headers=headers)

    send = RetryingSend(via_router)
    first = phase(calls, 0, plan.a)
    replay_phase(send, first, out, len({c.conversation for c in calls}))
    pins = pinned(cluster, [c.rid(RUN) for c in first])
    victim = workers - 1
    _replay_killing(cluster, victim, send, pins, record, calls, phase(calls, plan.a, plan.b), out)
    restarted = restart_worker(cluster, victim, out)
    record.logs.append(restarted.log_path)
    record.notes["restarted"] = f"worker-{victim}"
    record.notes["router_takes_back_s"] = wait_router_uses(cluster)
    last = phase(calls, plan.b, 10**9)
    replay_phase(send, last, out, len({c.conversation for c in calls}))
    wait_for_events_in(cluster.events_paths(), [c.rid(RUN) for c in calls], timeout=30)
    record.notes["pins_before_kill"] = pins
    record.notes["retried"] = send.retried()
    snapshot_events(record)
    if policy == "exact":
        urls = {f"worker-{i}": s.url for i, s in enumerate(cluster.servers)}
        record.notes["probes"] = probe_exact(urls, last, RUN, via=where_served(cluster, last))


def _replay_killing(cluster, victim: int, send, pins: dict[str, str], record: Record, calls, middle, out: Path) -> None:
    """Replay ``middle`` while a thread kills worker ``victim`` once it serves one of its pinned conversations."""
    victims = {conv for conv, w in pins.items() if w == f"worker-{victim}"}
    done = threading.Event()
    killer = threading.Thread(target=kill_when_busy, args=(cluster, victim, send, victims, record, done),
                              daemon=True)
    killer.start()
    try:
        replay_phase(send, middle, out, len({c.conversation for c in calls}))
    finally:
        done.set()
        killer.join(timeout=60)


def pinned(cluster, rids) -> dict[str, str]:
    """conversation -> the worker that served its calls so far."""
    from eval.cluster.affinity import served_by

    where = served_by(wait_for_events_in(cluster.events_paths(), rids, timeout=30))
    return {conversation_of(rid): worker for rid, worker in where.items()}


def where_served(cluster, calls) -> dict[str, str]:
    from eval.server import request_events

    where = {}
    for name, path in cluster.events_paths().items():
        for event in request_events(path):
            where[event["rid"]] = name
    return {c.rid(RUN): where.get(c.rid(RUN)) for c in calls}


def kill_when_busy(cluster, victim: int, send: RetryingSend, conversations: set[str], record: Record,
                   done: threading.Event, settle_s: float = 0.05) -> None:
    """SIGKILL worker ``victim`` once a call of one of its conversations has been in flight for
    ``settle_s`` (so it reached the worker): a crash with a call on the wire. If the phase ends
    first (calls of a quarter second are easy to miss), the worker is killed between turns."""
    while not done.is_set():
        with send.lock:
            busy = [(rid, t) for rid, t in send.in_flight.items() if conversation_of(rid) in conversations]
        ready = [rid for rid, t in busy if time.monotonic() - t >= settle_s]
        if ready:
            break
        time.sleep(0.005)
    else:
        ready = []
    kill(cluster.servers[victim])
    record.notes["killed"] = {"server": f"worker-{victim}", "in_flight": ready, "at": time.time()}
    print(f"eval.chaos: killed worker-{victim} with {len(ready)} call(s) in flight", file=sys.stderr, flush=True)


def restart_worker(cluster, index: int, out: Path) -> ServerProcess:
    old = cluster.servers[index]
    fresh = ServerProcess(old.model_path, old.log_path.with_name("server-2.log"), old.extra_args, env=old.env,
                          graceful_stop=False, port=old.port, cpus=old.cpus)
    fresh.start()
    cluster.servers[index] = fresh
    return fresh


def wait_router_uses(cluster, timeout: float = 60.0) -> float | None:
    """Seconds until the router reports every worker healthy again (its /readiness), or None."""
    from eval import http

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if http.get(cluster.url + "/readiness", timeout=5).ok:
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return None
