"""Drive the soak against a running server, then check it and write the report (``run_soak``).

Phases:

1. load: ``concurrency`` workers, each running one conversation at a time (``conversation.py``)
   for a tenant (its salt = ``extra_key`` on ``/generate``, ``cache_salt`` on ``/v1/completions``),
   interleaving malformed requests, fresh-salt replays of its last answered prompt and aborted
   turns (stream then disconnect, a short client timeout, ``POST /abort_request {"rid": ...}``),
   until ``requests`` are sent (or ``minutes`` have passed, when given). A load bounded by
   ``requests`` alone sends the same quota of each kind whatever the machine's speed (the kinds
   follow the step count, ``Soak.step_kind``); the tests use that;
2. sequentially, with no other traffic: a few more fresh-salt replays; under ``exact`` the sample
   of K earlier prompts re-sent under their tenant's salt (warm) and under a fresh salt (cold);
3. ``/flush_cache`` until accepted, ``idle_s`` seconds idle (SGLang's strict idle pool check runs),
   a good request (alive), then the checks over the records, the events and the server log.
"""

from __future__ import annotations

import json
import random
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from eval import cli_types, http
from eval.soak import bounds, checks, client, malformed, safety
from eval.soak.conversation import Conversation, ConversationConfig, random_ids

ABORT_MODES = ("disconnect", "abort_request", "timeout")
STDERR = object()  # default progress stream: sys.stderr at call time


class UsageError(cli_types.UsageError, ValueError):
    """Bad arguments or files before anything is sent: exit status 2."""


@dataclass(frozen=True)
class SoakConfig:
    minutes: float | None = None  # load phase's time bound; default 5 without ``requests``, none with it
    requests: int | None = None  # requests of the load phase (turns, replays, malformed)
    seed: int = 0
    concurrency: int = 4
    tenants: int = 4
    events: Path | None = None
    log: Path | None = None
    policy: str | None = None  # radix / exact / scr; None = from the run's events
    exact_sample: int = 4
    malformed: str = "all"  # none / safe / all
    max_new_tokens: int = 8
    abort_tokens: int = 64  # an aborted turn asks for more, so it is still running when aborted
    abort_share: float = 0.10  # of conversation turns
    malformed_share: float = 0.07  # of worker steps
    probe_share: float = 0.04  # of worker steps: replay the worker's last prompt under a fresh salt
    openai_share: float = 0.2  # of conversations served through /v1/completions with cache_salt
    final_probes: int = 3
    fuzz_cases: int | None = None  # schema-driven malformed set after the load: None all, 0 none (safety.py)
    regex_bomb_tokens: int = 256  # the regex-bomb probe's decode length; 0: no probe
    bounds: bool = True  # the request-limit probes (bounds.py)
    # Judge latency: trivial requests beside the bomb or the over-limit requests may take at most this
    # many times their usual latency. None: measured and reported, not judged (the tests: no check may
    # depend on the machine's speed).
    max_latency_ratio: float | None = 3.0
    namespaces: bool = True  # the namespace-collision probes
    routes: bool = True  # the route table's fuzz (route_fuzz.py)
    # the server's --admin-api-key (/flush_cache, /abort_request, the route fuzz's admin probe);
    # None: $CACHE_POLICY_ADMIN_KEY. Never written to the report.
    admin_key: str | None = None
    idle_s: float = 5.0
    progress_s: float = 10.0
    request_timeout: float = 300.0
    conversation: ConversationConfig = field(default_factory=ConversationConfig)

    def resolved(self) -> "SoakConfig":
        """Checked values; raises UsageError."""
        minutes = self.minutes if self.minutes is not None else (5.0 if self.requests is None else None)
        problems = []
        if minutes is not None and minutes <= 0:
            problems.append(f"--minutes {minutes}: must be > 0")
        if self.requests is not None and self.requests < 1:
            problems.append(f"--requests {self.requests}: must be >= 1")
        if self.concurrency < 1:
            problems.append(f"--concurrency {self.concurrency}: must be >= 1")
        if self.tenants < 1:
            problems.append(f"tenants {self.tenants}: must be >= 1")
        if self.exact_sample < 0:
            problems.append(f"--exact-sample {self.exact_sample}: must be >= 0")
        if self.malformed not in malformed.SETS:
            problems.append(f"--malformed {self.malformed!r}: one of {', '.join(malformed.SETS)}")
        if self.fuzz_cases is not None and self.fuzz_cases < 0:
            problems.append(f"--fuzz-cases {self.fuzz_cases}: must be >= 0")
        if self.regex_bomb_tokens < 0:
            problems.append(f"--regex-bomb-tokens {self.regex_bomb_tokens}: must be >= 0")
        if self.max_latency_ratio is not None and not self.max_latency_ratio >= 1:
            problems.append(f"--max-latency-ratio {self.max_latency_ratio}: must be >= 1")
        if self.idle_s < 0:
            problems.append(f"--idle-seconds {self.idle_s}: must be >= 0")
        if self.max_new_tokens < 1 or self.abort_tokens < 1:
            problems.append("max_new_tokens and abort_tokens must be >= 1")
        for name in ("abort_share", "malformed_share", "probe_share", "openai_share"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} {getattr(self, name)}: must be in [0, 1]")
        if self.malformed_share + self.probe_share > 1:
            problems.append("malformed_share + probe_share must be <= 1")
        if self.log is not None and not Path(self.log).is_file():
            problems.append(f"--log {self.log}: no such file (the server's log, written as it runs)")
        if self.events is not None and not Path(self.events).parent.is_dir():
            problems.append(f"--events {self.events}: its directory does not exist")
        if problems:
            raise UsageError("; ".join(problems))
        return replace(self, minutes=minutes)


class Budget:
    """Requests left and the load deadline (None: no time bound), shared by the workers."""

    def __init__(self, requests: int | None, seconds: float | None):
        self.left = requests
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            late = self.deadline is not None and time.monotonic() >= self.deadline
            if late or (self.left is not None and self.left <= 0):
                return False
            if self.left is not None:
                self.left -= 1
            return True


def generate_payload(rid: str, ids: list[int], salt: str, max_new_tokens: int, logprobs: bool = False) -> dict:
    payload = {"rid": rid, "input_ids": list(ids), "extra_key": salt,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
    if logprobs:
        payload["return_logprob"] = True
    return payload


def completions_payload(rid: str, ids: list[int], salt: str, max_tokens: int, model: str) -> dict:
    return {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "rid": rid, "cache_salt": salt}


def _reply_record(reply: client.Reply) -> tuple[dict, dict | None]:
    """The record fields every reply has (status, seconds, the client's error), and the body of a
    200 answer (``{}`` when it is not a JSON object; None for any other status)."""
    out: dict = {"status": reply.status, "seconds": round(reply.seconds, 4)}
    if reply.error:
        out["error"] = reply.error[:300]
    if reply.status != 200:
        return out, None
    return out, reply.body if isinstance(reply.body, dict) else {}


def read_generate(reply: client.Reply) -> dict:
    """The record fields of a ``/generate`` reply."""
    out, body = _reply_record(reply)
    if body is not None:
        meta = body.get("meta_info") or {}
        finish = meta.get("finish_reason")
        out["finish_reason"] = finish.get("type") if isinstance(finish, dict) else finish
        if isinstance(finish, dict) and finish.get("message"):
            out["finish_message"] = str(finish["message"])[:200]
        out["output_ids"] = list(body.get("output_ids") or [])
        out["logprobs"] = [entry[0] for entry in meta.get("output_token_logprobs") or []]
        out["cached_tokens"] = meta.get("cached_tokens")
        out["prompt_tokens"] = meta.get("prompt_tokens")
        if "output_ids" not in body or "cached_tokens" not in meta:
            out["error"] = "answer without output_ids or meta_info.cached_tokens"
    return out


def read_completion(reply: client.Reply) -> dict:
    """The record fields of a ``/v1/completions`` reply."""
    out, body = _reply_record(reply)
    if body is not None:
        choices = body.get("choices") or [{}]
        out["finish_reason"] = choices[0].get("finish_reason")
        usage = body.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        out["cached_tokens"] = details.get("cached_tokens")  # only with --enable-cache-report
        out["prompt_tokens"] = usage.get("prompt_tokens")
        out["output_ids"] = []
    return out


class Soak:
    def __init__(self, base: str, out_dir: Path, cfg: SoakConfig, progress: TextIO | None):
        self.base, self.out_dir, self.cfg, self.progress = base, Path(out_dir), cfg, progress
        self.run = f"soak{cfg.seed}x{secrets.token_hex(3)}"
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.salts: dict[str, str] = {}  # rid -> salt sent (well-formed requests)
        self.counters = Counter()
        self.quota = Counter()  # steps, turns, conversations and how many of them were each kind
        self.next_conversation = 0
        self.model = "default"
        self.context_len: int | None = None
        self.mal_ctx = malformed.MalformedContext()
        self.mal_kinds: list[str] = []
        self.recent: dict[int, dict] = {}  # tenant -> last answered /generate turn (rid, prompt, salt)
        self.load_started = self.load_ended = 0.0
        self.log_offset = 0
        self.prompts: dict[str, list[int]] = {}  # rid -> prompt of each answered /generate turn
        self.safety: dict = {}  # the request-safety phases' reports (safety.py)
        self.namespace_records: list[dict] = []

    # ------------------------------------------------------------------ bookkeeping

    def tenant_salt(self, tenant: int) -> str:
        return f"soak-{self.run}-t{tenant}"

    def take(self, name: str) -> int:
        with self.lock:
            self.counters[name] += 1
            return self.counters[name]

    def add(self, record: dict) -> dict:
        with self.lock:
            self.records.append(record)
            if record.get("salt") is not None and not record.get("malformed"):
                self.salts[record["rid"]] = record["salt"]
        return record

    def of(self, kind: str) -> list[dict]:
        with self.lock:
            return [r for r in self.records if r["kind"] == kind]

    # ------------------------------------------------------------------ requests

    def send_generate(self, rid: str, ids: list[int], salt: str, kind: str, max_new_tokens: int | None = None,
                      logprobs: bool = False, **extra) -> dict:
        payload = generate_payload(rid, ids, salt, max_new_tokens or self.cfg.max_new_tokens, logprobs)
        reply = client.request(self.base, "/generate", payload, self.cfg.request_timeout)
        record = self.add({"rid": rid, "kind": kind, "endpoint": "generate", "salt": salt,
                           "prompt_len": len(ids), **extra, **read_generate(reply)})
        if kind == "turn" and record["status"] == 200:
            with self.lock:
                self.prompts[rid] = list(ids)
        return record

    def send_completion(self, rid: str, ids: list[int], salt: str, kind: str, **extra) -> dict:
        payload = completions_payload(rid, ids, salt, self.cfg.max_new_tokens, self.model)
        reply = client.request(self.base, "/v1/completions", payload, self.cfg.request_timeout)
        return self.add({"rid": rid, "kind": kind, "endpoint": "completions", "salt": salt,
                         "prompt_len": len(ids), **extra, **read_completion(reply)})

    def send_aborted(self, rid: str, ids: list[int], salt: str, mode: str, rng: random.Random, **extra) -> dict:
        payload = generate_payload(rid, ids, salt, self.cfg.abort_tokens)
        base = {"rid": rid, "kind": "turn", "endpoint": "generate", "salt": salt, "prompt_len": len(ids),
                "abort": mode, **extra}
        if mode == "disconnect":
            reply = client.stream_then_disconnect(self.base, "/generate", payload)
            return self.add({**base, "status": reply.status, "error": reply.error,
                             "seconds": round(reply.seconds, 4)})
        if mode == "timeout":
            reply = client.request(self.base, "/generate", payload, timeout=rng.uniform(0.05, 0.4))
            return self.add({**base, **read_generate(reply)})
        holder: dict = {}
        thread = threading.Thread(target=lambda: holder.update(
            reply=client.request(self.base, "/generate", payload, self.cfg.request_timeout)), daemon=True)
        thread.start()
        time.sleep(rng.uniform(0.02, 0.4))
        aborted = client.request(self.base, "/abort_request", {"rid": rid}, timeout=30,
                                 headers=http.admin_headers(self.cfg.admin_key))
        thread.join(self.cfg.request_timeout + 5)
        reply = holder.get("reply") or client.Reply(None, None, "no reply")
        return self.add({**base, **read_generate(reply), "abort_status": aborted.status})

    def send_malformed(self, rng: random.Random) -> dict:
        number = self.take("malformed")
        kind = self.mal_kinds[(number - 1) % len(self.mal_kinds)]
        rid = f"{self.run}.bad{number:04d}.1"
        path, body = malformed.build(kind, rng, rid, random_ids(rng, 32), self.mal_ctx)
        reply = client.request(self.base, path, body, self.cfg.request_timeout)
        return self.add({"rid": rid, "kind": "malformed", "malformed": kind, "endpoint": path,
                         "status": reply.status, "error": (reply.error or "")[:300] or None,
                         "seconds": round(reply.seconds, 4)})

    def send_probe(self, source: dict) -> dict:
        number = self.take("probe")
        return self.send_generate(f"{self.run}.iso{number:04d}.1", source["prompt"],
                                  f"soak-{self.run}-iso{number}", "probe", source_rid=source["rid"],
                                  source_salt=source["salt"])

    # ------------------------------------------------------------------ load

    def due(self, name: str, share: float, among: str) -> bool:
        """Quota: True (and counted) when fewer than ``share`` of the ``among`` so far were ``name``,
        so the shares hold from the first requests on (the first step is one of each kind)."""
        with self.lock:
            self.quota[among] += 1
            if self.quota[name] < share * self.quota[among]:
                self.quota[name] += 1
                return True
            return False

    def new_conversation(self) -> tuple[Conversation, bool]:
        with self.lock:
            index = self.next_conversation
            self.next_conversation += 1
        conv = Conversation.start(self.cfg.seed, index, index % self.cfg.tenants, self.cfg.conversation)
        return conv, self.due("completions", self.cfg.openai_share, "conversations")

    def step_kind(self, has_source: bool) -> str:
        """What a worker's next request is: ``malformed``, ``probe`` or ``turn``, by quota."""
        with self.lock:
            self.quota["steps"] += 1
            steps = self.quota["steps"]
            if self.mal_kinds and self.quota["malformed"] < self.cfg.malformed_share * steps:
                self.quota["malformed"] += 1
                return "malformed"
            if has_source and self.quota["probe"] < self.cfg.probe_share * steps:
                self.quota["probe"] += 1
                return "probe"
        return "turn"

    def worker(self, number: int, budget: Budget) -> None:
        cfg = self.cfg
        rng = random.Random(f"soak:{cfg.seed}:worker:{number}")
        conv, openai, answer, last = None, False, None, None
        while True:
            if conv is None or conv.done:
                conv, openai = self.new_conversation()
                answer = None
            if not budget.take():
                return
            kind = self.step_kind(last is not None)
            if kind == "malformed":
                self.send_malformed(rng)
                continue
            if kind == "probe":
                self.send_probe(last)
                continue
            edit, prompt = conv.next_prompt(answer)
            rid = f"{self.run}.c{conv.index:04d}.{conv.turn}"
            salt = self.tenant_salt(conv.tenant)
            extra = {"tenant": conv.tenant, "edit": edit, "conversation": conv.index}
            if self.due("abort", cfg.abort_share, "turns"):
                mode = ABORT_MODES[(self.take("abort") - 1) % len(ABORT_MODES)]
                self.send_aborted(rid, prompt, salt, mode, rng, **extra)
                answer = []
                continue
            if openai:
                record = self.send_completion(rid, prompt, salt, "turn", **extra)
            else:
                record = self.send_generate(rid, prompt, salt, "turn", **extra)
            answer = record.get("output_ids") or []
            if record["status"] == 200 and record["endpoint"] == "generate":
                last = {"rid": rid, "prompt": prompt, "salt": salt}
                with self.lock:
                    self.recent[conv.tenant] = {**last, "conversation": conv.index}

    def progress_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.cfg.progress_s):
            self.say(self.progress_line())

    def progress_line(self) -> str:
        with self.lock:
            records = list(self.records)
        statuses = Counter(_status_class(r.get("status")) for r in records)
        return (f"soak {self.run}: {time.monotonic() - self.load_started:.0f} s, sent {len(records)} "
                f"(200: {statuses['2xx']}, 4xx: {statuses['4xx']}, 5xx: {statuses['5xx']}, "
                f"no status: {statuses['none']}), aborted {sum(1 for r in records if r.get('abort'))}, "
                f"malformed {sum(1 for r in records if r['kind'] == 'malformed')}")

    def say(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=self.progress, flush=True)

    def load(self) -> None:
        budget = Budget(self.cfg.requests, None if self.cfg.minutes is None else self.cfg.minutes * 60)
        stop = threading.Event()
        ticker = threading.Thread(target=self.progress_loop, args=(stop,), daemon=True)
        self.load_started = time.monotonic()
        ticker.start()
        workers = [threading.Thread(target=self.worker, args=(n, budget), daemon=True)
                   for n in range(self.cfg.concurrency)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        self.load_ended = time.monotonic()
        self.say(self.progress_line() + " (load done)")

    # ------------------------------------------------------------------ after the load

    def final_probes(self) -> None:
        with self.lock:
            sources = sorted(self.recent.values(), key=lambda s: s["rid"])
        for source in sources[: self.cfg.final_probes]:
            self.send_probe(source)

    def exact_sample(self) -> list[dict]:
        """K earlier prompts (distinct conversations, latest first): warm under their salt (again if
        the first re-send missed), then cold under a fresh salt."""
        with self.lock:
            answered = [r for r in self.records if r["kind"] == "turn" and r["endpoint"] == "generate"
                        and not r.get("abort") and r.get("status") == 200]
        chosen, seen = [], set()
        for r in reversed(answered):
            if r["conversation"] not in seen:
                seen.add(r["conversation"])
                chosen.append(r)
            if len(chosen) == self.cfg.exact_sample:
                break
        pairs = []
        for number, r in enumerate(chosen, 1):
            prompt = self.prompts[r["rid"]]
            warm = self.send_generate(f"{self.run}.xw{number:03d}.1", prompt, r["salt"], "exact_warm",
                                      logprobs=True, source_rid=r["rid"])
            if warm.get("status") == 200 and not warm.get("cached_tokens"):
                warm = self.send_generate(f"{self.run}.xw{number:03d}.2", prompt, r["salt"], "exact_warm",
                                          logprobs=True, source_rid=r["rid"])
            cold = self.send_generate(f"{self.run}.xc{number:03d}.1", prompt, f"soak-{self.run}-xc{number}",
                                      "exact_cold", logprobs=True, source_rid=r["rid"])
            pairs.append({"source_rid": r["rid"], "warm": warm, "cold": cold})
        return pairs

    # ------------------------------------------------------------------ events and log

    def read_events(self) -> dict[str, dict] | None:
        if self.cfg.events is None:
            return None
        path = Path(self.cfg.events)
        text = path.read_text(errors="replace") if path.exists() else ""
        return checks.run_events(checks.parse_events(text), self.run + ".")

    def wait_events(self, rids: list[str], timeout: float = 120.0) -> dict[str, dict] | None:
        """The run's events once every rid of ``rids`` has one (the timeout only bounds a failing run)."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.read_events()
            if events is None or all(r in events for r in rids) or time.monotonic() > deadline:
                return events
            time.sleep(0.25)

    def log_lines(self) -> list[str] | None:
        if self.cfg.log is None:
            return None
        with open(self.cfg.log, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(self.log_offset if self.log_offset <= size else 0)
            return f.read().decode(errors="replace").splitlines()

    # ------------------------------------------------------------------ everything

    def execute(self) -> dict:
        started = time.monotonic()
        self.log_offset = Path(self.cfg.log).stat().st_size if self.cfg.log is not None else 0
        models = client.request(self.base, "/v1/models", timeout=30)
        if models.status is None:
            return self.unreachable(models.error or "no answer", started)
        try:
            self.model = models.body["data"][0]["id"]
            self.context_len = int(models.body["data"][0]["max_model_len"])
        except (TypeError, KeyError, IndexError, ValueError):
            pass
        self.mal_ctx = malformed.MalformedContext(self.context_len, f"soak-{self.run}-bad")
        self.mal_kinds = malformed.kinds(self.cfg.malformed, self.mal_ctx)
        bounds = ([f"{self.cfg.minutes:g} min"] if self.cfg.minutes is not None else []) + (
            [f"{self.cfg.requests} requests"] if self.cfg.requests else [])
        self.say(f"soak {self.run}: {self.base}, load of {' or '.join(bounds)}"
                 + f", {self.cfg.concurrency} workers, {self.cfg.tenants} tenants, malformed {self.cfg.malformed}")
        self.load()
        client.wait_idle(self.base)
        answered = [r["rid"] for r in self.records if r["kind"] == "turn" and r.get("status") == 200
                    and not r.get("abort")]
        events = self.wait_events(answered)
        policy = self.cfg.policy or _policy_from(events)
        self.safety_phases()
        self.final_probes()
        pairs = self.exact_sample() if policy == "exact" and self.cfg.exact_sample > 0 else None
        client.wait_idle(self.base)
        flush_tries = client.flush_cache(self.base, admin_key=self.cfg.admin_key)
        time.sleep(self.cfg.idle_s)
        idle_lines = self.log_lines()
        alive = self.send_generate(f"{self.run}.alive.1", random_ids(random.Random(self.cfg.seed), 64),
                                   f"soak-{self.run}-alive", "alive")
        expected = [r["rid"] for r in self.records + self.namespace_records
                    if r["kind"] != "malformed" and not r.get("abort") and r.get("status") == 200]
        events = self.wait_events(expected)
        lines = self.log_lines()
        return self.report(policy, events, lines, idle_lines, flush_tries, alive, pairs, started)

    def safety_phases(self) -> None:
        """The request-safety phases (``safety.py``), against a patched server only (``--malformed all``)."""
        cfg = self.cfg
        if cfg.malformed != "all":
            return
        if cfg.routes:
            self.say(f"soak {self.run}: route table fuzz")
            self.safety["routes"] = safety.run_routes(self.base, cfg.admin_key, self.model)
        if cfg.fuzz_cases != 0:
            self.say(f"soak {self.run}: schema fuzz")
            self.safety["fuzz"] = safety.run_fuzz(self.base, cfg.fuzz_cases, cfg.seed, progress=self.say)
        if cfg.regex_bomb_tokens:
            self.say(f"soak {self.run}: regex bomb ({cfg.regex_bomb_tokens} tokens)")
            self.safety["bomb"] = safety.run_bomb(self.base, cfg.regex_bomb_tokens)
        if cfg.bounds:
            self.say(f"soak {self.run}: request limits beside trivial requests")
            self.safety["bounds"] = bounds.run_bounds(self.base)
        if cfg.namespaces:
            self.namespace_records = safety.send_namespace_probes(self.base, self.run, self.model, cfg.seed)
        client.wait_idle(self.base)

    def safety_checks(self, events) -> list[checks.Check]:
        if self.cfg.malformed != "all":
            why = f"--malformed {self.cfg.malformed}: the server may be stock SGLang"
            return [checks.Check.skipped(name, why)
                    for name in ("routes", "schema_fuzz", "regex_bomb", "namespaces", "bounds")]
        return [safety.check_routes(self.safety.get("routes")) if self.cfg.routes
                else checks.Check.skipped("routes", "routes off"),
                safety.check_fuzz(self.safety.get("fuzz")),
                safety.check_bomb(self.safety.get("bomb"), self.cfg.max_latency_ratio),
                bounds.check_bounds(self.safety.get("bounds"), self.cfg.max_latency_ratio) if self.cfg.bounds
                else checks.Check.skipped("bounds", "--no-bounds"),
                safety.check_namespaces(self.namespace_records, events) if self.cfg.namespaces
                else checks.Check.skipped("namespaces", "--no-namespaces")]

    def unreachable(self, why: str, started: float) -> dict:
        check = checks.Check("alive", checks.FAIL, f"no answer from {self.base}/v1/models: {why}", [why], 1)
        return self.finish({"run": self.run, "server": self.base, "policy": self.cfg.policy,
                            "wall_s": round(time.monotonic() - started, 2), "counts": {}, "measured": {},
                            "checks": {"alive": check.to_dict()}, "passed": False})

    def report(self, policy, events, lines, idle_lines, flush_tries, alive, pairs, started) -> dict:
        results = self.check_results(policy, events, lines, idle_lines, flush_tries, alive, pairs)
        counts = self.counts(events)
        measured = _measured(events)
        report = {
            "run": self.run, "server": self.base, "policy": policy, "seed": self.cfg.seed,
            "config": self.config_record(),
            "load_s": round(self.load_ended - self.load_started, 2),
            "wall_s": round(time.monotonic() - started, 2),
            "counts": counts, "measured": measured, "safety": self.safety,
            "checks": {c.name: c.to_dict() for c in results},
            "passed": all(c.status != checks.FAIL for c in results),
        }
        return self.finish(report)

    def check_results(self, policy, events, lines, idle_lines, flush_tries, alive, pairs) -> list:
        """Every check of the report, in its order; a check whose input was not given is skipped, saying why."""
        cfg = self.cfg
        wellformed = [r for r in self.records if r["kind"] != "malformed"]
        return [
            checks.Check.of("alive", [] if alive.get("status") == 200 and alive.get("output_ids")
                            else [f"{alive['rid']}: {alive.get('status') or alive.get('error')}"],
                            "a good request after the checks"),
            checks.check_fatal_lines(lines) if lines is not None else checks.Check.skipped("log_fatal", "no --log"),
            checks.check_idle_leak(flush_tries, cfg.idle_s, idle_lines),
            checks.check_event_identity(events, [r["rid"] for r in wellformed if not r.get("abort")
                                                 and r.get("status") == 200], policy)
            if events is not None else checks.Check.skipped("event_identity", "no --events"),
            checks.check_isolation(self.of("probe"), events, self.salts),
            (checks.check_scr_sessions(lines, self.salts) if lines is not None
             else checks.Check.skipped("scr_sessions", "no --log"))
            if policy == "scr" else checks.Check.skipped("scr_sessions", f"policy {policy}, not scr"),
            checks.check_exact_pairs(pairs, cfg.exact_sample) if pairs is not None
            else checks.Check.skipped("exact_equality", f"policy {policy}, not exact" if policy != "exact"
                                      else "--exact-sample 0"),
            checks.check_malformed(self.of("malformed")),
            checks.check_wellformed(wellformed),
            *self.safety_checks(events),
        ]

    def counts(self, events) -> dict:
        """What was sent and how the server answered, by kind."""
        records = self.records
        wellformed = [r for r in records if r["kind"] != "malformed"]
        statuses = Counter(_status_class(r.get("status")) for r in records)
        aborted = [r for r in records if r.get("abort")]
        return {
            "sent": len(records),
            "ok": sum(1 for r in wellformed if r.get("status") == 200 and not r.get("abort")),
            "aborted": len(aborted),
            "aborted_by_mode": dict(Counter(r["abort"] for r in aborted)),
            "aborted_confirmed": sum(1 for r in aborted if events and events.get(r["rid"], {}).get("finish_reason")
                                     == "abort"),
            "malformed": len(self.of("malformed")),
            "malformed_4xx": sum(1 for r in self.of("malformed") if _status_class(r.get("status")) == "4xx"),
            "malformed_by_kind": dict(Counter(r["malformed"] for r in self.of("malformed"))),
            "4xx": statuses["4xx"], "5xx": statuses["5xx"], "no_status": statuses["none"],
            "turns": len(self.of("turn")),
            "turns_by_edit": dict(Counter(r["edit"] for r in self.of("turn"))),
            "turns_completions": sum(1 for r in self.of("turn") if r["endpoint"] == "completions"),
            "probes": len(self.of("probe")),
            "conversations": self.next_conversation,
        }

    def config_record(self) -> dict:
        cfg = self.cfg
        return {"minutes": cfg.minutes, "requests": cfg.requests, "concurrency": cfg.concurrency,
                "tenants": cfg.tenants, "malformed": cfg.malformed, "malformed_kinds": self.mal_kinds,
                "exact_sample": cfg.exact_sample, "max_new_tokens": cfg.max_new_tokens,
                "fuzz_cases": cfg.fuzz_cases, "regex_bomb_tokens": cfg.regex_bomb_tokens,
                "bounds": cfg.bounds, "max_latency_ratio": cfg.max_latency_ratio,
                "namespaces": cfg.namespaces, "routes": cfg.routes,
                "events": str(cfg.events) if cfg.events else None, "log": str(cfg.log) if cfg.log else None,
                "context_len": self.context_len}

    def finish(self, report: dict) -> dict:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        with open(self.out_dir / "requests.jsonl", "w") as f:
            for r in self.records + self.namespace_records:
                row = {k: v for k, v in r.items() if k not in ("output_ids", "logprobs")}
                row["output_tokens"] = len(r.get("output_ids") or [])
                f.write(json.dumps(row) + "\n")
        return report


def _measured(events) -> dict:
    """The events' token counts summed (empty without events)."""
    if not events:
        return {}
    ev = list(events.values())
    return {
        "events": len(ev),
        **{k: sum(int(e.get(k) or 0) for e in ev)
           for k in ("prompt_tokens", "prefix_reused", "moved", "read", "decode_tokens", "blocks",
                     "retractions")},
        "relocated_requests": sum(1 for e in ev if e.get("moved")),
        "fallbacks": sum(1 for e in ev if e.get("fallback")),
        "finish_abort": sum(1 for e in ev if e.get("finish_reason") == "abort"),
    }


def _status_class(status) -> str:
    if not isinstance(status, int):
        return "none"
    return f"{status // 100}xx"


def _policy_from(events: dict[str, dict] | None) -> str | None:
    if not events:
        return None
    return Counter(e.get("policy") for e in events.values()).most_common(1)[0][0]


def run_soak(url: str, out_dir: str | Path, *, progress: TextIO | None | object = STDERR, **settings) -> dict:
    """Run the soak against the loopback server at ``url``; returns the report (also in
    ``out_dir/report.json``). ``settings``: ``SoakConfig`` fields. Raises UsageError before
    sending anything when an argument is wrong."""
    from eval.fidelity.run import UsageError as AddressError, check_loopback

    try:
        base = check_loopback(url)
    except AddressError as exc:
        raise UsageError(str(exc)) from None
    for key in ("events", "log"):
        if settings.get(key) is not None:
            settings[key] = Path(settings[key])
    unknown = set(settings) - set(SoakConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"run_soak: unknown settings {sorted(unknown)}")
    cfg = SoakConfig(**settings).resolved()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc}") from None
    return Soak(base, out, cfg, sys.stderr if progress is STDERR else progress).execute()


def format_table(report: dict, offenders: int = 3) -> str:
    """The short table the CLI prints."""
    counts = report.get("counts") or {}
    lines = [f"soak {report['run']} against {report['server']} (policy {report.get('policy')}): "
             f"wall {report.get('wall_s', 0):.1f} s, load {report.get('load_s', 0):.1f} s"]
    if counts:
        head = ("sent", "ok", "aborted", "malformed", "4xx", "5xx", "no_status")
        lines.append("  ".join(f"{h:>9}" for h in head))
        lines.append("  ".join(f"{counts.get(h, 0):>9}" for h in head))
    lines.append(f"{'check':<16} {'result':<8} detail")
    for name, check in report["checks"].items():
        lines.append(f"{name:<16} {check['status']:<8} {check['detail']}")
        for offender in check["offenders"][:offenders]:
            lines.append(f"{'':<16} {'':<8} - {offender}")
        if check["count"] > offenders:
            lines.append(f"{'':<16} {'':<8} ... {check['count'] - offenders} more (report.json)")
    lines.append("PASS" if report["passed"] else "FAIL")
    return "\n".join(lines)
