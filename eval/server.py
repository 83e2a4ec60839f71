"""Start, talk to and stop a local SGLang server (ours or stock) as a child process.

Used by the demo, the engine tests and the workload runs. It never imports SGLang (the server
runs in its own processes); HTTP goes through ``eval.http``.

Every server started here gets an admin key (SGLang's ``--admin-api-key``; a fresh random one
unless the caller gives one): the route table of the patched server (``serving/route_policy.py``)
refuses its admin routes (``/flush_cache``, ``/server_info``, ``/abort_request``, ...) to everyone
without one, and the tools here use them with ``admin_headers()``.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eval import http
from policy.events import read_jsonl

READY_LINE = "The server is fired up and ready to roll!"
# Lines that mean the server broke an invariant or crashed, whatever it answered.
FATAL_MARKERS = ("Traceback (most recent call last)", "memory leak detected", "cache-policy executor: dropped")
# uvicorn's line when the HTTP port is taken; the server process then hangs instead of exiting.
BIND_FAILED = "error while attempting to bind on address"
ADMIN_KEY_FLAG = "--admin-api-key"  # SGLang's flag; the route table's admin routes need its key
PORT_ATTEMPTS = 3  # start-ups tried on fresh ports when the chosen port was taken in the meantime
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000
# Start-up budget: 240 s covers the tiny model on 2 CPU cores; a 27B model loading its weights
# and capturing CUDA graphs can need more, so the environment may raise it without code changes.
STARTUP_TIMEOUT_ENV = "CACHE_POLICY_STARTUP_TIMEOUT"
DEFAULT_STARTUP_TIMEOUT = 240.0


def default_startup_timeout() -> float:
    """Seconds to wait for the ready line: ``$CACHE_POLICY_STARTUP_TIMEOUT`` when set, else 240."""
    raw = os.environ.get(STARTUP_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_STARTUP_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{STARTUP_TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0, e.g. 900")
    return seconds


def server_env(extra: dict[str, str]) -> dict[str, str]:
    """The server's environment: ours, then ``extra`` (the caller's per-server settings).

    ``HF_HUB_OFFLINE=1`` is only a default: the tests and the tiny model need no network, but a
    GPU box that downloads its model on first start sets ``HF_HUB_OFFLINE=0``."""
    return {"HF_HUB_OFFLINE": "1", **os.environ, "PYTHONUNBUFFERED": "1", **extra}


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag VALUE`` or ``flag=VALUE`` in ``argv`` (the last one), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def new_admin_key() -> str:
    """A fresh random admin key: hex, so it never starts with ``-`` (a url-safe token does one time
    in 64, and argparse then reads it as a flag: the server exits with "expected one argument")."""
    return secrets.token_hex(24)


def admin_key_arg(key: str) -> str:
    """``--admin-api-key=KEY``: the one form argparse accepts for every key, a leading ``-`` included."""
    return f"{ADMIN_KEY_FLAG}={key}"


class PortTaken(RuntimeError):
    """The server could not bind its HTTP port: something took it between choice and bind."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out itself (``bind(0)``, outgoing connections)."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(rng: random.Random | None = None, avoid: frozenset[int] = frozenset()) -> int:
    """A loopback port that is free now, chosen at random below the kernel's ephemeral range.

    Not ``bind(0)``: the kernel hands out ports from the ephemeral range, and so does every
    ``get_free_port()`` inside SGLang (its torch-distributed port) and every outgoing connection;
    a port released here and bound seconds later by uvicorn was taken by one of those in CI."""
    rng = rng or random.SystemRandom()
    low, _ = ephemeral_range()
    top = low - 1 if low - 1 > LOWEST_PORT else 65535
    bottom = LOWEST_PORT if top != 65535 else 61000
    for _ in range(200):
        port = rng.randint(bottom, top)
        if port in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port found in {bottom}-{top}")


@dataclass
class ServerProcess:
    """``python -m patches.launch_server`` (``stock=False``) or ``python -m sglang.launch_server``."""

    model_path: str
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    stock: bool = False
    port: int | None = None  # None: a free port is chosen (and re-chosen if it is taken before the bind)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout: float | None = None  # None: $CACHE_POLICY_STARTUP_TIMEOUT, else 240 s
    graceful_stop: bool = True
    cpus: list[int] | None = None  # CPU cores the server's processes may run on (default: all)
    # --admin-api-key: a fresh random key by default, None for none (admin routes then refused to
    # everyone); an --admin-api-key in extra_args wins.
    admin_key: str | None = field(default_factory=lambda: new_admin_key())
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        given = _flag_value(self.extra_args, ADMIN_KEY_FLAG)
        if given is not None:
            self.admin_key = given
        if self.startup_timeout is None:
            self.startup_timeout = default_startup_timeout()  # a bad value fails here, not after a wait
        self._port_chosen = self.port is None
        if self.port is None:
            self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def admin_headers(self) -> dict[str, str]:
        """``Authorization`` for this server's admin routes ({} when it has no admin key)."""
        return http.admin_headers(self.admin_key) if self.admin_key else {}

    def start(self) -> "ServerProcess":
        """Start and wait for the ready line; on a taken port (a port this object chose) try again
        on a fresh one, up to ``PORT_ATTEMPTS`` start-ups."""
        if self.process is not None:
            raise RuntimeError(f"server on port {self.port} was already started")
        tried: set[int] = set()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            tried.add(self.port)
            try:
                return self._start_once()
            except PortTaken:
                self.process = None  # stopped: a later start() may try again
                if not self._port_chosen or attempt == PORT_ATTEMPTS:
                    raise
                self.port = free_port(avoid=frozenset(tried))
        raise AssertionError("unreachable")

    def _start_once(self) -> "ServerProcess":
        module = "sglang.launch_server" if self.stock else "patches.launch_server"
        given = _flag_value(self.extra_args, ADMIN_KEY_FLAG) is not None
        key = [admin_key_arg(self.admin_key)] if self.admin_key and not given else []
        cmd = [sys.executable, "-m", module, "--model-path", self.model_path,
               "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args, *key]
        env = server_env(self.env)
        if self.stock:
            env.pop("CACHE_POLICY_SPEC", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        cpus = self.cpus
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            exited, text = self.process.poll() is not None, self.log_text()
            if BIND_FAILED in text:  # whether uvicorn's exit ended the launcher or it hangs
                self.stop()
                raise PortTaken(f"port {self.port} was taken before the server bound it:\n{self.log_tail()}")
            if exited:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log_tail()}")
            if READY_LINE in text:
                return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not ready after {self.startup_timeout:.0f}s (a longer start-up, e.g. a large "
                           f"model capturing CUDA graphs: set {STARTUP_TIMEOUT_ENV}=SECONDS):\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def fatal_lines(self) -> list[str]:
        return [line for line in self.log_text().splitlines() if any(m in line for m in FATAL_MARKERS)]

    def post(self, path: str, payload: dict, timeout: float = 300.0) -> dict:
        return http.post_json(self.url + path, payload, timeout)

    def flush_cache(self, attempts: int = 100) -> None:
        """``/flush_cache``; SGLang refuses (400) while the last request is still leaving the scheduler."""
        for _ in range(attempts):
            answer = http.post(self.url + "/flush_cache", b"", timeout=60, headers=self.admin_headers())
            if answer.status is None:
                raise http.NoResponse(f"POST /flush_cache: {answer.error}")
            if answer.ok and str(answer.body).startswith("Cache flushed"):
                return
            if not answer.ok and answer.status != 400:
                raise http.HttpError("POST", self.url + "/flush_cache", answer.status, answer.error or "")
            time.sleep(0.1)
        raise RuntimeError(f"/flush_cache refused {attempts} times")

    def generate(self, input_ids: list[int], max_new_tokens: int, *, rid: str | None = None, **extra) -> dict:
        """Greedy ``/generate`` on token ids, with logprobs of the generated tokens."""
        payload = {
            "input_ids": input_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            "return_logprob": True,
            **extra,
        }
        if rid is not None:
            payload["rid"] = rid
        return self.post("/generate", payload)

    def chat(self, messages: list[dict], max_tokens: int, **extra) -> dict:
        payload = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **extra}
        return self.post("/v1/chat/completions", payload)

    def stop(self) -> None:
        """SIGTERM to the launcher (SGLang shuts its children down), then clear the process group.

        With ``graceful_stop=False`` the group is killed at once: the files a server writes
        (events, trace) are appended line by line, so nothing is lost, and a test server saves
        the ~7 s SGLang's own shutdown takes on CPU."""
        if self.process is None:
            return
        if self.graceful_stop and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # anything the launcher left behind
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def __enter__(self) -> "ServerProcess":
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def request_events(path: Path) -> list[dict]:
    """The request events of one ``--cache-events`` file as dicts, in file order (start-up
    records and lost markers, which have no ``rid``, left out; a missing file has none). Read by
    ``policy.events.read_jsonl``: a line the server is still writing, or one a full disk cut, is
    skipped, not an error."""
    path = Path(path)
    if not path.exists():
        return []
    return [row for _, row in read_jsonl(str(path)).rows if isinstance(row, dict) and "rid" in row]


def wait_for_events_in(paths: dict[str, Path], rids, timeout: float = 15.0) -> dict[str, list[dict]]:
    """Each file's request events (by the caller's name for it), once every rid of ``rids`` is in
    one of them.

    The scheduler writes a request's event as the request leaves it, which may be just after
    the client has its answer; returns what is there when ``timeout`` runs out.
    """
    deadline = time.monotonic() + timeout
    while True:
        events = {name: request_events(path) for name, path in paths.items()}
        seen = {event["rid"] for rows in events.values() for event in rows}
        if set(rids) <= seen or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def wait_for_events(path: Path, rids, timeout: float = 15.0) -> dict[str, dict]:
    """``wait_for_events_in`` for one file, as a dict by rid (a repeated rid: its last event)."""
    return {event["rid"]: event for event in wait_for_events_in({"events": path}, rids, timeout)["events"]}


def output_record(response: dict) -> dict:
    """The parts of a ``/generate`` response that exactness compares: ids, logprobs, cached tokens."""
    meta = response["meta_info"]
    return {
        "output_ids": list(response["output_ids"]),
        "logprobs": [entry[0] for entry in meta["output_token_logprobs"]],
        "cached_tokens": meta["cached_tokens"],
        "prompt_tokens": meta["prompt_tokens"],
    }
