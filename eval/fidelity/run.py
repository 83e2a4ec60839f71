"""Drive the fidelity measurement against a running server and write its files.

Order of requests (why: ``scr/sessions.py`` gives side slots first come, first served, and frees
one only when the LRU of 16 sessions evicts its holder; every request, a cold read included, opens
a session in its namespace):

1. every scenario's conversation, arm after arm, each turn in order, in the arm's namespace;
2. then one cold read per (scenario, measured turn) in a fresh namespace, shared by the arms (same
   prompt, same decode settings; greedy decoding is deterministic).

So the arm conversations take their side slots before the cold reads take any, and no other
session is opened between two turns of one conversation. A server whose slots are all held by
earlier sessions may still give a conversation none (it then relocates nothing, ``moved = 0``);
``--cache-policy-set side_sessions=16`` (= ``max_sessions``) rules that out.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import secrets
import sys
import textwrap
import time
import urllib.parse
from pathlib import Path
from typing import Callable, Sequence, TextIO

from eval import cli_types, http, plots
from eval.fidelity import metrics
from eval.fidelity.scenarios import Scenario, arm_salt, change_kind, cold_salt, default_scenarios, salt_problem
from policy.events import RequestEvent

Post = Callable[[str, dict], dict]
DEFAULT_TOKENS = 16
DEFAULT_TOP = 20
CSV_FIELDS = (
    "run", "scenario", "arm", "turn", "change", "salt", "knobs", "ssm_mode", "rerotate", "rid", "cold_rid",
    "prompt_tokens", "scr_cached_tokens", "cold_cached_tokens", "policy", "prefix_reused", "moved", "read",
    "blocks", "moved_share", "relocated", "tokens", "top", "agree_tokens", "greedy_agreement", "first_divergence",
    "max_abs_dlogprob", "kl_first", "kl_missing", "topk_overlap", "checks_failed",
)


STDERR = object()  # run_fidelity's default progress stream: sys.stderr at call time


class UsageError(cli_types.UsageError, ValueError):
    """Bad input before anything is measured (flags, scenario file, server address): exit status 2."""


class ServerError(RuntimeError):
    """The server failed a request during the run: exit status 1."""


def check_loopback(url: str) -> str:
    """``url`` without a trailing slash if its host is loopback (127.0.0.0/8, localhost, ::1)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"--server {url!r}: expected http://HOST:PORT")
    host = parsed.hostname.lower()
    loopback = host == "localhost"
    if not loopback:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        loopback = address is not None and (
            address in ipaddress.ip_network("127.0.0.0/8") if address.version == 4
            else address == ipaddress.ip_address("::1"))
    if not loopback:
        raise UsageError(f"--server {url!r}: only a loopback server (127.0.0.0/8, localhost, ::1) is measured")
    return url.rstrip("/")


def check_reachable(base: str, timeout: float = 10.0) -> None:
    """GET ``/model_info`` (generates nothing, so it opens no SCR session)."""
    answer = http.get(base + "/model_info", timeout=timeout)
    if not answer.ok:
        reason = answer.error.removeprefix("connection error: ") if answer.status is None else f"HTTP {answer.status}"
        raise UsageError(f"cannot reach the server at {base}: {reason}")


def request_payload(prompt: Sequence[int], salt: str, rid: str, tokens: int, top: int) -> dict:
    """Greedy ``/generate`` with the chosen tokens' logprobs and the top-K per generated position."""
    return {
        "input_ids": list(prompt), "rid": rid, "extra_key": salt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": top,
    }


def parse_answer(response: dict, rid: str, tokens: int) -> tuple[dict, list[str]]:
    """(``{"output_ids", "logprobs", "top", "cached_tokens", "prompt_tokens"}``, problems)."""
    problems = []
    meta = response.get("meta_info") or {}
    ids = list(response.get("output_ids") or [])
    chosen = meta.get("output_token_logprobs") or []
    top = [[(entry[0], entry[1]) for entry in (position or [])] for position in (meta.get("output_top_logprobs") or [])]
    answer = {"output_ids": ids, "logprobs": [entry[0] for entry in chosen], "top": top,
              "cached_tokens": meta.get("cached_tokens"), "prompt_tokens": meta.get("prompt_tokens")}
    if len(ids) != tokens:
        problems.append(f"{rid}: {len(ids)} output tokens, expected {tokens} (ignore_eos)")
    if len(chosen) != len(ids) or [entry[1] for entry in chosen] != ids:
        problems.append(f"{rid}: output_token_logprobs do not match output_ids")
    if not top or not top[0]:
        problems.append(f"{rid}: no output_top_logprobs for the first generated token")
    if answer["cached_tokens"] is None:
        problems.append(f"{rid}: no cached_tokens in meta_info")
    return answer, problems


def read_events(path: Path) -> dict[str, dict]:
    """Events by rid; a last line the server is still writing is skipped, any other bad line raises."""
    if not path.exists():
        return {}
    lines = path.read_text(errors="replace").splitlines()
    events = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not JSON") from None
        events[event.get("rid")] = event
    return events


def wait_events(path: Path, rids: Sequence[str], timeout: float) -> dict[str, dict]:
    """The server writes an event as the request leaves the scheduler, maybe after the answer."""
    deadline = time.monotonic() + timeout
    while True:
        events = read_events(path)
        if all(rid in events for rid in rids) or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def _event(events: dict | None, rid: str, failures: list[str]) -> RequestEvent | None:
    if events is None:
        return None
    if rid not in events:
        failures.append(f"{rid}: no event in the --events file")
        return None
    try:
        return RequestEvent.from_dict(events[rid])
    except (ValueError, TypeError) as exc:
        failures.append(f"{rid}: bad event: {exc}")
        return None


def _post(post: Post, path: str, payload: dict) -> dict:
    try:
        return post(path, payload)
    except (RuntimeError, OSError, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ServerError(f"{payload.get('rid')}: {first_line}") from None


def run_fidelity(server_url: str, out_dir: str | Path, scenarios: Sequence[Scenario] | None = None,
                 events_path: str | Path | None = None, tokens: int = DEFAULT_TOKENS, top: int = DEFAULT_TOP, *,
                 run_id: str | None = None, post: Post | None = None, progress: TextIO | None | object = STDERR,
                 events_timeout: float = 15.0) -> dict:
    """Measure every scenario on ``server_url`` and write ``out_dir``; returns the summary.

    Raises ``UsageError`` (bad address, unreachable server, bad settings) before any request and
    ``ServerError`` when a request fails. Failed checks do not raise: they are listed in
    ``summary["checks_failed"]`` (the CLI exits 1 on any).
    """
    scenarios = _checked_scenarios(scenarios, tokens, top)
    base, post = _connect(server_url, post)
    if progress is STDERR:
        progress = sys.stderr
    run_id = run_id or f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    events_path = Path(events_path) if events_path is not None else None
    out = _out_dir(out_dir)

    def say(line: str) -> None:
        if progress is not None:
            print(line, file=progress, flush=True)

    say(f"fidelity: run {run_id}: {len(scenarios)} scenario(s) on {base}, {tokens} tokens, top-{top}")
    rows = _measure(post, scenarios, run_id, tokens, top, say)
    checks_failed = _checks_failed(rows, events_path, events_timeout)
    summary_by_arm = metrics.summarise(rows)
    text = metrics.markdown(summary_by_arm, rows, tokens, top)
    files = _write(out, rows, text)
    summary = {
        "run": run_id, "server": base, "tokens": tokens, "top": top,
        "events": None if events_path is None else str(events_path),
        "scenarios": [s.name for s in scenarios], "requests": len(rows), "arms": summary_by_arm,
        "checks_failed": checks_failed, "warnings": _warnings(summary_by_arm), "note": metrics.NOTE,
        "markdown": text, "files": [str(p) for p in files],
    }
    summary["files"].append(str(out / "summary.json"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    summary["rows"] = rows
    return summary


def _checked_scenarios(scenarios: Sequence[Scenario] | None, tokens: int, top: int) -> list[Scenario]:
    """The scenarios to run (the built-in set by default), once the settings and every arm's salt
    are known to be usable; else ``UsageError``."""
    if tokens < 1 or top < 1:
        raise UsageError(f"tokens={tokens}, top={top}: both must be >= 1")
    scenarios = list(scenarios) if scenarios is not None else default_scenarios()
    for scenario in scenarios:
        for arm in scenario.arms:
            problem = salt_problem(arm.salt)
            if problem:
                raise UsageError(f"scenario {scenario.name}, arm {arm.name}: {problem}")
    return scenarios


def _connect(server_url: str, post: Post | None) -> tuple[str, Post]:
    """The loopback base URL and the transport: ``post`` as given (tests), else HTTP to a server
    that answers."""
    base = check_loopback(server_url)
    if post is None:
        check_reachable(base)
        post = lambda path, payload: http.post_json(base + path, payload)  # noqa: E731
    return base, post


def _out_dir(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    return out


def _measure(post: Post, scenarios: Sequence[Scenario], run_id: str, tokens: int, top: int,
             say: Callable[[str], None]) -> list[dict]:
    """Steps 1 and 2 (``_serve_conversations``, ``_cold_reads``): one row per arm and measured turn."""
    served = _serve_conversations(post, scenarios, run_id, tokens, top)
    rows: list[dict] = []
    for number, scenario in enumerate(scenarios, 1):
        cold = _cold_reads(post, scenario, run_id, tokens, top)
        scenario_rows = [
            _row(run_id, scenario, arm, turn, served[scenario.name, arm.name, turn], cold[turn], tokens, top)
            for arm in scenario.arms for turn in range(2, len(scenario.turns) + 1)]
        rows.extend(scenario_rows)
        say(_progress_line(number, len(scenarios), scenario, scenario_rows))
    return rows


def _checks_failed(rows: list[dict], events_path: Path | None, events_timeout: float) -> list[str]:
    """Step 3: join the server's events to the rows (when given), then every failed check once."""
    checks_failed: list[str] = []
    if events_path is not None:
        wanted = [r["rid"] for r in rows] + sorted({r["cold_rid"] for r in rows})
        try:
            events = wait_events(events_path, wanted, events_timeout)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--events {events_path}: {exc}") from None
        _join_events(rows, events)
    for row in rows:
        checks_failed.extend(row["checks_failed"])
    return list(dict.fromkeys(checks_failed))  # a shared cold read's failure once


def _warnings(summary_by_arm: dict) -> list[str]:
    return [f"arm {arm}: no request relocated anything (an ssm mode that declines, no free side slot, "
            "or edits the planner does not take)"
            for arm, values in summary_by_arm.items() if values["relocated"] == 0]


def _serve_conversations(post: Post, scenarios: Sequence[Scenario], run_id: str, tokens: int, top: int) -> dict:
    """Step 1: each arm's conversation, turn by turn, in its namespace -> {(scenario, arm, turn): answer}."""
    served = {}
    for scenario in scenarios:
        for arm in scenario.arms:
            salt = arm_salt(arm, f"{run_id}.{scenario.name}.{arm.name}")
            for turn, prompt in enumerate(scenario.turns, 1):
                rid = f"fid.{run_id}.{scenario.name}.{arm.name}.{turn}"
                response = _post(post, "/generate", request_payload(prompt, salt, rid, tokens, top))
                if turn > 1:
                    served[scenario.name, arm.name, turn] = (rid, salt, *parse_answer(response, rid, tokens))
    return served


def _cold_reads(post: Post, scenario: Scenario, run_id: str, tokens: int, top: int) -> dict:
    """Step 2: each measured turn once more, in a fresh namespace -> {turn: answer}."""
    cold = {}
    for turn, prompt in enumerate(scenario.turns[1:], 2):
        rid = f"fid.{run_id}.{scenario.name}.cold.{turn}"
        salt = cold_salt(run_id, scenario.name, turn)
        response = _post(post, "/generate", request_payload(prompt, salt, rid, tokens, top))
        cold[turn] = (rid, salt, *parse_answer(response, rid, tokens))
    return cold


def _row(run_id: str, scenario: Scenario, arm, turn: int, served, cold, tokens: int, top: int) -> dict:
    rid, salt, answer, problems = served
    cold_rid, _, cold_answer, cold_problems = cold
    prompt = scenario.turns[turn - 1]
    knobs = arm.knobs
    failures = list(problems) + list(cold_problems)
    if cold_answer["cached_tokens"] not in (None, 0):
        failures.append(f"{cold_rid}: cold read reused {cold_answer['cached_tokens']} cached tokens (must be 0)")
    for who, got in ((rid, answer), (cold_rid, cold_answer)):
        if got["prompt_tokens"] is not None and got["prompt_tokens"] != len(prompt):
            failures.append(f"{who}: prompt_tokens {got['prompt_tokens']} != {len(prompt)} sent")
    if _comparable(answer) and _comparable(cold_answer):
        fidelity = metrics.compare_outputs(answer, cold_answer, tokens)
    else:
        fidelity = dict.fromkeys(("agree_tokens", "greedy_agreement", "first_divergence", "max_abs_dlogprob",
                                  "kl_first", "kl_missing", "topk_overlap"))
    return {
        "run": run_id, "scenario": scenario.name, "arm": arm.name, "turn": turn,
        "change": change_kind(scenario.turns[turn - 2], prompt), "salt": salt, "knobs": knobs,
        "ssm_mode": knobs.get("ssm_mode"),
        "rerotate": None if "no_rerotate" not in knobs else not knobs["no_rerotate"],
        "rid": rid, "cold_rid": cold_rid, "prompt_tokens": len(prompt),
        "scr_cached_tokens": answer["cached_tokens"], "cold_cached_tokens": cold_answer["cached_tokens"],
        "policy": None, "prefix_reused": None, "moved": None, "read": None, "blocks": None,
        "moved_share": None, "relocated": None, "tokens": tokens, "top": top, **fidelity,
        "scr_output_ids": answer["output_ids"], "cold_output_ids": cold_answer["output_ids"],
        "checks_failed": failures,
    }


def _comparable(answer: dict) -> bool:
    """Enough of an answer to compare: ids, one logprob per id, a top-K list for the first token."""
    ids = answer["output_ids"]
    return bool(ids) and len(answer["logprobs"]) == len(ids) and bool(answer["top"]) and bool(answer["top"][0])


def _join_events(rows: list[dict], events: dict[str, dict]) -> None:
    for row in rows:
        failures = row["checks_failed"]
        event = _event(events, row["rid"], failures)
        if event is not None:
            share = event.moved / event.prompt_tokens if event.prompt_tokens else 0.0
            row.update(policy=event.policy, prefix_reused=event.prefix_reused, moved=event.moved, read=event.read,
                       blocks=event.blocks, moved_share=share, relocated=event.moved > 0)
            if event.policy != "scr":
                failures.append(f"{row['rid']}: served by policy {event.policy!r}, not scr")
            if event.prompt_tokens != row["prompt_tokens"]:
                failures.append(f"{row['rid']}: event prompt_tokens {event.prompt_tokens} != {row['prompt_tokens']}")
        cold_event = _event(events, row["cold_rid"], failures)
        if cold_event is not None and cold_event.prefix_reused + cold_event.moved:
            failures.append(f"{row['cold_rid']}: cold read reused {cold_event.prefix_reused} and moved "
                            f"{cold_event.moved} tokens (events; must be 0)")


def _progress_line(number: int, total: int, scenario: Scenario, rows: list[dict]) -> str:
    kls = [r["kl_first"] for r in rows if r["kl_first"] is not None]
    agreement = [r["greedy_agreement"] for r in rows if r["greedy_agreement"] is not None]
    failed = sum(1 for r in rows if r["checks_failed"])
    return (f"fidelity: [{number}/{total}] {scenario.name}: {len(scenario.arms)} arms x "
            f"{len(scenario.turns) - 1} measured turns, greedy agreement "
            f"{metrics.fmt(sum(agreement) / len(agreement) if agreement else None, 'share')}, "
            f"max KL(1st) {metrics.fmt(max(kls) if kls else None)}"
            + (f", {failed} requests with failed checks" if failed else ""))


def _write(out: Path, rows: list[dict], text: str) -> list[Path]:
    paths = [out / "fidelity.jsonl", out / "fidelity.csv", out / "table.md", out / "kl_vs_moved.png"]
    with open(paths[0], "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    with open(paths[1], "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            flat = {**row, "knobs": ",".join(f"{k}={v}" for k, v in row["knobs"].items()),
                    "checks_failed": " | ".join(row["checks_failed"])}
            writer.writerow({k: "" if flat.get(k) is None else flat[k] for k in CSV_FIELDS})
    paths[2].write_text(text + "\n")
    plot_kl_vs_moved(rows, paths[3])
    return paths


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_kl_vs_moved(rows: Sequence[dict], path: Path) -> None:
    """KL of the first token against moved share, one marker per arm (rows without events are left out)."""
    fig, ax = plots.subplots(6.5, 4.8)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    plotted, right, top = 0, 0.0, 0.0
    for i, arm in enumerate(arms):
        points = [(r["moved_share"] * 100, r["kl_first"]) for r in rows
                  if r["arm"] == arm and r["moved_share"] is not None and r["kl_first"] is not None]
        if points:
            ax.scatter([x for x, _ in points], [y for _, y in points], marker=MARKERS[i % len(MARKERS)],
                       s=48, alpha=0.8, label=arm, clip_on=False)
            plotted += len(points)
            right = max(right, *(x for x, _ in points))
            top = max(top, *(y for _, y in points))
    if not plotted:
        ax.text(0.5, 0.5, "moved share unknown: run with --events FILE", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlim(0, min(100.0, right * 1.15 + 5))
    ax.set_xlabel("moved share of the prompt (%)")
    ax.set_ylabel("KL(cold || scr), first generated token")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_ylim(0, max(1e-5, top * 3))
    ax.set_title("First-token KL vs relocated share")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(title="arm")
    fig.text(0.5, 0.01, textwrap.fill(metrics.NOTE, 100), ha="center", va="bottom", fontsize=7)
    plots.save(fig, path, rect=(0, 0.06, 1, 1))
