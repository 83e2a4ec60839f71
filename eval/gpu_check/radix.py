"""radix under the serving profile: a second turn hits the first turn's prefix, and the events
file holds the start-up record and one event per request.

SGLang's own prefix caching through the overlay, with the settings every arm of a comparison
gets (``--serving-profile matched``). On CUDA that means deterministic inference and the Triton
kernels, so this is also the first server to run them on the tiny model.
"""

from __future__ import annotations

from eval.gpu_check import servers
from eval.gpu_check.exact_cases import prompt_ids
from eval.gpu_check.report import Checks
from eval.server import output_record, request_events, wait_for_events
from policy.events import read_startups

PROFILE = "matched"
CHUNK = 128  # turn 1 (300 tokens) is read in forwards ending at 128, 256 and 300: recurrent states there
DECODE = 8


def run(ctx):
    checks = Checks()
    events_path = ctx.out / "radix-events.jsonl"
    args = ["--cache-policy", "radix", "--serving-profile", PROFILE, "--cache-events", str(events_path),
            "--chunked-prefill-size", str(CHUNK)]
    with servers.serving(ctx, "radix", args, total_tokens=8192) as server:
        servers.check_profile(checks, servers.server_info(server), PROFILE, ctx.cuda)
        first = prompt_ids(7, 300)
        one = output_record(server.generate(first, DECODE, rid="radix.1"))
        second = first + one["output_ids"] + prompt_ids(8, 50)
        two = output_record(server.generate(second, DECODE, rid="radix.2"))
        events = wait_for_events(events_path, ["radix.1", "radix.2"])
        servers.check_clean_log(checks, server)
    checks.note("cached_tokens", [one["cached_tokens"], two["cached_tokens"]])
    checks.expect(one["cached_tokens"] == 0, f"turn 1 reads everything (cached {one['cached_tokens']})")
    checks.expect(two["cached_tokens"] > 0,
                  f"turn 2 hits turn 1's prefix: cached {two['cached_tokens']} of {two['prompt_tokens']}")
    startups = read_startups(str(events_path))
    checks.expect(len(startups) == 1, f"one start-up record ({len(startups)})")
    if startups:
        record = startups[0]
        checks.expect(record.get("policy") == "radix" and record.get("serving_profile") == PROFILE,
                      f"start-up record: policy {record.get('policy')}, profile {record.get('serving_profile')}")
    rows = request_events(events_path)
    ours = [row for row in rows if row["rid"] in ("radix.1", "radix.2")]
    checks.note("event_lines", len(rows))
    checks.expect(sorted(row["rid"] for row in ours) == ["radix.1", "radix.2"],
                  f"one event per request ({[row['rid'] for row in ours]})")
    for rid, record in (("radix.1", one), ("radix.2", two)):
        event = events.get(rid)
        if not checks.expect(event is not None, f"{rid}: event written"):
            continue
        checks.expect(event["prefix_reused"] == record["cached_tokens"] and event["moved"] == 0
                      and event["read"] == event["prompt_tokens"] - event["prefix_reused"]
                      and event["prompt_tokens"] == record["prompt_tokens"] and event["decode_tokens"] == DECODE,
                      f"{rid}: event counts agree with the answer (reused {event['prefix_reused']}, "
                      f"read {event['read']}, decoded {event['decode_tokens']})")
    return checks.result("radix", f"turn 2 reused {two['cached_tokens']} of {two['prompt_tokens']} tokens; "
                                  f"{len(rows)} event lines + start-up record")
