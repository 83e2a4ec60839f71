"""``eval.server.ServerProcess`` start-up without SGLang: port choice, and a taken port seen in the
log (uvicorn logs the bind error and then hangs) ending in a fresh port instead of a 240 s wait.

CI once failed here: a port chosen with ``bind(0)`` was handed to another process (SGLang's own
``get_free_port()``) before uvicorn bound it."""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import time

import pytest

from eval import server
from eval.server import BIND_FAILED, PortTaken, ServerProcess, free_port


def test_free_port_is_bindable_and_below_the_ephemeral_range():
    low, _ = server.ephemeral_range()
    for seed in range(50):
        port = free_port(random.Random(seed))
        assert server.LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


class Draws:
    """A random source whose ``randint`` answers the given ports in turn."""

    def __init__(self, *ports):
        self.ports = list(ports)

    def randint(self, low, high):
        port = self.ports.pop(0)
        assert low <= port <= high
        return port


def test_free_port_skips_taken_and_avoided_ports(monkeypatch):
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        spare.bind(("127.0.0.1", 0))
        busy, avoided = taken.getsockname()[1], spare.getsockname()[1]
        spare.close()  # free again, but the caller has tried it before
        free = free_port()  # a third port, free now
        ports = sorted((busy, avoided, free))
        monkeypatch.setattr(server, "ephemeral_range", lambda: (ports[-1] + 1, 65535))
        monkeypatch.setattr(server, "LOWEST_PORT", ports[0])
        assert free_port(Draws(busy, avoided, free), avoid=frozenset({avoided})) == free


def test_free_port_gives_up_when_nothing_is_free(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(server, "ephemeral_range", lambda: (busy + 1, 65535))
        monkeypatch.setattr(server, "LOWEST_PORT", busy - 1)
        with pytest.raises(RuntimeError, match=f"no free loopback port found in {busy - 1}-{busy}"):
            free_port(Draws(*[busy] * 200))


def test_ephemeral_range_falls_back_when_unreadable(monkeypatch, tmp_path):
    monkeypatch.setattr(server, "EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert server.ephemeral_range() == (32768, 60999)
    garbled = tmp_path / "range"
    garbled.write_text("not numbers\n")
    monkeypatch.setattr(server, "EPHEMERAL_RANGE_FILE", garbled)
    assert server.ephemeral_range() == (32768, 60999)


def hanging_process(tmp_path, log_text: str) -> ServerProcess:
    """A ServerProcess whose 'server' sleeps (as uvicorn's process does after the bind error)."""
    log = tmp_path / "server.log"
    log.write_text(log_text)
    proc = ServerProcess(model_path="m", log_path=log, startup_timeout=20, graceful_stop=False)
    proc.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    return proc


def test_bind_error_in_the_log_ends_the_wait_and_the_process(tmp_path):
    proc = hanging_process(tmp_path, f"[t] ERROR:    [Errno 98] {BIND_FAILED} ('127.0.0.1', 1): address already in use\n")
    started = time.monotonic()
    with pytest.raises(PortTaken, match=f"port {proc.port} was taken"):
        proc._wait_ready()
    assert time.monotonic() - started < 10
    assert proc.process.poll() is not None  # killed, not left hanging


def test_bind_error_then_exit_is_a_taken_port_too(tmp_path):
    """uvicorn may also exit after the bind error (and the launcher with it): still a retry."""
    proc = hanging_process(tmp_path, f"[t] ERROR:    [Errno 98] {BIND_FAILED} ('127.0.0.1', 1): address already in use\n")
    proc.process.kill()
    proc.process.wait()
    with pytest.raises(PortTaken):
        proc._wait_ready()


def test_an_exit_without_the_bind_error_is_not_retried(tmp_path):
    proc = hanging_process(tmp_path, "[t] Traceback (most recent call last):\n")
    proc.process.kill()
    proc.process.wait()
    with pytest.raises(RuntimeError, match="server exited with"):
        proc._wait_ready()


def test_ready_line_returns(tmp_path):
    proc = hanging_process(tmp_path, f"[t] {server.READY_LINE}\n")
    try:
        proc._wait_ready()
    finally:
        proc.stop()


class Attempts:
    """Stands in for one start-up: raises PortTaken ``taken`` times, then succeeds."""

    def __init__(self, proc: ServerProcess, taken: int):
        self.proc, self.taken, self.ports = proc, taken, []

    def __call__(self):
        self.ports.append(self.proc.port)
        self.proc.process = object()  # what a real start leaves behind
        if len(self.ports) <= self.taken:
            raise PortTaken(f"port {self.proc.port}")
        return self.proc


@pytest.mark.parametrize("taken, starts", [(0, 1), (1, 2), (server.PORT_ATTEMPTS - 1, server.PORT_ATTEMPTS)])
def test_a_chosen_port_is_rechosen_when_taken(tmp_path, monkeypatch, taken, starts):
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log")
    attempts = Attempts(proc, taken)
    monkeypatch.setattr(proc, "_start_once", attempts)
    assert proc.start() is proc
    assert len(attempts.ports) == starts
    assert len(set(attempts.ports)) == starts  # a fresh port each time
    assert proc.port == attempts.ports[-1]


def test_gives_up_after_the_last_attempt(tmp_path, monkeypatch):
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log")
    attempts = Attempts(proc, taken=server.PORT_ATTEMPTS)
    monkeypatch.setattr(proc, "_start_once", attempts)
    with pytest.raises(PortTaken):
        proc.start()
    assert len(attempts.ports) == server.PORT_ATTEMPTS


def test_a_port_the_caller_gave_is_not_changed(tmp_path, monkeypatch):
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log", port=12345)
    attempts = Attempts(proc, taken=1)
    monkeypatch.setattr(proc, "_start_once", attempts)
    with pytest.raises(PortTaken):
        proc.start()
    assert attempts.ports == [12345] and proc.process is None  # stopped, may be started again


# ---------------------------------------------------------------- reading the events files


def write_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")


def test_request_events_leave_out_start_up_records_and_blank_lines(tmp_path):
    events = tmp_path / "events.jsonl"
    write_lines(events, [{"kind": "startup", "policy": "scr"}, {"rid": "a", "moved": 1}, {"rid": "b"}])
    assert server.request_events(events) == [{"rid": "a", "moved": 1}, {"rid": "b"}]
    assert server.request_events(tmp_path / "missing.jsonl") == []


def test_waiting_on_several_files_returns_once_every_rid_is_somewhere(tmp_path):
    one, two = tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"
    write_lines(one, [{"rid": "a"}])
    write_lines(two, [{"rid": "b"}, {"rid": "c"}])
    started = time.monotonic()
    got = server.wait_for_events_in({"w0": one, "w1": two}, ["a", "c"], timeout=10)
    assert got == {"w0": [{"rid": "a"}], "w1": [{"rid": "b"}, {"rid": "c"}]}
    assert time.monotonic() - started < 5


def test_waiting_gives_what_is_there_when_the_time_runs_out(tmp_path):
    one = tmp_path / "w0.jsonl"
    write_lines(one, [{"rid": "a"}])
    started = time.monotonic()
    assert server.wait_for_events_in({"w0": one}, ["a", "late"], timeout=0.5) == {"w0": [{"rid": "a"}]}
    assert time.monotonic() - started >= 0.5


def test_one_file_by_rid_keeps_a_repeated_rids_last_event(tmp_path):
    events = tmp_path / "events.jsonl"
    write_lines(events, [{"rid": "a", "n": 1}, {"rid": "b"}, {"rid": "a", "n": 2}])
    assert server.wait_for_events(events, ["a", "b"]) == {"a": {"rid": "a", "n": 2}, "b": {"rid": "b"}}


# ---------------------------------------------------------------- environment and start-up budget


def test_the_server_is_offline_by_default(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert server.server_env({})["HF_HUB_OFFLINE"] == "1"


def test_the_callers_environment_can_let_the_server_download(monkeypatch):
    """A GPU box fetching Qwen3.6-27B on its first start sets HF_HUB_OFFLINE=0; it used to be forced to 1."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    env = server.server_env({})
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert server.server_env({"HF_HUB_OFFLINE": "1"})["HF_HUB_OFFLINE"] == "1"  # per-server env wins


def test_start_passes_the_server_env_to_the_child(tmp_path, monkeypatch):
    """``_start_once`` really uses ``server_env``: the Popen call sees the caller's HF_HUB_OFFLINE."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    seen, real_popen = {}, subprocess.Popen

    def fake_popen(cmd, **kwargs):
        seen.update(kwargs["env"])
        return real_popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(server.subprocess, "Popen", fake_popen)
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log", env={"X_TEST": "y"})
    monkeypatch.setattr(proc, "_wait_ready", lambda: None)
    proc._start_once()
    proc.process.wait()
    assert seen["HF_HUB_OFFLINE"] == "0" and seen["X_TEST"] == "y"


def test_startup_timeout_defaults_to_240_s(tmp_path, monkeypatch):
    monkeypatch.delenv(server.STARTUP_TIMEOUT_ENV, raising=False)
    assert ServerProcess(model_path="m", log_path=tmp_path / "log").startup_timeout == 240.0


def test_startup_timeout_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(server.STARTUP_TIMEOUT_ENV, " 900 ")
    assert ServerProcess(model_path="m", log_path=tmp_path / "log").startup_timeout == 900.0
    # an explicit argument is the caller's decision and wins over the environment
    assert ServerProcess(model_path="m", log_path=tmp_path / "log", startup_timeout=20).startup_timeout == 20


@pytest.mark.parametrize("value", ["soon", "0", "-5", "inf", "nan", "12s"])
def test_a_bad_startup_timeout_is_refused_naming_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv(server.STARTUP_TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=rf"CACHE_POLICY_STARTUP_TIMEOUT='{value}': expected a number of seconds > 0"):
        ServerProcess(model_path="m", log_path=tmp_path / "log")


def test_the_timeout_message_names_the_variable(tmp_path):
    proc = hanging_process(tmp_path, "[t] capturing cuda graphs\n")
    proc.startup_timeout = 0.6
    with pytest.raises(TimeoutError, match=r"not ready after 1s .*set CACHE_POLICY_STARTUP_TIMEOUT=SECONDS"):
        proc._wait_ready()
    assert proc.process.poll() is not None  # stopped


def _command(proc, monkeypatch) -> list[str]:
    seen, real_popen = {}, subprocess.Popen

    def fake_popen(cmd, **kwargs):
        seen["cmd"] = cmd
        return real_popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(server.subprocess, "Popen", fake_popen)
    monkeypatch.setattr(proc, "_wait_ready", lambda: None)
    proc._start_once()
    proc.process.wait()
    return seen["cmd"]


def test_every_server_gets_a_fresh_admin_key(tmp_path, monkeypatch):
    """The route table refuses admin routes (/flush_cache, /server_info) without the server's key."""
    a, b = (ServerProcess(model_path="m", log_path=tmp_path / "log") for _ in range(2))
    assert a.admin_key and b.admin_key and a.admin_key != b.admin_key and len(a.admin_key) >= 32
    cmd = _command(a, monkeypatch)
    assert [arg for arg in cmd if arg.startswith("--admin-api-key")] == [f"--admin-api-key={a.admin_key}"]
    assert a.admin_headers() == {"Authorization": f"Bearer {a.admin_key}"}


def test_generated_keys_never_look_like_a_flag():
    """CI once failed here: a url-safe token began with ``-`` and SGLang's argparse read it as a flag
    (``--admin-api-key: expected one argument``, the server exited 2). 2,000 draws see a leading
    ``-`` with probability 1 - (63/64)**2000 for the old generator."""
    assert not any(server.new_admin_key().startswith("-") for _ in range(2000))


@pytest.mark.parametrize("key", ["-starts-with-a-dash", "--looks-like-a-flag", "plain"])
def test_the_key_argument_survives_argparse(key):
    """The form put on the command line parses back to the key, whatever its first character, with
    the flag declared as SGLang declares it (``type=str``, one value)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(server.ADMIN_KEY_FLAG, type=str, default=None)
    parser.add_argument("--model-path", type=str)
    parsed = parser.parse_args(["--model-path", "m", server.admin_key_arg(key)])
    assert parsed.admin_api_key == key


@pytest.mark.parametrize("args", [["--admin-api-key", "mine"], ["--admin-api-key=mine"]])
def test_a_key_on_the_command_line_is_the_servers_key(tmp_path, monkeypatch, args):
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log", extra_args=["--x", "1", *args])
    assert proc.admin_key == "mine" and proc.admin_headers() == {"Authorization": "Bearer mine"}
    cmd = _command(proc, monkeypatch)
    assert sum(a.startswith("--admin-api-key") for a in cmd) == 1


def test_no_admin_key(tmp_path, monkeypatch):
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log", admin_key=None)
    assert "--admin-api-key" not in _command(proc, monkeypatch) and proc.admin_headers() == {}


def test_flush_cache_sends_the_admin_key(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(server.http, "post", lambda url, payload, timeout, headers=None: sent.append(headers)
                        or server.http.Response(200, "Cache flushed."))
    proc = ServerProcess(model_path="m", log_path=tmp_path / "log", admin_key="k")
    proc.flush_cache()
    assert sent == [{"Authorization": "Bearer k"}]
