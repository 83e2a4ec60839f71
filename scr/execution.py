"""The rules ``scr.runner`` asks while it executes a relocation plan (``docs/scr.md`` §7, §9, §10).

The runner (driven by ``patches/scr_runtime.py``, which gathers facts from SGLang objects: prefix
lengths, free slots, whether a state slot exists) asks the functions here and has the answer
carried out (allocate, copy rows, abort, write the event). Everything here is plain data, so each
rule has a table test (``tests/unit/test_scr_execution.py``) and is written once. For block i::

    prompt |0 .. radix_n0|radix_n0 .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| .. tail|
            from the tree  phase 1 (chunked)  relocate 1     phase 1 again        relocate 2 read

Phase 1 runs as SGLang's chunked request with the token array cut at the stop, so no token is
sampled there; the relocation happens on the chunked-request pass that finds the prefix exactly at
the stop. Where this port differs from the authors' code, and why:

* relocated rows never enter the shared radix tree (the authors' README design; their code
  inserts them): after the first relocation the request is marked ``skip_radix_cache_insert``, so the
  tree keeps what phase 1 read exactly (``[0, stop_1)``) and SGLang frees the request's own rows,
  relocated ones included, at release;
* the state restore at block 1 is a direct copy at the relocation; on the same-round "direct"
  relocation (a radix match ending exactly at the stop, before admission) SGLang's staged
  copy-on-write from the matched node is cancelled first, so it cannot overwrite the restored
  state (spec §9.6), and the relocation is undone if the request is not admitted that round;
* a request re-queued by preemption is not admitted to its session a second time, and a request
  retracted or preempted after a relocation gives every slot back (SGLang frees the request's rows)
  and is read again without relocation (its event says so in ``fallback``);
* an exception inside any SCR step ends in a plain read of that request, never a dead scheduler;
* keys are re-rotated with the language model's rotary table, found on its full-attention layers
  and checked against the text config at start-up (``scr.rotary``, ``patches.rope.text_rotary``).
"""
# Spec: docs/scr.md

from __future__ import annotations

from dataclasses import dataclass

from scr.settings import ScrConfig
from policy.events import RequestEvent
from scr.cursor import RelocationCursor
from scr.gates import Gate, state_ready
from scr.intercept import Intercept


@dataclass
class RequestState:
    """One request of a session, from enqueue to release; owned by the runtime, keyed by rid."""

    rid: str
    sid: str | None
    outcome: Intercept
    queued_ts: float
    cursor: RelocationCursor | None = None  # a plan waiting for its decision or being executed
    gate: Gate | None = None
    phase1: bool = False  # reading up to ``cursor.stop`` as the chunked request
    radix_n0: int = 0  # prefix SGLang's tree served when the plan was decided
    moved: int = 0  # rows relocated into the prefix
    blocks: int = 0  # blocks relocated
    state_saved: bool = False  # a prefill-end state snapshot was taken for this request
    outside_tree: bool = False  # relocated: keep the request out of the radix tree
    direct: tuple | None = None  # (slots, rows) relocated on the waiting queue, not yet admitted
    cut: bool = False  # the token array is cut at a stop (restore the full length on a fallback)
    retractions: int = 0  # times SGLang retracted or preempted the request after admission
    fallback: str | None = None  # why a step fell back to a plain read (for the event)
    held_lines: list | None = None  # lines of a waiting-queue relocation, logged once it is admitted

    def stop_plan(self) -> None:
        """No further step of the plan runs; the rest of the prompt is read normally."""
        self.cursor, self.phase1 = None, False

    def retracted(self) -> None:
        """SGLang took the request back (retraction or preemption) and freed every row it held,
        relocated ones included: it is read again from scratch, without relocation."""
        self.retractions += 1
        if self.cursor is not None or self.moved:
            self.fallback = self.fallback or "retracted: read again without relocation"
        self.stop_plan()
        self.direct, self.cut, self.outside_tree = None, False, False

    def keeps_chunk(self, prefix_len: int) -> bool:
        """True while phase 1 has not reached its stop: the request must stay SGLang's chunked
        request, even where the cut token array was read to its end (so nothing is sampled)."""
        return self.cursor is not None and self.phase1 and prefix_len < self.cursor.stop


@dataclass
class Counters:
    """Scheduler-wide counts printed in the authors' lines (``splice_ok``, ``phase1_aborted`` ...)."""

    relocated_blocks: int = 0
    relocated_tokens: int = 0
    aborts: int = 0
    evict_retries: int = 0  # evict-then-retry attempts (§10.3), and how many then allocated
    evict_retries_ok: int = 0
    stolen: int = 0

    def relocated(self, rows: int, sign: int = 1) -> None:
        """Count one block of ``rows`` rows relocated (``sign=-1``: a waiting-queue relocation undone)."""
        self.relocated_blocks += sign
        self.relocated_tokens += sign * rows


def plan_gate(outcome: Intercept, has_state: bool, has_shadow: bool) -> Gate:
    """The state gate (§9.3) for a ``plan`` outcome: may the plan run, and restore at block 1?

    The session's snapshot counts only when the slot the plan pinned is inside the shadow."""
    cfg = outcome.config
    slot = outcome.side_slot
    return state_ready(mode=cfg.ssm_mode, rows=outcome.kept, has_state_pool=has_state, shadow_ready=has_shadow,
                       has_snapshot=slot is not None and slot < cfg.side_sessions,
                       state_tokens=outcome.admission.session.state_tokens)


def new_cursor(state: RequestState) -> RelocationCursor:
    """The plan's execution from its first block (at admission, or again after an undone relocation)."""
    outcome = state.outcome
    return RelocationCursor(outcome.blocks, outcome.lead_new_end, outcome.config.splice_retry, state.gate.restore)


def relocation_refusal(rows: int, slot: int | None, full_len: int, prefix_len: int, arm_restore: bool,
                       can_restore: bool) -> str | None:
    """Why a block cannot be relocated at ``prefix_len`` (§7.5 steps 1-4), or None when it can::

        |0 ...... prefix_len|rows (moved)|left >= 1 ... full_len|

    At least one token must be left to forward after the moved rows: the logits come from a
    real forward. A restore (block 1, fork) needs the request's own state slot and the shadow."""
    left = full_len - prefix_len - rows
    if rows <= 0 or slot is None or left < 1:
        return f"nothing to splice (rows={rows} slot={slot} left={left})"
    if arm_restore and not can_restore:
        return "no state slot to restore into"
    return None


def chunk_admission(extend_end: int, stop: int, chunk_slot_free: bool) -> str | None:
    """A phase-1 request was admitted this round (§7.3): None = keep it as SGLang's chunked request
    (a middle chunk, so nothing is sampled at the stop), else why the plan is aborted."""
    if extend_end > stop:
        return f"admitted extend ends at {extend_end} > |A|+|B'| {stop}"
    if not chunk_slot_free:
        return "another request became the chunked request"
    return None


def evict_floor(pool_size: int, floor_frac: float) -> int:
    """KV slots evict-then-retry must leave reclaimable (§10.3)."""
    return int(pool_size * floor_frac)


def evict_amount(need: int, available: int, evictable: int, floor: int, margin: int) -> int | None:
    """Tokens to evict from the radix tree before retrying an allocation of ``need`` slots (§10.3),
    or None when eviction would cut into the floor (the relocation then gives up)."""
    if evictable + available < need + floor:
        return None
    return need - available + margin


def snapshot_at_prefill_end(config: ScrConfig, has_shadow: bool, state: RequestState | None,
                            finished: bool, has_state_index: bool) -> bool:
    """§9.2, ``ssm_snap=prefill_end``: save the state after a prefill forward of a session's request
    that runs no plan (a plan's request restores instead), while its state row still exists."""
    if not has_shadow or config.ssm_snap != "prefill_end":
        return False
    return (state is not None and state.sid is not None and state.cursor is None and not finished
            and has_state_index)


def state_at_release(config: ScrConfig, has_shadow: bool, stored: bool, has_state_index: bool,
                     state_saved: bool) -> str | None:
    """What happens to the session's saved state when a request ends (§9.2): ``"save"`` now
    (``ssm_snap=release``, not strict, rows stored), ``"drop"`` (no snapshot was taken for this
    turn, so an older one must not pair with this turn's K/V), or None (keep the one taken)."""
    if (config.ssm_snap == "release" and config.ssm_mode != "strict" and has_shadow and stored
            and has_state_index):
        return "save"
    return None if state_saved else "drop"


def accounting(prompt_len: int, cached_tokens: int, moved: int) -> tuple[int, int]:
    """``(prefix_reused, read)`` of a request's event: SGLang counts each relocated row twice in
    ``cached_tokens`` (once attached, once in ``prepare_for_extend``). No clamping, so check I1
    sees any error in the rule::

        |0 .. prefix_reused|moved|read ... prompt_len|
    """
    reused = cached_tokens - 2 * moved
    return reused, prompt_len - reused - moved


def request_event(state: RequestState, policy: str, finished_ts: float, *, prompt_tokens: int, cached_tokens: int,
                  **facts) -> RequestEvent:
    """The request's event: ``facts`` from the engine (``decode_tokens``, ``cache_salt``,
    ``finish_reason``, ``match_cap``), the counts by ``accounting``, the rest from ``state``."""
    reused, read = accounting(prompt_tokens, cached_tokens, state.moved)
    return RequestEvent(rid=state.rid, policy=policy, prompt_tokens=prompt_tokens, prefix_reused=reused,
                        moved=state.moved, read=read, plan_resume=None, queued_ts=state.queued_ts,
                        finished_ts=finished_ts, blocks=state.blocks, fallback=state.fallback,
                        retractions=state.retractions, **facts)
