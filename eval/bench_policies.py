"""``python -m eval.bench_policies``: the three policies on the same agent trace, side by side.

    python -m eval.bench_policies --out DIR [--trace FILE | --questions N --seed S] [--render default|preserve]
        [--policies radix,exact,scr] [--concurrency N] [--model DIR]

Cache decisions depend only on the token sequences, so once the prompts and completions of an
agent run are fixed (a trace: ``eval/traces/format.py``), the cost side of the comparison can be
measured exactly on the CPU with the tiny model. Per policy, one after another (never two servers
at once: an idle SGLang scheduler busy-polls a core), this

1. starts ``python -m patches.launch_server`` on the long-context tiny model with the serving
   settings users run (``SERVING_ARGS``: radix and scr read 512-token prefill chunks, as the SCR
   authors' serving script; exact B = 832, R = 6,656), ``--cache-events`` and a log;
2. replays the trace with forced decoding (``eval.replay``): every call reads the recorded
   prompt ids and produces exactly the recorded completion ids;
3. stops the server and ingests its events with the client rows (``eval.report ingest`` with
   every check: identities, one server row per call);
4. for exact, replays the trace through ``exact_cache.replay`` in the order the server admitted
   the calls and counts the calls whose reuse equals the prediction (must be all).

Then ``eval.report compare`` writes the table and the two plots, and this module adds what only a
shared trace can give: shares over the calls the *trace* marks as edited (the same calls for
every policy), PFLOPs per question and their ratio to radix, and the wall-time ratio measured in
this run. Without ``--trace`` the default set is generated first (``eval.traces synth``), rendered
as ``--render`` says (``eval/render.py``: ``default`` strips earlier reasoning once a user turn
follows, ``preserve`` keeps it); the rendering goes into the trace's name and lines, so a
``preserve`` set is another file with another digest and ``--resume`` never mixes the two. The
rendering is recorded in ``bench.json`` and the table's first line.

The tiny model is random: the numbers measure the cache machinery on BrowseComp-Plus-shaped token
sequences, not the real model. PFLOPs use Qwen3.6-27B's geometry on the trace's token counts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eval.accounting.causes import attribute, classify, relocation_read_bound, session_use
from eval.arms import Arm, ArmError, baseline, parse_arms, parse_concurrency, sweep, with_profile
from eval.server import ServerProcess, wait_for_events
from serving.profile import DEFAULT as SERVING_PROFILE_DEFAULT, PROFILES

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m eval.bench_policies"
POLICIES = ("radix", "exact", "scr")
PIECE, RETAIN = 832, 6656  # exact: B and R of the default serving configuration (exact_cache/README.md)
CHUNK = 512  # radix and scr: the SCR authors' --chunked-prefill-size
DEFAULT_QUESTIONS, DEFAULT_SEED = 10, 0  # 10: the three default arms replay in about an hour on 2 cores


def trace_sizes(calls) -> tuple[int, int]:
    """(context length, KV pool tokens) that hold ``calls``: the longest call rounded up to 1,024
    (at least 8,192), and every call's tokens plus one context (at most 2,000,000)."""
    longest = max(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    context_len = max(8192, -(-(longest + 64) // 1024) * 1024)
    return context_len, min(2_000_000, sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls) + context_len)


def bench_settings(arm: Arm) -> dict[str, str]:
    """The policy settings an arm runs with: the benchmark's serving configuration (exact: B = 832,
    R = 6,656; scr: the authors' deployed defaults, 12 side slots of 30,000 rows, untouched), then
    the arm's own settings, which win. Fewer side slots are an arm, not a default: with 8, content
    matching misses a conversation's own session whenever stale sessions hold every slot."""
    defaults = {
        "exact": {"piece_tokens": str(PIECE), "retain_every": str(RETAIN)},
    }.get(arm.policy, {})
    return {**defaults, **dict(arm.settings)}


def serving_args(arm: Arm | str, context_len: int, pool_tokens: int, concurrency: int) -> list[str]:
    """Launcher arguments of ``arm`` (a policy name: its defaults) for a trace with prompts up to
    ``context_len`` tokens. exact reads in pieces of its B, the others in 512-token chunks."""
    arm = arm if isinstance(arm, Arm) else Arm(arm, arm)
    settings = bench_settings(arm)
    chunk = settings["piece_tokens"] if arm.policy == "exact" else str(CHUNK)
    return ["--context-length", str(context_len), "--max-total-tokens", str(pool_tokens),
            "--max-running-requests", str(max(2, concurrency)), "--max-mamba-cache-size", "4096",
            "--skip-server-warmup", "--cache-policy", arm.policy, "--chunked-prefill-size", chunk,
            *(arg for key, value in settings.items() for arg in ("--cache-policy-set", f"{key}={value}")),
            "--serving-profile", arm.serving_profile]


def trace_edited(calls) -> set[str]:
    """Conversation.turn keys of the calls whose prompt drops part of the previous prompt."""
    from eval.accounting.provenance import EDIT_SLACK  # the accounting's rule for "edited"
    from policy.tokens import common_prefix_len

    edited, previous = set(), {}
    for call in calls:
        before = previous.get(call.conversation)
        if before is not None and common_prefix_len(before, call.prompt_ids) < len(before) - EDIT_SLACK:
            edited.add(f"{call.conversation}.{call.turn}")
        previous[call.conversation] = call.prompt_ids
    return edited


def replayed_reuse(calls, events, run: str, tree, unrecorded: dict[str, float] | None = None) -> dict[str, int]:
    """rid -> ``exact_cache.replay``'s reuse for each call of ``events`` (one server's event dicts),
    served through ``tree`` (a ``ReplayTree``) in the order that server queued them (``queued_ts``)
    with each event's match cap. ``unrecorded``: rid -> queue time of calls the server read whose
    events are missing (a full disk): their prompts are in the replay, they get no prediction."""
    from exact_cache.replay import replay_tree

    by_rid = {call.rid(run): call for call in calls}
    ghosts = [{"rid": rid, "queued_ts": ts, "ghost": True} for rid, ts in (unrecorded or {}).items() if rid in by_rid]
    order = sorted([e for e in events if e["rid"] in by_rid] + ghosts, key=lambda e: e["queued_ts"])
    reuse = replay_tree(tree, [by_rid[e["rid"]].prompt_ids for e in order], [e.get("match_cap") for e in order])
    return {e["rid"]: r for e, r in zip(order, reuse) if not e.get("ghost")}


def exact_agreement(calls, events: dict[str, dict], run: str, piece: int = PIECE, retain: int = RETAIN,
                    config=None, unrecorded: dict[str, float] | None = None) -> dict:
    """Calls whose reuse under exact equals ``exact_cache.replay``'s prediction (``replayed_reuse``).

    ``config``: the server's resolved ``ExactConfig`` (its start-up record: the cut rule and the
    message-end id the launcher looked up); without it, the grid rule with ``piece`` and ``retain``."""
    from exact_cache.replay import ReplayTree

    tree = ReplayTree.for_config(config) if config is not None else ReplayTree(piece, retain)
    predicted = replayed_reuse(calls, events.values(), run, tree, unrecorded)
    differ = [{"rid": rid, "served": events[rid]["prefix_reused"], "predicted": p}
              for rid, p in predicted.items() if events[rid]["prefix_reused"] != p]
    calls_n = len(predicted)
    return {"calls": calls_n, "equal": calls_n - len(differ), "differ": differ[:20],
            "share": (calls_n - len(differ)) / calls_n if calls_n else 0.0}


def served_exact_config(events_path: Path):
    """The ``ExactConfig`` a server ran with, from the last start-up record of its events file."""
    from exact_cache.config import ExactConfig
    from policy.events import read_startups

    startups = read_startups(str(events_path))
    if not startups:
        raise ValueError(f"{events_path}: no start-up record, so the exact settings it served are unknown")
    return ExactConfig(**startups[-1]["settings"])


def edited_shares(rows: list[dict], edited: set[str], run: str) -> dict[str, float]:
    """Prefix / moved / read shares of the prompt tokens of the trace's edited calls."""
    selected = [r for r in rows if r["rid"].removeprefix(f"{run}.") in edited]
    prompt = sum(r["prompt_tokens"] for r in selected)
    return {k: (sum(r[k] for r in selected) / prompt if prompt else 0.0) for k in ("prefix_reused", "moved", "read")}


def radix_sensitivity(calls, chunks=(128, 256, 512, 1024, 2048)) -> dict[int, float]:
    """Radix's prefix share of prompt tokens by recurrent-state checkpoint spacing (CPU's no_buffer
    keeps a state at every prefill chunk end): the offline estimate of ``eval.traces``."""
    from eval.traces.synth import radix_prefix_estimate

    prompt = sum(len(c.prompt_ids) for c in calls)
    return {chunk: sum(radix_prefix_estimate(calls, chunk=chunk)) / prompt for chunk in chunks}


def file_digest(path: Path) -> str:
    """sha256 of a file: names the trace an arm's result was measured on."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def reusable(out: Path, arm: Arm, args: list[str], concurrency: int, trace_sha: str) -> dict | None:
    """The result an earlier run left in ``out`` when it measured the same thing (same trace digest,
    server arguments, settings and concurrency, every check passed, report written), else None.
    ``--resume`` uses it so that an interrupted benchmark does not serve finished arms again."""
    try:
        result = json.loads((out / "bench.json").read_text())
    except (OSError, ValueError):
        return None
    same = (result.get("trace_sha256") == trace_sha and result.get("server_args") == args
            and result.get("settings") == dict(arm.settings) and result.get("concurrency") == concurrency
            and result.get("policy") == arm.policy)
    if not same or result.get("checks_failed") or not (out / "report").is_dir():
        return None
    if result.get("exact_prediction", {}).get("share", 1.0) < 1.0:
        return None
    return result


def run_arm(arm: Arm, model_dir: Path, calls, out: Path, concurrency: int, run: str, trace_sha: str = "",
            resume: bool = False) -> dict:
    """Serve ``arm``, replay the trace into ``out``, stop, ingest with every check (or, with
    ``resume``, return the finished result an earlier run left there: ``reusable``)."""
    from eval.replay.run import replay
    from eval.report import ingest
    from eval.soak import client

    context_len, pool = trace_sizes(calls)
    args = [*serving_args(arm, context_len, pool, concurrency), "--cache-events", str(out / "events.jsonl")]
    if resume and (earlier := reusable(out, arm, args, concurrency, trace_sha)) is not None:
        earlier["reused"] = True
        print(f"{PROG}: {arm.name}: reusing the finished result in {out} (--resume; replay took "
              f"{earlier['replay_s']} s)", file=sys.stderr, flush=True)
        return earlier
    out.mkdir(parents=True, exist_ok=True)
    for name in ("events.jsonl", "client.jsonl", "bench.json"):
        (out / name).unlink(missing_ok=True)
    server = ServerProcess(model_path=str(model_dir), log_path=out / "server.log", extra_args=args,
                           env={"SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1"}).start()
    started = time.monotonic()
    try:
        send = lambda path, payload: client.request(server.url, path, payload, timeout=3600)  # noqa: E731
        # The trace's first call alone, then the rest: concurrent first calls would race for the
        # shared system prompt, and the exact prediction replays calls in queue order.
        replay(send, calls[:1], out, run, 1, progress=sys.stderr)
        replay(send, calls, out, run, concurrency, progress=sys.stderr)
        wall = time.monotonic() - started
        events = wait_for_events(out / "events.jsonl", [c.rid(run) for c in calls], timeout=60)
    finally:
        server.stop()
    rows, failures = ingest(out / "events.jsonl", out / "report", client_path=out / "client.jsonl", policy=arm.policy)
    result = {"arm": arm.name, "policy": arm.policy, "settings": dict(arm.settings), "concurrency": concurrency,
              "serving_profile": arm.serving_profile, "trace_sha256": trace_sha, "replay_s": round(wall, 1), "checks_failed": failures, "server_args": args,
              "fatal_lines": server.fatal_lines()[:5]}
    if arm.policy == "exact":
        result["exact_prediction"] = exact_agreement(calls, events, run,
                                                     config=served_exact_config(out / "events.jsonl"))
    (out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def scr_log(log_path: Path):
    """The scr arm's server log, read (``eval.accounting.server_log.parse_log``): its splice lines
    give each relocated block, its ``kv6trace ev=req`` lines each call's session."""
    from eval.accounting.server_log import parse_log

    with open(log_path, errors="replace") as f:
        return parse_log(f)


def cause_cells(result: dict, key: str) -> str:
    """``template / edit / rollback / other`` points of ``key`` (moved or read) for one arm."""
    causes = result.get("causes") or {}
    return " / ".join(f"{causes.get(c, {}).get(f'{key}_points', 0.0):.1f}" for c in ("template", "edit", "rollback", "other"))


def headline(results: dict[str, dict], table: dict[str, dict], edited: dict[str, dict], questions: int,
             edited_calls: int, baseline: str, render: str = "default") -> str:
    """The benchmark's own table: shares, edited (per the trace) shares, PFLOPs, wall time."""
    names = list(results)
    base_wall = results.get(baseline, {}).get("replay_s")
    rows = [
        ("prefix / moved / read, all calls",
         lambda n: f"{table[n]['prefix_share']:.1%} / {table[n]['moved_share']:.1%} / {table[n]['read_share']:.1%}"),
        (f"prefix / moved / read, {edited_calls} edited calls (trace)",
         lambda n: f"{edited[n]['prefix_reused']:.1%} / {edited[n]['moved']:.1%} / {edited[n]['read']:.1%}"),
        ("PFLOPs per question (Qwen3.6-27B geometry)", lambda n: f"{table[n]['pflops_per_conversation']:.3f}"),
        (f"  ratio to {baseline}", lambda n: f"{table[n]['pflops_per_conversation_ratio']:.3f}"),
        ("naive PFLOPs per question (no cache)", lambda n: f"{table[n]['naive_pflops_per_conversation']:.3f}"),
        ("replay wall time, s", lambda n: f"{results[n]['replay_s']:.0f}"),
        (f"  ratio to {baseline}",
         lambda n: f"{results[n]['replay_s'] / base_wall:.2f}" if base_wall else "n/a"),
        ("exact: calls equal to exact_cache.replay",
         lambda n: (f"{results[n]['exact_prediction']['equal']}/{results[n]['exact_prediction']['calls']}"
                    if "exact_prediction" in results[n] else "")),
        ("moved points by cause: template / edit / rollback / other", lambda n: cause_cells(results[n], "moved")),
        ("read points by cause: template / edit / rollback / other", lambda n: cause_cells(results[n], "read")),
        ("read points of appends / first calls", lambda n: " / ".join(
            f"{(results[n].get('causes') or {}).get(c, {}).get('read_points', 0.0):.1f}" for c in ("append", "first"))),
        ("scr: read only for want of a state inside relocated rows (offline bound), points",
         lambda n: f"{results[n]['relocation_read_bound']['points']:.1f}" if "relocation_read_bound" in results[n]
         else ""),
        ("scr: sessions (merged across conversations) / calls that missed their conversation's session",
         lambda n: (f"{results[n]['sessions']['sessions']} ({results[n]['sessions']['merged']}) / "
                    f"{results[n]['sessions']['split_calls']} (read {results[n]['sessions']['split_read_points']:.1f} pts)")
         if "sessions" in results[n] else ""),
        ("checks", lambda n: "pass" if not results[n]["checks_failed"] else f"FAILED ({len(results[n]['checks_failed'])})"),
    ]
    lines = [f"{questions} questions, rendering {render} (eval/render.py); the tiny random model on CPU "
             "(cost side only, not quality)", "",
             "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(n) for n in names) + " |" for label, cell in rows]
    return "\n".join(lines)


def default_model(trace_path: Path) -> Path:
    """The long-context tiny model whose tokenizer wrote ``trace_path``: Qwen3.6's own (248,320
    embedding rows) when an id is past the tiny tokenizer's vocabulary, else the tiny one."""
    from eval.tiny_model import VOCAB_SIZE, cached_build
    from eval.traces import read_trace

    largest = max((max(c.prompt_ids + c.completion_ids, default=0) for c in read_trace(trace_path)), default=0)
    tokenizer = "qwen" if largest >= VOCAB_SIZE else "tiny"
    return cached_build(ROOT / ".artifacts", max_positions=131072, tokenizer=tokenizer)


def synth_default(path: Path, questions: int, seed: int, small: bool = False, render: str = "default") -> None:
    """``eval.traces synth`` into ``path`` (``small``: its small preset; ``render``: how earlier
    turns are rendered, ``eval/render.py``)."""
    import subprocess

    subprocess.run([sys.executable, "-m", "eval.traces", "synth", "--out", str(path), "--questions", str(questions),
                    "--seed", str(seed), "--render", render, *(["--small"] if small else [])], check=True)


def default_trace_path(out: Path, questions: int, seed: int, render: str = "default") -> Path:
    """Where the generated set goes. A ``preserve`` set has its own name; the ``default`` one
    keeps the name it had before renderings were named, so a folder's earlier trace is reused
    (synth then always rendered the default way)."""
    return out / f"trace-q{questions}-s{seed}-qwen{'' if render == 'default' else '-' + render}.jsonl"


def trace_rendering(trace: Path, wanted: str | None) -> str:
    """The rendering ``trace`` records (``eval.traces.format.trace_render``); ``ValueError`` when
    ``wanted`` (``--render``) says otherwise."""
    from eval.traces import read_trace
    from eval.traces.format import trace_render

    recorded = trace_render(read_trace(trace))
    if wanted is not None and recorded != wanted:
        raise ValueError(f"--render {wanted}: {trace} was rendered {recorded!r}")
    return recorded


def bench(trace_path: Path, out: Path, arms: list[Arm], concurrency: int | list[int], model_dir: Path,
          run: str = "bench", resume: bool = False) -> dict:
    """Every arm at every concurrency, one server at a time; one table per concurrency (ratios to
    that concurrency's radix arm). With ``resume``, arms an earlier run finished are not served again."""
    from eval.traces import read_trace
    from eval.traces.format import trace_render

    calls = read_trace(trace_path)
    render = trace_render(calls)
    edited = trace_edited(calls)
    concurrencies = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    swept = sweep(arms, concurrencies)
    causes = classify(calls)
    trace_sha = file_digest(trace_path)
    started = time.monotonic()
    results, edited_by_arm = _serve_arms(swept, calls, causes, out, model_dir, run, trace_sha, resume, edited)
    questions = len({c.conversation for c in calls})
    texts, compared_all = [], {}
    for c in concurrencies:
        group = [a for a in swept if a.concurrency == c]
        base = baseline(group)
        folder = out / ("compare" if len(concurrencies) == 1 else f"compare-c{c}")
        compared_all[c], text = _compare_group(group, base, out, folder, results, edited_by_arm, questions,
                                               len(edited), render)
        texts.append(f"### concurrency {c}\n\n" + text)
    sensitivity = radix_sensitivity(calls)
    wall = time.monotonic() - started
    text = "\n\n".join(texts) + _footer(sensitivity, wall, swept, results)
    (out / "table.md").write_text(text + "\n")
    summary = {"trace": str(trace_path), "render": render, "calls": len(calls), "questions": questions, "edited_calls": len(edited),
               "wall_s": round(wall, 1),
               "arms": [{"name": a.name, "policy": a.policy, "settings": dict(a.settings), "concurrency": a.concurrency}
                        for a in swept],
               "results": results, "edited_shares": edited_by_arm, "radix_sensitivity": sensitivity,
               "tables": {c: compared["table"] for c, compared in compared_all.items()}}
    (out / "bench.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(text)
    print(f"-> {out / 'table.md'}")
    return summary


def _serve_arms(swept: list[Arm], calls, causes, out: Path, model_dir: Path, run: str, trace_sha: str, resume: bool,
                edited: set[str]) -> tuple[dict[str, dict], dict[str, dict]]:
    """Step 1: serve and replay each arm (``run_arm``), then read its report: {arm: result} with the
    causes of moved and read tokens (and scr's relocation bound and sessions), {arm: edited shares}."""
    from eval.accounting.compare import read_run

    results, edited_by_arm = {}, {}
    for arm in swept:
        print(f"{PROG}: {arm.name} ({arm.describe()}, concurrency {arm.concurrency}): serving and replaying "
              f"{len(calls)} calls", file=sys.stderr, flush=True)
        results[arm.name] = run_arm(arm, model_dir, calls, out / arm.name, arm.concurrency, run,
                                    trace_sha, resume)
        rows, _ = read_run(out / arm.name / "report")
        edited_by_arm[arm.name] = edited_shares(rows, edited, run)
        results[arm.name]["causes"] = attribute(rows, causes, run)
        if arm.policy == "scr":
            results[arm.name].update(_scr_use(out / arm.name / "server.log", calls, rows, run))
    return results, edited_by_arm


def _scr_use(log_path: Path, calls, rows: list[dict], run: str) -> dict:
    """From an scr arm's server log: how much of each relocation was read anyway, and which session served each call."""
    parsed = scr_log(log_path)
    by_rid = {r["rid"]: r for r in rows}
    blocks = {rid: [(s["stop"], s["relocated"]) for s in splices] for rid, splices in parsed.splices.items()}
    sessions = {rid: item["sid"] for rid, item in parsed.traces.items()}
    return {"relocation_read_bound": relocation_read_bound(calls, by_rid, blocks, run),
            "sessions": session_use(calls, sessions, by_rid, run)}


def _compare_group(group: list[Arm], base: Arm, out: Path, folder: Path, results: dict[str, dict], edited_by_arm: dict,
                   questions: int, edited: int, render: str) -> tuple[dict, str]:
    """Step 2: one concurrency's arms compared (``eval.report compare`` into ``folder``) and its text."""
    from eval.accounting.compare import compare

    compared = compare({a.name: out / a.name / "report" for a in group}, folder, baseline=base.name)
    text = (headline({a.name: results[a.name] for a in group}, compared["table"], edited_by_arm, questions, edited,
                     base.name, render) + "\n\n" + compared["markdown"])
    return compared, text


def _footer(sensitivity: dict[int, float], wall: float, swept: list[Arm], results: dict[str, dict]) -> str:
    """Step 3: the table's last lines: radix's sensitivity to the state spacing, the wall time."""
    text = "\n\nradix prefix share by recurrent-state spacing (offline estimate, no_buffer): " + \
        ", ".join(f"{chunk}: {share:.1%}" for chunk, share in sensitivity.items())
    reused = [a.name for a in swept if results[a.name].get("reused")]
    text += f"\n\nbenchmark wall time: {wall:.0f} s for {len(swept)} arm runs (one server at a time)"
    served = sum(results[a.name]["replay_s"] for a in swept)
    text += f"; replays {served:.0f} s in all" + (f" ({', '.join(reused)} reused from an earlier run: --resume)"
                                                   if reused else "")
    return text


DESCRIPTION = (
    "The three cache policies on the same agent trace, side by side. Per policy, one server after the "
    "other: serve the long-context tiny model, replay the trace with forced decoding (eval.replay), ingest "
    "its events with every check (eval.report ingest); then compare (eval.report compare) and add the shares "
    "over the trace's edited calls, PFLOPs per question and the wall-time ratio. The tiny model is random: the "
    "numbers measure the cache machinery, not the real model; PFLOPs use Qwen3.6-27B's geometry. Details: "
    "eval/bench_policies.py.")


def build_parser():
    from eval.cli_types import Parser, existing_dir, existing_file, int_at_least, name_list
    from eval.render import RENDERINGS

    parser = Parser(prog=PROG, description=DESCRIPTION + "\n\nExit status: 0 every check passed, "
                    "1 a check failed (or exact's reuse differed from its prediction), 2 a usage error.")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench", metavar="DIR", help="output folder")
    parser.add_argument("--trace", type=existing_file, default=None, metavar="FILE",
                        help="trace to replay (default: generate the BCP-shaped set with eval.traces synth)")
    parser.add_argument("--questions", type=int_at_least(1), default=DEFAULT_QUESTIONS, metavar="N",
                        help="questions of the generated set")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="S", help="seed of the generated set")
    parser.add_argument("--render", choices=RENDERINGS, default=None,
                        help="how the generated set renders earlier turns (eval/render.py): default strips an "
                        "assistant turn's reasoning once a user turn follows, preserve keeps it "
                        "(preserve_thinking=true); unset: default, or with --trace what the trace records "
                        "(a --render that differs from it is refused)")
    parser.add_argument("--policies", type=name_list(POLICIES), default=None, metavar="LIST",
                        help="comma-separated policies, each with its defaults (shorthand for --arm P=P ...)")
    parser.add_argument("--arm", action="append", default=None, metavar="NAME=POLICY[:KEY=VALUE,...]",
                        help="an arm: a name, a policy and its settings (--cache-policy-set keys), repeatable; "
                        "default: radix, exact and scr with their defaults (eval/arms.py)")
    parser.add_argument("--concurrency", default="4", metavar="N[,N...]",
                        help="conversations in flight; a list (1,4) runs every arm at each (default 4)")
    parser.add_argument("--serving-profile", default=SERVING_PROFILE_DEFAULT, choices=list(PROFILES), metavar="NAME",
                        help="the SGLang settings every arm shares (serving/profile.py: matched, matched-graphs, "
                        f"none; default {SERVING_PROFILE_DEFAULT})")
    parser.add_argument("--resume", action="store_true",
                        help="do not serve again an arm whose folder holds a finished result measured on the same "
                        "trace with the same server arguments and every check passed")
    parser.add_argument("--model", type=existing_dir, default=None, metavar="DIR",
                        help="model directory (default: the long-context tiny model, built once under .artifacts)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from eval.render import DEFAULT

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.policies and args.arm:
        parser.error("give --policies or --arm, not both")
    try:
        arms = parse_arms(args.arm or ([f"{p}={p}" for p in args.policies] if args.policies else None))
        arms = with_profile(arms, args.serving_profile)
        concurrencies = parse_concurrency(args.concurrency)
    except ArmError as exc:
        parser.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.trace
    if trace is None:
        trace = default_trace_path(args.out, args.questions, args.seed, args.render or DEFAULT)
        if not trace.exists():
            synth_default(trace, args.questions, args.seed, render=args.render or DEFAULT)
    try:
        trace_rendering(trace, args.render)
    except ValueError as exc:
        parser.error(str(exc))
    model_dir = args.model or default_model(trace)
    summary = bench(trace, args.out, arms, concurrencies, model_dir, resume=args.resume)
    failed = any(r["checks_failed"] or r.get("exact_prediction", {}).get("share", 1.0) < 1.0
                 for r in summary["results"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
