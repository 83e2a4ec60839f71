"""Replay a trace against a running server with forced decoding; see ``eval/replay/__init__.py``.

The pieces are plain functions over a ``send(path, payload) -> Reply`` transport (``eval.soak.client``'s
``request`` bound to the server), so the scheduling and resume logic run in unit tests against a
fake one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence, TextIO

from eval.cluster.router_client import for_router
from eval.fidelity.run import UsageError, check_loopback, check_reachable
from eval.replay.retry import RetryingSend, Send, ServerError
from eval.soak import client
from eval.traces.format import TraceCall, TraceError, by_conversation, read_trace

CLIENT_FILE = "client.jsonl"
DEFAULT_RUN = "replay"
CALL_TIMEOUT_S = 3600.0  # one call: a long prompt read cold on a busy server
PROGRESS_EVERY_S = 5.0


class Mismatch(RuntimeError):
    """The server's output ids differ from the trace's completion ids (exit status 1: a failed check)."""


def call_payload(call: TraceCall, run: str) -> dict:
    """The ``/generate`` body of one trace call: its prompt ids, its completion ids forced
    (``patches/forced.py``), greedy, EOS ignored; ``extra_key`` = the call's cache salt;
    ``session_id`` = ``<run>.<conversation>`` (SGLang ignores it without its session radix cache;
    scr reads it under ``session_identity=session_id``).
    An empty completion is sent as ``max_new_tokens`` 0: the prompt is read (and cached) and
    nothing is generated, which is all the original call did to the cache's token sequences."""
    params: dict = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": len(call.completion_ids)}
    if call.completion_ids:
        params["custom_params"] = {"forced_output_ids": list(call.completion_ids)}
    payload = {"input_ids": list(call.prompt_ids), "rid": call.rid(run), "sampling_params": params,
               "session_id": f"{run}.{call.conversation}"}
    if call.cache_salt is not None:
        payload["extra_key"] = call.cache_salt
    return payload


def client_record(call: TraceCall, run: str, body: dict, seconds: float) -> dict:
    """One ``client.jsonl`` line, in ``eval.workload``'s shape (what ``eval.report ingest
    --client`` joins on: ``rid`` and ``usage.prompt_tokens`` / ``usage.completion_tokens``)."""
    meta = body.get("meta_info") or {}
    usage = {"prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": meta.get("completion_tokens"),
             "cached_tokens": meta.get("cached_tokens")}
    return {"rid": call.rid(run), "conversation": call.conversation, "turn": call.turn, "kind": call.kind,
            "usage": usage, "cached_tokens": meta.get("cached_tokens"), "seconds": round(seconds, 4)}


def send_call(send: Send, call: TraceCall, run: str) -> dict:
    """Send one call; its client record. Raises ``ServerError`` or ``Mismatch`` naming the rid."""
    rid = call.rid(run)
    started = time.monotonic()
    reply = send("/generate", call_payload(call, run))
    seconds = time.monotonic() - started
    if reply.status != 200 or not isinstance(reply.body, dict):
        raise ServerError(f"{rid}: status {reply.status}: {reply.error or reply.body!r:.300}")
    got = list(reply.body.get("output_ids") or [])
    if got != list(call.completion_ids):
        position = next((i for i, (a, b) in enumerate(zip(got, call.completion_ids)) if a != b),
                        min(len(got), len(call.completion_ids)))
        raise Mismatch(f"{rid}: the server answered {len(got)} ids, the trace has {len(call.completion_ids)}; "
                       f"first difference at position {position} (is the server forcing? same vocabulary?)")
    return client_record(call, run, reply.body, seconds)


# ---------------------------------------------------------------------- resume


def read_done(path: Path) -> set[str]:
    """The rids already in ``client.jsonl``. A torn last line (the run was killed while writing
    it) is cut off the file, a whole one gets its newline; a bad line elsewhere is a ``UsageError``."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    done, offset = set(), 0
    for number, line in enumerate(data.splitlines(keepends=True), 1):
        if line.strip():
            try:
                done.add(json.loads(line)["rid"])
            except (ValueError, KeyError, TypeError):
                if offset + len(line) < len(data) or line.endswith(b"\n"):
                    raise UsageError(f"{path}: line {number} is not a client record") from None
                with open(path, "r+b") as f:
                    f.truncate(offset)
                return done
        offset += len(line)
    if data and not data.endswith(b"\n"):  # a whole last record without its newline
        with open(path, "ab") as f:
            f.write(b"\n")
    return done


def pending(calls: Iterable[TraceCall], done: set[str], run: str) -> list[list[TraceCall]]:
    """Per conversation (in order of first appearance), the calls still to send, in turn order.
    A conversation whose first calls are done resumes at its next turn."""
    queues = []
    for calls_of_one in by_conversation(calls).values():
        left = [c for c in calls_of_one if c.rid(run) not in done]
        if left:
            queues.append(left)
    return queues


# ---------------------------------------------------------------------- progress


class Progress:
    """``replay: done/total calls (share), rate, ETA`` on ``stream`` at most every ``every`` seconds."""

    def __init__(self, total: int, done: int, stream: TextIO | None, every: float = PROGRESS_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.done, self.stream, self.every, self.clock = total, done, stream, every, clock
        self.started = clock()
        self.sent = 0  # calls answered in this session (the rate's numerator)
        self.last = self.started
        self.lock = threading.Lock()

    def tick(self, force: bool = False) -> None:
        with self.lock:
            if not force:
                self.done += 1
                self.sent += 1
            now = self.clock()
            if self.stream is None or (not force and now - self.last < self.every):
                return
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.sent / elapsed
        left = self.total - self.done
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        share = 100.0 * self.done / self.total if self.total else 100.0
        return f"replay: {self.done}/{self.total} calls ({share:.0f}%), {rate:.2f} calls/s, ETA {eta}"


# ---------------------------------------------------------------------- the run


def run_queues(send: Send, queues: Sequence[list[TraceCall]], run: str, log: TextIO, concurrency: int,
               progress: Progress) -> BaseException | None:
    """Up to ``concurrency`` conversations in flight, each one's calls strictly in order; every
    answered call is appended to ``log`` as it comes. The first failure stops new calls (calls in
    flight finish) and is returned."""
    lock = threading.Lock()
    next_queue = iter(queues)
    failure: list[BaseException] = []

    def worker() -> None:
        while not failure:
            with lock:
                calls = next(next_queue, None)
            if calls is None:
                return
            for call in calls:
                if failure:
                    return
                try:
                    record = send_call(send, call, run)
                except BaseException as exc:  # noqa: BLE001 - reported by the caller
                    with lock:
                        failure.append(exc)
                    return
                with lock:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                progress.tick()

    threads = [threading.Thread(target=worker, name=f"replay-{i}", daemon=True)
               for i in range(max(1, min(concurrency, len(queues))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failure[0] if failure else None


def replay(send: Send, trace: Sequence[TraceCall], out: Path, run: str = DEFAULT_RUN, concurrency: int = 1,
           progress: TextIO | None = None, every: float = PROGRESS_EVERY_S) -> dict:
    """Replay ``trace`` through ``send`` into ``out/client.jsonl``, skipping calls already there.
    Returns ``{"total", "skipped", "sent", "client"}``; raises ``Mismatch``/``ServerError``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / CLIENT_FILE
    done = read_done(path) & {call.rid(run) for call in trace}
    queues = pending(trace, done, run)
    meter = Progress(len(trace), len(done), progress, every)
    with open(path, "a") as log:
        failure = run_queues(send, queues, run, log, concurrency, meter)
    meter.tick(force=True)
    if failure is not None:
        raise failure
    return {"total": len(trace), "skipped": len(done), "sent": meter.sent, "client": str(path)}


def check_run_name(run: str) -> str:
    """A rid prefix: non-empty, no white space, no '.' (the accounting splits rids on the last '.')."""
    if not run or any(c.isspace() for c in run) or "." in run:
        raise UsageError(f"--run-id {run!r}: a non-empty name without white space or '.'")
    return run


def run_replay(server_url: str, trace_path: Path, out: Path, run: str = DEFAULT_RUN, concurrency: int = 1,
               progress: TextIO | None = sys.stderr, router: bool = False) -> dict:
    """The command: check the arguments, the address and the trace, then replay. ``router``: the
    address is ``sglang-router`` in front of several servers (``python -m eval.cluster``): forced
    ids go in the field the router keeps, every call carries the affinity header
    (``eval/cluster/router_client.py``), and a call whose worker died is retried
    (``eval/replay/retry.py``: which retries are safe, and why)."""
    check_run_name(run)
    if concurrency < 1:
        raise UsageError(f"--concurrency {concurrency}: must be >= 1")
    base = check_loopback(server_url)
    try:
        trace = read_trace(trace_path)
    except OSError as exc:
        raise UsageError(f"--trace {trace_path}: {exc.strerror or exc}") from None
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: not a directory")
    check_reachable(base)

    def send(path: str, payload: dict) -> client.Reply:
        body, headers = for_router(payload, affinity=True) if router else (payload, None)
        return client.request(base, path, body, timeout=CALL_TIMEOUT_S, headers=headers)

    if router:  # a worker behind the router may die: retry its calls on the one the router picks next
        return replay(RetryingSend(send), trace, out, run, concurrency, progress)
    return replay(send, trace, out, run, concurrency, progress)
