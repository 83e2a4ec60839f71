"""exact after a fault: a prompt read warm (from whatever the server kept) equals a cold read, bit for bit.

For a few calls served after the restart (or after the kill, behind the router), the server that
served the call reads its prompt three more times, greedy: once to put it back in the cache (the
shrunk pool of the ``alone`` scenario has evicted it by then: measured, every warm read reused
nothing without this), then ``PROBE_TOKENS`` tokens with logprobs as it is (a warm read resumes
from the state kept at the prompt's end) and under a fresh cache namespace (``extra_key``: nothing
to reuse, a cold read). Token ids and every logprob
must be equal as numbers (the served JSON floats), not close. The forced calls of the trace cannot
show this themselves: their outputs are forced, whatever the logits.
"""

from __future__ import annotations

from eval import http
from eval.server import output_record

PROBE_TOKENS = 8
PROBES = 3


def probe_payload(call, rid: str, salt: str | None, tokens: int = PROBE_TOKENS) -> dict:
    payload = {"input_ids": list(call.prompt_ids), "rid": rid, "return_logprob": True,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}}
    if salt is not None:
        payload["extra_key"] = salt
    return payload


def compare(warm: dict, cold: dict) -> list[str]:
    """What differs between two ``output_record``s (ids, logprobs); [] when bit-identical."""
    problems = []
    if warm["output_ids"] != cold["output_ids"]:
        problems.append(f"ids {warm['output_ids']} != {cold['output_ids']}")
    if warm["logprobs"] != cold["logprobs"]:
        diffs = [i for i, (a, b) in enumerate(zip(warm["logprobs"], cold["logprobs"])) if a != b]
        problems.append(f"logprobs differ at {diffs[:5]}")
    return problems


def probe_exact(urls: dict[str, str], calls, run: str, via: dict[str, str | None] | None = None,
                probes: int = PROBES) -> list[dict]:
    """Warm against cold on the server that served each of the last ``probes`` calls."""
    results = []
    for index, call in enumerate(list(calls)[-probes:]):
        rid = call.rid(run)
        name = (via or {}).get(rid) or next(iter(urls))
        url = urls[name]
        http.post_json(url + "/generate", probe_payload(call, f"probe-fill-{index}", None, 1), 600)
        warm = output_record(http.post_json(url + "/generate", probe_payload(call, f"probe-warm-{index}", None), 600))
        cold = output_record(http.post_json(url + "/generate", probe_payload(call, f"probe-cold-{index}",
                                                                            f"chaos-cold-{index}"), 600))
        results.append({"rid": rid, "server": name, "warm_cached": warm["cached_tokens"],
                        "cold_cached": cold["cached_tokens"], "problems": compare(warm, cold)})
    return results
