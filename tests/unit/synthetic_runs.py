"""Synthetic runs with known ground truth, for the accounting tests (``docs/eval.md`` §5.6).

``simulate(policy, ...)`` plays editing conversations against a toy server: token sequences are
built from segments (system prompt shared by all conversations, user turns, replies); turns
append, or delete one or two segments from the middle of the context. The toy server matches
the longest cached prefix that ends at a state it keeps (every ``grid`` tokens inside an earlier
request and at its prompt end, as a hybrid model must), and under ``scr`` relocates the K largest
spans that survive an edit (difflib against the conversation's previous prompt, spans of 80+
tokens after the leading match, the last 16 of each forwarded). The run is written as the
server would write it: an events file, a server log (start-up lines, ``Receive:`` and
``Prefill batch`` noise, SCR's banner, trace and splice lines with running counters, and
``Finish:`` lines whose ``cached_tokens`` counts each relocated row twice under scr) and the
client's ``client.jsonl``. ``Run.truth`` holds what the accounting must recover.
"""

from __future__ import annotations

import difflib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from serving.event_writer import EventWriter
from policy.events import RequestEvent
from policy.tokens import common_prefix_len
from scr.authors_log import format_line

KEXT = 16  # tokens at the end of each relocated span that are forwarded (KVREUSE_V6_MIN_EXTEND)
MINTAIL = 64
GRID = {"radix": 64, "exact": 256, "scr": 64}
# The patched server's start line prints the resolved config as a dict.
CONFIG_TEXT = {
    "radix": lambda k: "{}",
    "exact": lambda k: "{'piece_tokens': 256, 'retain_every': 1024, 'spec_drop': False}",
    "scr": lambda k: "{'enabled': True, 'max_blocks': %d, 'splice_retry': 8, 'ssm_mode': 'fork'}" % k,
}


@dataclass(frozen=True)
class Truth:
    rid: str
    conversation: str
    klass: str
    prompt: int
    reused: int
    moved: int
    read: int
    decode: int
    blocks: tuple[tuple[int, int], ...]  # (stop, rows) per relocated block

    @property
    def cached(self) -> int:
        return self.reused + 2 * self.moved  # what SGLang's Finish line says under scr


@dataclass
class Run:
    policy: str
    max_blocks: int
    truth: list[Truth] = field(default_factory=list)
    log_lines: list[str] = field(default_factory=list)
    client: list[dict] = field(default_factory=list)

    def write(self, directory: Path) -> dict[str, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"log": directory / "server.log", "events": directory / "events.jsonl",
                 "client": directory / "client.jsonl"}
        paths["log"].write_text("\n".join(self.log_lines) + "\n")
        writer = EventWriter(str(paths["events"]))
        for t in self.truth:
            writer.write(RequestEvent(
                rid=t.rid, policy=self.policy, prompt_tokens=t.prompt, prefix_reused=t.reused, moved=t.moved,
                read=t.read, decode_tokens=t.decode, cache_salt=None, plan_resume=t.reused, finish_reason="length",
                queued_ts=1.0, finished_ts=2.0, blocks=len(t.blocks)))
        writer.close()
        paths["client"].write_text("".join(json.dumps(record) + "\n" for record in self.client))
        return paths


def finish_line(rid: str, prompt: int, cached: int, completion: int) -> str:
    """SGLang 0.5.16's request-logger line at level 0 (shortened ``obj=`` part)."""
    return (f"[2026-01-01 12:00:01] Finish: obj=GenerateReqInput(rid='{rid}', session_id=None, stream=False, "
            f"custom_labels={{'id': 'not-this'}}), out={{'meta_info': {{'id': '{rid}', 'finish_reason': "
            f"{{'type': 'length', 'length': {completion}}}, 'prompt_tokens': {prompt}, 'weight_version': 'default', "
            f"'num_retractions': 0, 'reasoning_tokens': 0, 'completion_tokens': {completion}, 'cached_tokens': "
            f"{cached}, 'cached_tokens_details': None, 'dp_rank': None, 'e2e_latency': 0.25}}}}")


class _Tokens:
    def __init__(self, rng: random.Random):
        self.rng, self.next = rng, 1000

    def segment(self, low: int, high: int) -> list[int]:
        n = self.rng.randrange(low, high)
        self.next += n
        return list(range(self.next - n, self.next))  # unique ids: no accidental matches


def _reuse(prompt: list[int], cache: list[tuple[list[int], int]], grid: int) -> int:
    """Deepest kept state on a cached sequence within the shared prefix (and before the last token)."""
    best = 0
    for sequence, prompt_end in cache:
        limit = min(common_prefix_len(sequence, prompt), len(prompt) - 1)
        states = [c for c in range(grid, len(sequence), grid)] + [prompt_end]
        best = max([best] + [c for c in states if c <= limit])
    return best


def _relocation(old: list[int], new: list[int], reused: int, k: int) -> list[tuple[int, int]]:
    """(stop, rows) per relocated block, left to right."""
    ops = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    if not ops or ops[0][0] != "equal" or ops[0][1] != 0 or ops[0][3] != 0:
        return []
    lead_end = ops[0][4]
    spans = [(j1, j2) for tag, i1, i2, j1, j2 in ops[1:] if tag == "equal" and j1 >= lead_end
             and j2 - j1 - KEXT >= MINTAIL and j1 >= reused]
    chosen = sorted(sorted(spans, key=lambda s: s[1] - s[0], reverse=True)[:k])
    return [(j1, j2 - KEXT - j1) for j1, j2 in chosen]


def simulate(policy: str, *, conversations: int = 4, turns: int = 6, seed: int = 0, max_blocks: int = 6,
             run_name: str = "syn") -> Run:
    rng = random.Random(seed)
    tokens = _Tokens(rng)
    system = tokens.segment(150, 200)
    run = Run(policy=policy, max_blocks=max_blocks)
    cache: list[tuple[list[int], int]] = []
    state = {c: {"segments": [system, tokens.segment(120, 300)], "previous": None} for c in range(conversations)}
    spliced = spliced_tokens = 0
    log = run.log_lines
    log += ["[2026-01-01 12:00:00] server_args=ServerArgs(model_path='tiny', ...)",
            f"[2026-01-01 12:00:00] cache policy {policy} started with config {CONFIG_TEXT[policy](max_blocks)}"]
    if policy == "scr":
        log.append("[2026-01-01 12:00:00 TP0] " + format_line(
            "scr_site", v6=True, pin_only=False, lead_freeze=False, ssm_snap="prefill_end", pid=7, no_rerotate=False,
            max_sessions=16, fastdiff=True, cdc_target=64, fastdiff_min=2048, timing=False, min_extend=KEXT,
            t6_guard=True, trace=True, evict_on_fail=True, evict_margin=2048, max_blocks=max_blocks, mb_min_gap=0,
            splice_retry=8))
    log.append("[2026-01-01 12:00:00] The server is fired up and ready to roll!")
    for turn in range(turns):
        for c in range(conversations):
            conv = state[c]
            kind = "first" if turn == 0 else ("edited" if turn % 3 == 0 else "append")
            if kind == "edited":
                middle = list(range(2, len(conv["segments"]) - 2))  # keep system, first user and the tail
                for index in sorted(rng.sample(middle, min(len(middle), rng.choice((1, 2)))), reverse=True):
                    del conv["segments"][index]
            if turn > 0:
                conv["segments"] += [tokens.segment(100, 160)]  # the next user message (>= 100 > slack)
            prompt = [t for segment in conv["segments"] for t in segment]
            decode = rng.randrange(8, 40)
            reused = _reuse(prompt, cache, GRID[policy])
            blocks = []
            if policy == "scr" and conv["previous"] is not None:
                blocks = _relocation(conv["previous"], prompt, reused, max_blocks)
            moved = sum(rows for _, rows in blocks)
            rid = f"{run_name}.c{c}.{turn}"
            run.truth.append(Truth(rid=rid, conversation=f"{run_name}.c{c}", klass=kind, prompt=len(prompt),
                                   reused=reused, moved=moved, read=len(prompt) - reused - moved, decode=decode,
                                   blocks=tuple(blocks)))
            log.append(f"[2026-01-01 12:00:01] Receive: obj=GenerateReqInput(rid='{rid}', text=None, ...)")
            if policy == "scr":
                log.append("[2026-01-01 12:00:01 TP0] " + format_line(
                    "trace_req", rid=rid, sid=f"s{c:06d}", slot=c, n_new=len(prompt),
                    n_old=len(conv["previous"]) if conv["previous"] else 0, nsess=conversations, tag="<|im_start|>"))
            log.append(f"[2026-01-01 12:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: {len(prompt) - reused}, "
                       f"#cached-token: {reused}, token usage: 0.01")
            for number, (stop, rows) in enumerate(blocks, 1):
                spliced, spliced_tokens = spliced + 1, spliced_tokens + rows
                log.append("[2026-01-01 12:00:01 TP0] " + format_line(
                    "splice_ok", rid=rid, sid=f"s{c:06d}", slot=c, stop=stop, relocated=rows,
                    extend=len(prompt) - stop - rows, live=len(prompt), spliced=spliced,
                    spliced_tokens=spliced_tokens, block=number, num_blocks=len(blocks)))
            log.append(finish_line(rid, len(prompt), run.truth[-1].cached if policy == "scr" else reused, decode))
            run.client.append({"rid": rid, "kind": kind, "seconds": 0.1, "usage": {
                "prompt_tokens": len(prompt), "completion_tokens": decode, "total_tokens": len(prompt) + decode}})
            reply = tokens.segment(decode, decode + 1)
            cache.append((prompt + reply, len(prompt)))
            conv["previous"] = prompt
            conv["segments"].append(reply)
    log.append("[2026-01-01 12:00:09] Finish: obj=GenerateReqInput(rid='cut-")  # a partial last line
    return run
