"""scr with CUDA graphs on: an edited second turn relocates its surviving rows, with no fallback.

The conversation of the engine tests: a 2,400-token first turn, then a second that deletes
[1400, 1600) and appends 40 tokens. The rows after the deletion must move by −200 (re-rotated,
``phase2 rot_delta=-200``), spliced without any of the runtime's fall-back paths, and the request's
event must count them (``moved`` > 0, ``fallback`` null). Served under ``--serving-profile
matched-graphs`` so that decode runs CUDA graphs (the per-step decode log must say ``cuda graph:
True`` after the relocation); on CPU there are no graphs and that part is skipped.
"""

from __future__ import annotations

from eval.gpu_check import servers
from eval.gpu_check.exact_cases import prompt_ids
from eval.gpu_check.report import Checks
from eval.server import output_record, wait_for_events
from scr.authors_log import parse_line

PROFILE = "matched-graphs"
SCR_ARGS = ["--chunked-prefill-size", "256", "--cache-policy-set", "side_sessions=16",
            "--cache-policy-set", "side_tokens=4096", "--decode-log-interval", "1"]
GRAPH_ARGS = ["--cuda-graph-max-bs-decode", "8"]  # capture a few batch sizes, not SGLang's default list
# Lines of the runtime's fall-back paths (scr/authors_log.py): none may appear.
FALLBACK_KINDS = ("phase1_aborted", "phase2_mismatch", "alloc_failed", "slot_stolen", "multiblock_drop")
DECODE = 8


def log_records(text: str) -> list[dict]:
    """The SCR runtime's lines of a server log, parsed (timestamps dropped)."""
    out = []
    for line in text.splitlines():
        line = line.split("] ", 1)[1] if line.startswith("[20") and "] " in line else line
        parsed = parse_line(line) if line.startswith(("[kvreuse", "[scr]")) else None
        if parsed:
            out.append(parsed)
    return out


def turns() -> list[list[int]]:
    first = prompt_ids(11, 2400)
    return [first, first[:1400] + first[1600:] + prompt_ids(12, 40)]


def run(ctx):
    checks = Checks()
    served = _serve_two_turns(ctx, checks)
    records = log_records(served["log"])
    init = [r for r in records if r["kind"] == "init"]
    checks.expect(bool(init) and all(r["rotary"] for r in init), f"the runtime re-rotates keys (init rotary={[r['rotary'] for r in init]})")
    event1, event2 = served["events"].get("scr.1"), served["events"].get("scr.2")
    if not checks.expect(event1 is not None and event2 is not None, "both turns have an event"):
        return checks.result("scr")
    checks.expect(event1["moved"] == 0, f"turn 1 is a cold session (moved {event1['moved']})")
    _check_relocation(checks, event2, served["two"], records)
    flags_after = servers.graph_flags(served["log"][served["before_turn_2"]:served["after_turn_2"]])
    if ctx.cuda:
        checks.expect(any(flags_after), f"turn 2 decoded on CUDA graphs ({flags_after.count(True)} of "
                                        f"{len(flags_after)} of its decode steps)")
    checks.note("turn_2_graph_steps", [flags_after.count(True), len(flags_after)])
    two, cold = served["two"], served["cold"]
    deltas_lp = [abs(a - b) for a, b in zip(two["logprobs"], cold["logprobs"])]
    checks.note("relocated_vs_full_read", {"ids_equal": two["output_ids"] == cold["output_ids"],
                                           "max_delta_logprob": max(deltas_lp) if deltas_lp else None,
                                           "cold_cached_tokens": cold["cached_tokens"]})
    graphs = "" if ctx.cuda else " (CPU: no CUDA graphs to check)"
    return checks.result("scr", f"turn 2 moved {event2['moved']} rows (Δ -200), reused {event2['prefix_reused']}, "
                                f"read {event2['read']}, no fallback{graphs}")


def _serve_two_turns(ctx, checks: Checks) -> dict:
    """One scr server: the two turns, their events, the second prompt read cold in another
    namespace, the log (and where turn 2's lines are in it)."""
    events_path = ctx.out / "scr-events.jsonl"
    args = ["--cache-policy", "scr", "--serving-profile", PROFILE, "--cache-events", str(events_path),
            *SCR_ARGS, *(GRAPH_ARGS if ctx.cuda else [])]
    first, second = turns()
    with servers.serving(ctx, "scr", args, total_tokens=12288, running=4) as server:
        servers.check_profile(checks, servers.server_info(server), PROFILE, ctx.cuda)
        one = output_record(server.generate(first, DECODE, rid="scr.1"))
        before_turn_2 = len(server.log_text())
        two = output_record(server.generate(second, DECODE, rid="scr.2"))
        after_turn_2 = len(server.log_text())
        events = wait_for_events(events_path, ["scr.1", "scr.2"])
        # The same prompt in a namespace with no session: read in full, for comparison only.
        cold = output_record(server.generate(second, DECODE, rid="scr.cold", extra_key="gpu-check-cold"))
        log = server.log_text()
        servers.check_clean_log(checks, server)
    return {"one": one, "two": two, "cold": cold, "events": events, "log": log,
            "before_turn_2": before_turn_2, "after_turn_2": after_turn_2}


def _check_relocation(checks: Checks, event2: dict, two: dict, records: list[dict]) -> None:
    """Turn 2 relocated, without a fallback, by -200, and its counts agree with SGLang's and the log's."""
    checks.expect(event2["moved"] > 0 and event2["blocks"] >= 1,
                  f"turn 2 relocated {event2['moved']} rows in {event2['blocks']} block(s)")
    checks.expect(event2.get("fallback") is None, f"turn 2 had no fallback ({event2.get('fallback')})")
    checks.expect(event2["prefix_reused"] + event2["moved"] + event2["read"] == event2["prompt_tokens"],
                  f"turn 2's counts add up: {event2['prefix_reused']} + {event2['moved']} + {event2['read']} "
                  f"= {event2['prompt_tokens']}")
    checks.expect(two["cached_tokens"] == event2["prefix_reused"] + 2 * event2["moved"],
                  f"SGLang's cached_tokens {two['cached_tokens']} = reused + 2 x moved (docs/scr.md §7.5)")
    splices = [r for r in records if r["kind"] == "splice_ok" and r.get("rid") == "scr.2"]
    checks.expect(bool(splices) and sum(s["relocated"] for s in splices) == event2["moved"],
                  f"splice lines relocate {sum(s['relocated'] for s in splices)} rows = moved {event2['moved']}")
    deltas = [r["rot_delta"] for r in records if r["kind"] == "phase2" and r.get("rid") == "scr.2"]
    checks.expect(deltas[:1] == [-200], f"the relocated rows were re-rotated by -200 (phase2 rot_delta {deltas})")
    fallbacks = [r["kind"] for r in records if r["kind"] in FALLBACK_KINDS]
    checks.expect(not fallbacks, f"no fall-back line in the log ({fallbacks})")
