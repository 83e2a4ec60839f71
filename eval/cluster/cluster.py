"""Start N patched servers on loopback ports and ``sglang-router`` in front of them; stop them all.

Workers are ``eval.server.ServerProcess`` children (``python -m patches.launch_server``), started
side by side, each with its own ``--cache-events`` file (``OUT/worker-<i>/events.jsonl``) and log.
The router is ``python -m sglang_router.launch_router`` (the Rust load balancer of the pinned
``sglang-router`` wheel) on its own port, in its own process group, logging to
``OUT/router.log``. Ready means the router's ``/readiness`` answers 200, which it does only once
every worker is registered and healthy (its ``/health`` answers 200 as soon as the router itself
is up, before any worker is known, and requests sent then get 503).

CPU placement (no ``gpus_per_worker``): the machine's cores are split evenly and each worker is
pinned to its share (``os.sched_setaffinity``, inherited by its scheduler, tokenizer and
detokenizer) with ``OMP_NUM_THREADS`` = its core count. Unpinned, each worker's torch threads
spread over every core and each idle scheduler busy-polls one, so two workers on two cores slowed
each other by about ten times. GPU placement (``gpus_per_worker`` = K): worker i gets
``--base-gpu-id`` i·K (its TP ranks take the next K GPUs).

Workers run with ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``: the router health-checks every
worker's ``/health`` periodically, and SGLang otherwise answers that by generating one token for
the prompt ``[0]``, a request that lands in the cache and in the events file of a benchmark run.

``stop()`` kills the router's and every worker's process group; it is safe to call twice and runs
on any failure during start-up, so a failed start leaves no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from eval import http
from eval.server import ServerProcess, free_port

ROUTER_POLICIES = ("manual", "cache_aware", "round_robin", "random", "power_of_two")
DEFAULT_ROUTER_POLICY = "manual"  # pins a conversation's routing key to one worker (eval/cluster/affinity.py)
WORKER_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
# manual policy: a new routing key goes to the worker holding the fewest keys. The router's default
# (random) put all four conversations of a test run on one worker; min_group spread concurrent
# conversations evenly in our probes, but the router does not promise an even split.
MANUAL_ARGS = ["--assignment-mode", "min_group"]
READY_TIMEOUT_S = 120.0
# The router's own wait for a worker's answer; above every client's (eval.replay: 3,600 s), so a
# slow call is never given up by the router while the worker still runs it (its default, 1,800 s,
# would answer an error that a client could take for a dead worker and send the call again).
ROUTER_REQUEST_TIMEOUT_S = 7200


def core_shares(cores, workers: int) -> list[list[int] | None]:
    """Each worker's cores: ``cores`` split evenly in order (spares left out); no pinning (None for
    every worker) when there are fewer cores than workers."""
    cores = sorted(cores)
    if workers > len(cores):
        return [None] * workers
    per = len(cores) // workers
    return [cores[i * per:(i + 1) * per] for i in range(workers)]


def router_command(port: int, worker_urls: list[str], policy: str, metrics_port: int,
                   extra: list[str] | None = None) -> list[str]:
    """The router's argv: loopback only, its Prometheus port chosen free (the default, 29000, would
    collide between two clusters), health checks every 10 s, a request timeout above the clients'."""
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"router policy {policy!r}: choose from {', '.join(ROUTER_POLICIES)}")
    if not worker_urls:
        raise ValueError("a router needs at least one worker")
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port), "--health-check-interval-secs", "10",
            "--request-timeout-secs", str(ROUTER_REQUEST_TIMEOUT_S),
            "--log-level", "warn", *(MANUAL_ARGS if policy == "manual" else []), *(extra or [])]


@dataclass
class Cluster:
    """``workers`` patched servers of ``model_path`` with ``server_args`` behind one router."""

    model_path: str
    out: Path
    workers: int = 2
    server_args: list[str] = field(default_factory=list)
    router_policy: str = DEFAULT_ROUTER_POLICY
    router_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    gpus_per_worker: int = 0  # 0: CPU placement (cores split between workers); K: --base-gpu-id i*K
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)  # the router's Prometheus endpoint
    servers: list[ServerProcess] = field(default_factory=list)
    router: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        return self.out / f"worker-{index}"

    def events_paths(self) -> dict[str, Path]:
        """Worker name (``worker-<i>``) -> its events file."""
        return {self.worker_dir(i).name: self.worker_dir(i) / "events.jsonl" for i in range(self.workers)}

    def start(self) -> "Cluster":
        if self.workers < 1:
            raise ValueError(f"workers {self.workers}: must be >= 1")
        try:
            self._start_workers()
            self._start_router()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_workers(self) -> None:
        shares = core_shares(os.sched_getaffinity(0), self.workers) if not self.gpus_per_worker else [None] * self.workers
        for i, cpus in enumerate(shares):
            folder = self.worker_dir(i)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "events.jsonl").unlink(missing_ok=True)
            gpu = ["--base-gpu-id", str(i * self.gpus_per_worker)] if self.gpus_per_worker else []
            threads = {"OMP_NUM_THREADS": str(len(cpus))} if cpus else {}
            self.servers.append(ServerProcess(
                model_path=self.model_path, log_path=folder / "server.log",
                extra_args=[*self.server_args, *gpu, "--cache-events", str(folder / "events.jsonl")],
                env={**WORKER_ENV, **threads, **self.env}, graceful_stop=False, cpus=cpus))
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            for future in [pool.submit(server.start) for server in self.servers]:
                future.result()

    def _start_router(self) -> None:
        cmd = router_command(self.port, [s.url for s in self.servers], self.router_policy, self.metrics_port,
                             self.router_args)
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "router.log", "wb") as log:
            self.router = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.router.poll() is not None:
                raise RuntimeError(f"router exited with {self.router.returncode}:\n{self.router_log_tail()}")
            if http.get(self.url + "/readiness", timeout=5).ok:
                return
            time.sleep(0.5)
        raise TimeoutError(f"router not ready after {READY_TIMEOUT_S:.0f}s:\n{self.router_log_tail()}")

    def router_metrics(self) -> str | None:
        """The router's Prometheus text (``eval.cluster.affinity.manual_branches`` reads its manual
        policy's choices from it), or None when it does not answer."""
        answer = http.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10)
        return answer.body if answer.ok and isinstance(answer.body, str) else None

    def router_log_tail(self, lines: int = 30) -> str:
        path = self.out / "router.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def fatal_lines(self) -> dict[str, list[str]]:
        """Per worker, the log lines that mean a broken invariant or a crash (``eval.server``)."""
        return {self.worker_dir(i).name: s.fatal_lines() for i, s in enumerate(self.servers) if s.fatal_lines()}

    def stop(self) -> None:
        if self.router is not None:
            try:
                os.killpg(self.router.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.router.wait(timeout=30)
            self.router = None
        for server in self.servers:
            server.stop()

    def __enter__(self) -> "Cluster":
        return self if self.router is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
