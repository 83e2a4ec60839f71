"""The soak's checks as plain functions over what it recorded: request records, events (dicts of
``--cache-events`` lines) and server log lines. Each returns a ``Check``."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Sequence

from eval.server import FATAL_MARKERS
from scr.authors_log import parse_line

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
# FATAL_MARKERS plus SGLang's scheduler crash line and its idle pool checks (strict: they raise).
LEAK_MARKERS = ("memory leak detected", "KV double free", "KV page use-after-free")
SOAK_FATAL_MARKERS = tuple(dict.fromkeys((*FATAL_MARKERS, "Scheduler hit an exception", *LEAK_MARKERS)))
MAX_OFFENDERS = 20


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""
    offenders: list[str] = field(default_factory=list)
    count: int = 0  # offenders in all (``offenders`` keeps the first MAX_OFFENDERS)

    @classmethod
    def of(cls, name: str, offenders: Sequence[str], detail: str = "") -> "Check":
        return cls(name, FAIL if offenders else PASS, detail, list(offenders[:MAX_OFFENDERS]), len(offenders))

    @classmethod
    def skipped(cls, name: str, why: str) -> "Check":
        return cls(name, SKIPPED, why)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- events


def parse_events(text: str) -> list[dict]:
    """``--cache-events`` lines as dicts; a half-written last line (no newline yet) is skipped."""
    lines = text.split("\n")
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # the writer is mid-line
                continue
            raise ValueError(f"events line {number} is not JSON: {line[:120]!r}") from None
    return out


def run_events(events: Iterable[dict], prefix: str) -> dict[str, dict]:
    """The events of this run (rid starts with ``prefix``) by rid; a rid seen twice keeps the last."""
    return {e["rid"]: e for e in events if str(e.get("rid", "")).startswith(prefix)}


def check_event_identity(events: Mapping[str, dict], expected: Iterable[str], policy: str | None) -> Check:
    """prompt = prefix_reused + moved + read, every part >= 0, for each event of the run; an event for
    each rid in ``expected`` (well-formed requests the server answered); moved = 0 unless scr."""
    offenders = []
    for rid, e in events.items():
        try:
            prompt, reused, moved, read = (int(e[k]) for k in ("prompt_tokens", "prefix_reused", "moved", "read"))
        except (KeyError, TypeError, ValueError):
            offenders.append(f"{rid}: event lacks integer prompt_tokens/prefix_reused/moved/read")
            continue
        if reused + moved + read != prompt:
            offenders.append(f"{rid}: prompt {prompt} != reused {reused} + moved {moved} + read {read}")
        if min(prompt, reused, moved, read) < 0:
            offenders.append(f"{rid}: negative count (prompt {prompt}, reused {reused}, moved {moved}, read {read})")
        if policy in ("radix", "exact") and moved != 0:
            offenders.append(f"{rid}: moved {moved} under {policy}")
    missing = [rid for rid in expected if rid not in events]
    offenders += [f"{rid}: answered but no event" for rid in missing]
    return Check.of("event_identity", offenders, f"{len(events)} events, {len(missing)} missing")


# ----------------------------------------------------------------------------- isolation


def check_isolation(probes: Sequence[dict], events: Mapping[str, dict] | None,
                    salts: Mapping[str, str] | None = None) -> Check:
    """Fresh-salt replays reuse and move nothing (response ``cached_tokens`` and the event); every
    event of the run records the salt its request was sent with (``salts``: rid -> salt sent).

    ``probes``: records with ``rid``, ``status``, ``cached_tokens``, ``source_rid`` (the replayed
    request)."""
    offenders = []
    answered = 0
    for p in probes:
        rid = p["rid"]
        if p.get("status") != 200:
            offenders.append(f"{rid}: probe got {p.get('status') or p.get('error')}")
            continue
        answered += 1
        if p.get("cached_tokens"):
            offenders.append(f"{rid} (replay of {p.get('source_rid')}): cached_tokens {p['cached_tokens']}")
        if events is not None:
            e = events.get(rid)
            if e is None:
                offenders.append(f"{rid}: no event")
            elif e.get("prefix_reused") or e.get("moved"):
                offenders.append(f"{rid} (replay of {p.get('source_rid')}): event prefix_reused "
                                 f"{e.get('prefix_reused')} moved {e.get('moved')}")
    if events is not None and salts:
        for rid, e in events.items():
            if rid in salts and e.get("cache_salt") != salts[rid]:
                offenders.append(f"{rid}: event cache_salt {e.get('cache_salt')!r} != sent {salts[rid]!r}")
    if not probes:
        return Check("isolation", FAIL, "no fresh-salt replay was sent", ["no probes"], 1)
    return Check.of("isolation", offenders, f"{answered} fresh-salt replays")


def _kvreuse_text(line: str) -> str | None:
    at = line.find("[kvreuse]")
    return line[at:] if at >= 0 else None


def scr_session_lines(lines: Iterable[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(``kv6trace ev=req`` (rid, sid) in log order, ``v6 splice OK`` (rid, sid) in log order)."""
    traces, splices = [], []
    for line in lines:
        text = _kvreuse_text(line)
        if text is None or ("ev=req" not in text and "splice OK" not in text):
            continue
        parsed = parse_line(text)
        if parsed is None:
            continue
        if parsed["kind"] == "trace_req":
            traces.append((str(parsed["rid"]), str(parsed["sid"])))
        elif parsed["kind"] == "splice_ok":
            splices.append((str(parsed["rid"]), str(parsed["sid"])))
    return traces, splices


def check_scr_sessions(lines: Iterable[str], salts: Mapping[str, str]) -> Check:
    """No rid spliced rows from a session created under another salt, and no session served two salts.

    A session's creator is the first ``ev=req`` rid that names its sid. ``salts``: rid -> salt sent
    (this run's requests); a splice or session of a rid the soak did not send is not judged, but
    a splice of ours into a session created by a request it cannot place is an offender."""
    traces, splices = scr_session_lines(lines)
    creator: dict[str, str] = {}
    sid_salts: dict[str, set] = defaultdict(set)
    for rid, sid in traces:
        creator.setdefault(sid, rid)
        if rid in salts:
            sid_salts[sid].add(salts[rid])
    offenders = [f"session {sid} served salts {sorted(s)}" for sid, s in sid_salts.items() if len(s) > 1]
    ours = 0
    for rid, sid in splices:
        if rid not in salts:
            continue
        ours += 1
        made_by = creator.get(sid)
        if made_by is None or made_by not in salts:
            offenders.append(f"{rid}: spliced from session {sid} created by "
                             f"{made_by or 'no ev=req line'} (not a request of this run)")
        elif salts[made_by] != salts[rid]:
            offenders.append(f"{rid} (salt {salts[rid]}): spliced from session {sid} created by {made_by} "
                             f"(salt {salts[made_by]})")
    return Check.of("scr_sessions", offenders,
                    f"{ours} splices, {len(sid_salts)} sessions, {len(traces)} ev=req lines")


# ----------------------------------------------------------------------------- exact


def first_difference(a: Sequence, b: Sequence) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_exact_pairs(pairs: Sequence[dict], wanted: int) -> Check:
    """Each pair: ``warm`` and ``cold`` records (``output_ids``, ``logprobs``, ``cached_tokens``,
    ``status``) of one prompt; warm must be a cache hit, cold a miss, and both equal bit for bit."""
    offenders = []
    hits = equal = 0
    for pair in pairs:
        warm, cold, rid = pair["warm"], pair["cold"], pair["source_rid"]
        if warm.get("status") != 200 or cold.get("status") != 200:
            offenders.append(f"{rid}: warm {warm.get('status') or warm.get('error')}, "
                             f"cold {cold.get('status') or cold.get('error')}")
            continue
        if not warm.get("cached_tokens"):
            offenders.append(f"{rid}: the warm re-send reused nothing (no cache hit to compare)")
            continue
        hits += 1
        if cold.get("cached_tokens"):
            offenders.append(f"{rid}: the cold read under a fresh salt reused {cold['cached_tokens']} tokens")
            continue
        ids_at = first_difference(warm["output_ids"], cold["output_ids"])
        lp_at = first_difference(warm["logprobs"], cold["logprobs"])
        if ids_at is not None:
            offenders.append(f"{rid}: output ids differ at {ids_at} (warm reused {warm['cached_tokens']})")
        elif lp_at is not None:
            offenders.append(f"{rid}: logprob {lp_at} differs: warm {warm['logprobs'][lp_at]!r} "
                             f"cold {cold['logprobs'][lp_at]!r} (warm reused {warm['cached_tokens']})")
        else:
            equal += 1
    # Fewer prompts than asked (a short run answers few) is no evidence against exactness; none is.
    if not pairs and wanted:
        offenders.append(f"none of {wanted} prompts could be sampled")
    short = f"; {len(pairs)} of {wanted} asked could be sampled" if len(pairs) < wanted else ""
    return Check.of("exact_equality", offenders, f"{equal} of {len(pairs)} cached answers equal a cold read "
                                                 f"({hits} hits){short}")


# ----------------------------------------------------------------------------- responses


def check_malformed(records: Sequence[dict]) -> Check:
    """Every malformed request answered with a 4xx."""
    offenders = [f"{r['rid']} ({r['malformed']}): {r.get('status') or r.get('error')}"
                 for r in records if not (isinstance(r.get("status"), int) and 400 <= r["status"] < 500)]
    kinds = sorted({r["malformed"] for r in records})
    if not records:
        return Check.skipped("malformed_4xx", "no malformed request sent")
    return Check.of("malformed_4xx", offenders, f"{len(records) - len(offenders)} of {len(records)} got a 4xx "
                                                f"({len(kinds)} kinds)")


def check_wellformed(records: Sequence[dict]) -> Check:
    """Well-formed requests not aborted by the soak: a 200 with a finished (not aborted) answer.
    Aborted ones: anything but a 5xx (a 200, the client's own disconnect or timeout), and a 200
    from ``/abort_request`` where it was used."""
    offenders = []
    for r in records:
        status = r.get("status")
        if r.get("abort"):
            if isinstance(status, int) and status >= 500:
                offenders.append(f"{r['rid']} (aborted by {r['abort']}): {status}")
            if r.get("abort_status", 200) != 200:
                offenders.append(f"{r['rid']}: /abort_request answered {r['abort_status']}")
            continue
        if status != 200:
            offenders.append(f"{r['rid']}: {status or r.get('error')}")
        elif r.get("error"):
            offenders.append(f"{r['rid']}: {r['error']}")
        elif r.get("finish_reason") == "abort":
            offenders.append(f"{r['rid']}: answered with finish_reason abort ({r.get('finish_message') or ''})")
    return Check.of("wellformed_ok", offenders, f"{len(records)} well-formed requests")


def latency_offenders(trivial_failed: int, ratio: float, max_ratio: float | None, beside: str,
                      versus: str = "their usual latency") -> list[str]:
    """Trivial requests that got no 200, and a latency ratio over ``max_ratio`` (None: the ratio is
    measured and reported, not judged, as in the tests, which may not depend on the machine's speed)."""
    offenders = [f"{trivial_failed} trivial requests got no 200"] if trivial_failed else []
    if max_ratio is not None and not ratio <= max_ratio:
        offenders.append(f"trivial requests {beside} took {ratio}x {versus} (at most {max_ratio}x)")
    return offenders


def ratio_shown(ratio: float, max_ratio: float | None) -> str:
    return f"{ratio}x" if max_ratio is not None else f"{ratio}x, not judged"


def check_fatal_lines(lines: Sequence[str], markers: Sequence[str] = SOAK_FATAL_MARKERS) -> Check:
    found = [line.strip()[:300] for line in lines if any(m in line for m in markers)]
    return Check.of("log_fatal", found, f"{len(lines)} log lines of this run")


def check_idle_leak(flush_tries: int | None, idle_s: float, lines: Sequence[str] | None) -> Check:
    """``/flush_cache`` accepted (``flush_tries`` = tries it took, None = never), then no leak marker
    of SGLang's idle pool check in the log (``lines``: the run's log after the idle wait; None = no log)."""
    offenders = []
    if flush_tries is None:
        offenders.append("/flush_cache was never accepted")
    if lines is not None:
        offenders += [line.strip()[:300] for line in lines if any(m in line for m in LEAK_MARKERS)]
    detail = (f"flush accepted after {flush_tries} tries, {idle_s:g} s idle" if flush_tries is not None
              else "flush refused")
    if lines is None:
        check = Check.of("idle_leak", offenders, detail + "; no --log, leak marker not checked")
        return check
    return Check.of("idle_leak", offenders, detail + "; log checked for " + ", ".join(LEAK_MARKERS))
