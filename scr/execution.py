"""SCR's plan as ``policy.api`` steps, and the rules ``scr.steps`` asks while it carries them out
(``docs/scr.md`` §7, §9, §10).

``relocation_plan`` turns the admission's blocks into ``Read``/``Relocate``/``Restore`` steps;
``scr.steps`` (driven by the one executor, ``patches/executor.py``, over the engine port of
``patches/scr_runtime.py``) asks the functions here and has the answer carried out (allocate, copy
rows, abort). Everything here is plain data, so each rule has a table test
(``tests/unit/test_scr_execution.py``) and is written once. For block i::

    prompt |0 .. tree_hit|tree_hit .. stop_1|rows_1 (moved)|kext + text .. stop_2|rows_2| .. tail|
            from the tree  phase 1 (chunked)  relocate 1     phase 1 again        relocate 2 read

Phase 1 runs as SGLang's chunked request with the token array cut at the stop, so no token is
sampled there; the relocation happens on the chunked-request pass that finds the prefix exactly at
the stop. Where this port differs from the authors' code, and why:

* relocated rows enter the shared radix tree as in the authors' code (``relocated_in_tree``, the
  default); with ``relocated_in_tree=False`` (their README's sentence, an ablation) the request is
  marked ``skip_radix_cache_insert`` after its first relocation, so the tree keeps what phase 1
  read exactly (``[0, stop_1)``) and SGLang frees the request's own rows at release;
* the state restore at block 1 is a direct copy at the relocation; on the same-round "direct"
  relocation (a radix match ending exactly at the stop, before admission) SGLang's staged
  copy-on-write from the matched node is cancelled first, so it cannot overwrite the restored
  state (spec §9.6), and the relocation is undone if the request is not admitted that round;
* a request re-queued by preemption is not admitted to its session a second time, and a request
  retracted or preempted after a relocation gives every slot back (SGLang frees the request's rows)
  and is read again without relocation (its event says so in ``fallback``);
* an exception inside any SCR step ends in a plain read of that request, never a dead scheduler;
* keys are re-rotated with the language model's rotary table, found on its full-attention layers
  and checked against the text config at start-up (``patches.rope.text_rotary``).
"""
# Spec: docs/scr.md

from __future__ import annotations

from dataclasses import dataclass

from policy.api import Read, Plan, Relocate, Restore
from scr.settings import ScrConfig
from scr.cursor import RelocationCursor
from scr.planner import Block
from scr.gates import Gate, state_ready
from scr.intercept import Intercept


@dataclass
class RelocationProgress:
    """Where one request is in SCR's steps, from enqueue to release: the executor's request record
    (``patches.request_book.TrackedRequest``) holds it as ``progress``; only ``scr.steps`` reads it.
    The record itself keeps what every policy has (plan, rows moved, fallback, retractions)."""

    sid: str | None
    outcome: Intercept
    cursor: RelocationCursor | None = None  # the plan's relocations, waiting for their decision or running
    gate: Gate | None = None
    phase1: bool = False  # reading up to ``cursor.stop`` as the chunked request
    tree_hit: int = 0  # prefix SGLang's tree served when the plan was decided (the authors' ``radix_n0``)
    state_saved: bool = False  # a prefill-end state snapshot was taken for this request
    outside_tree: bool = False  # relocated: keep the request out of the radix tree
    direct: tuple | None = None  # (slots, rows) relocated on the waiting queue, not yet admitted
    cut: bool = False  # the token array is cut at a stop (restore the full length on a fallback)
    held_lines: list | None = None  # lines of a waiting-queue relocation, logged once it is admitted

    def stop_plan(self) -> None:
        """No further step of the plan runs; the rest of the prompt is read normally."""
        self.cursor, self.phase1 = None, False

    def retracted(self) -> bool:
        """SGLang took the request back (retraction or preemption) and freed every row it held,
        relocated ones included: it is read again from scratch, without relocation. True when a
        plan was running or had relocated rows (the event says so in ``fallback``)."""
        running = self.cursor is not None
        self.stop_plan()
        self.direct, self.cut, self.outside_tree = None, False, False
        return running

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


def new_cursor(progress: RelocationProgress, plan: Plan) -> RelocationCursor:
    """The plan's execution from its first relocation (at admission, or again after an undone
    relocation): its ``Relocate`` steps as blocks, restoring at block 1 when the plan has a
    ``Restore`` there and the state gate allows it."""
    cfg = progress.outcome.config
    relocations = plan.relocations()
    return RelocationCursor(blocks_of(relocations, cfg.min_extend), plan.resume_limit, cfg.splice_retry,
                            progress.gate.restore and relocations[0][1])


def blocks_of(relocations, min_extend: int) -> tuple[Block, ...]:
    """The planner's blocks behind a plan's ``Relocate`` steps: each block's last ``kext`` tokens
    are read, so its equal run is ``rows + kext`` long (``scr.planner.accept_blocks``)."""
    kext = max(1, min_extend)
    return tuple(Block(step.source, step.at, step.rows, step.rows + kext, step.end + kext) for step, _ in relocations)


def relocation_plan(rid: str, outcome: Intercept, prompt_len: int) -> Plan:
    """``ScrPolicy.plan``'s answer at enqueue: read up to each block's stop, relocate its rows from
    the session's side slot (restoring the saved recurrent state with block 1 unless
    ``ssm_mode=none``), read on; resume where the tree's match ends, no later than the leading
    equal run (``resume_limit``, §7.2 step 6). Any other outcome reads the whole prompt from the
    tree hit on. The plan carries the outcome to ``scr.steps`` (``Plan.admission``)."""
    if outcome.kind != "plan" or not outcome.blocks:
        steps = (Read(0, prompt_len),) if prompt_len else ()
        return Plan(rid, 0, steps, resume_limit=prompt_len, admission=outcome)
    steps: list = []
    cursor, slot = 0, outcome.side_slot
    for number, block in enumerate(outcome.blocks):
        if block.new_start > cursor:
            steps.append(Read(cursor, block.new_start))
        steps.append(Relocate(block.new_start, block.num_rows, block.old_start, slot))
        if number == 0 and outcome.config.ssm_mode != "none":
            steps.append(Restore(block.new_start + block.num_rows, slot))
        cursor = block.new_start + block.num_rows
    steps.append(Read(cursor, prompt_len))
    return Plan(rid, 0, tuple(steps), resume_limit=outcome.resume_limit, admission=outcome)


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


def snapshot_at_prefill_end(config: ScrConfig, has_shadow: bool, state: RelocationProgress | None,
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
