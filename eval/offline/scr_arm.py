"""scr offline: what the served SCR policy reuses, moves and reads for each call of a trace.

The served policy's own pure pieces make every decision, in the order the calls arrive
(``arrival.py``): ``scr.policy.ScrPolicy.admit`` (the session table, content matching or a named
identity, the diff and the block plan, ``scr.intercept``), the state gate
(``scr.execution.plan_gate``), the relocation cursor and its refusals (``scr.cursor``,
``scr.execution.relocation_refusal``), the recurrent-state snapshot and the side-buffer store at
release (``ScrPolicy.snapshot_slot`` / ``store_turn``). Around them, the radix tree is the offline
model of ``eval.traces.tree_model`` (SGLang's ``no_buffer`` states at every forward end), filled as
the served request fills it::

    prompt |0 .. tree_hit|tree_hit .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| .. end|
            prefix         read (phase 1)    no state here   read                  moved   read

A relocated request leaves states at the ends of its read forwards (512-token chunks from the
start of each read span, the span's end included), at the prompt's end and at prompt +
completion[:-1]; none inside moved rows, whose recurrent state was never computed. With
``relocated_in_tree=0`` it leaves only phase 1's states, up to the first stop.

Not modelled (the served numbers say how much they matter): a plan dropped because another
request holds the chunked-prefill slot (``splice_retry`` passes), allocation failures, eviction,
retraction; a snapshot is taken at the end of every call's prefill that decodes more than one
token and whose session can hold a side slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.traces.tree_model import StateIndex, as_ids, chunk_ends, prefix_hashes, sequence_of
from scr.cursor import RelocationCursor
from scr.execution import RelocationProgress, blocks_of, plan_gate, relocation_plan, relocation_refusal
from scr.policy import ScrPolicy
from scr.settings import ScrConfig

CHUNK = 512  # --chunked-prefill-size of the served scr arm (the SCR authors' serving script)
RUN = "offline"  # rid prefix: <run>.<conversation>.<turn>, as the replay names calls


@dataclass
class CallCost:
    """What one call reused from the tree (``prefix``), moved, and read (``spans``, prompt positions)."""

    prefix: int
    moved: int
    spans: list[tuple[int, int]]
    session: str | None = None
    kind: str = ""

    @property
    def read(self) -> int:
        return sum(end - start for start, end in self.spans)


def executed_blocks(outcome, tree_hit: int, prompt_len: int, has_shadow: bool) -> list:
    """The blocks the served request relocates: the plan, if the state gate allows it and the tree
    match does not pass the leading equal run, run block by block until a refusal."""
    if outcome.kind != "plan" or not outcome.blocks:
        return []
    progress = RelocationProgress(outcome.sid, outcome)
    progress.gate = plan_gate(outcome, True, has_shadow)
    plan = relocation_plan(RUN, outcome, prompt_len)
    relocations = plan.relocations()
    cursor = RelocationCursor(blocks_of(relocations, outcome.config.min_extend), plan.resume_limit,
                              outcome.config.splice_retry, progress.gate.restore and relocations[0][1])
    if cursor.decide(tree_hit, False, progress.gate.allow).action not in ("phase1", "relocate_now"):
        return []
    done = []
    while True:
        step = cursor.at_prefix(cursor.stop)
        if relocation_refusal(step.block.num_rows, outcome.side_slot, prompt_len, cursor.stop, step.arm_restore,
                              has_shadow) is not None:
            return done
        done.append(step.block)
        if cursor.after_relocation().stop is None:
            return done


def read_spans(tree_hit: int, blocks, prompt_len: int) -> list[tuple[int, int]]:
    """The prompt stretches read around the relocated blocks."""
    spans, at = [], tree_hit
    for block in blocks:
        spans.append((at, block.new_start))
        at = block.new_start + block.num_rows
    spans.append((at, prompt_len))
    return [(a, b) for a, b in spans if b > a]


def states_left(spans, blocks, prompt_len: int, sequence_len: int, in_tree: bool, chunk: int) -> list[int]:
    """Where the request leaves recurrent states in the tree (module docstring)."""
    if blocks and not in_tree:
        first = [s for s in spans if s[1] <= blocks[0].new_start]
        return sorted({p for a, b in first for p in chunk_ends(a, b, chunk)})
    ends = {p for a, b in spans for p in chunk_ends(a, b, chunk)} | {prompt_len, sequence_len}
    return sorted(p for p in ends if p > 0)


class OfflineScr:
    """One scr server, offline: its policy object and its tree."""

    def __init__(self, config: ScrConfig, chunk: int = CHUNK):
        self.config, self.chunk = config, chunk
        self.policy = ScrPolicy(config)
        self.index = StateIndex()

    def serve(self, call) -> CallCost:
        prompt = as_ids(call.prompt_ids)
        tree_hit = self.index.longest(call.cache_salt, prompt, prefix_hashes(prompt), len(prompt) - 1)
        outcome = self.policy.admit(call.prompt_ids, call.cache_salt, call.rid(RUN), f"{RUN}.{call.conversation}")
        blocks = executed_blocks(outcome, tree_hit, len(prompt), self.config.ssm)
        spans = read_spans(tree_hit, blocks, len(prompt))
        sequence = sequence_of(call)
        self.index.add(call.cache_salt, sequence, prefix_hashes(sequence),
                       states_left(spans, blocks, len(prompt), len(sequence), self.config.relocated_in_tree, self.chunk))
        self.release(outcome.sid, call, len(prompt))
        return CallCost(tree_hit, sum(b.num_rows for b in blocks), spans, outcome.sid, outcome.kind)

    def release(self, sid: str | None, call, prompt_len: int) -> None:
        """The prefill-end snapshot (a call that goes on decoding) and the side-buffer store."""
        if sid is None:
            return
        if len(call.completion_ids) > 1:
            slot, _ = self.policy.snapshot_slot(sid)
            if slot is not None:
                self.policy.snapshot_taken(sid, prompt_len)
        else:
            self.policy.drop_state(sid)
        committed = list(call.prompt_ids) + list(call.completion_ids[:-1])
        self.policy.store_turn(sid, committed)


def scr_costs(calls, config: ScrConfig, chunk: int = CHUNK) -> list[CallCost]:
    """Every call's cost under one scr server, ``calls`` in arrival order."""
    server = OfflineScr(config, chunk)
    return [server.serve(call) for call in calls]
