"""What SCR decides for a request when it enters the scheduler (``docs/scr.md`` §4.2, §6).

``intercept`` admits the request to its session, diffs the previous prompt against the new one
and plans the relocated blocks. The outcome is data (``Intercept``); the scheduler side executes
``plan`` outcomes with a ``scr.cursor.RelocationCursor`` and serves every other outcome plainly.

| kind          | when                                                          | spec          |
|---------------|---------------------------------------------------------------|---------------|
| ``off``       | ``cache_salt = "kvreuse:off"`` or SCR disabled: no session     | §2.3, §4.2 s2 |
| ``cold``      | new session, or its session holds no side slot                 | §4.2 step 8   |
| ``passthrough`` | nothing deleted, nothing inserted or nothing kept            | §4.2 step 10  |
| ``no_plan``   | no block of min_tail + min_extend tokens after the leading run | §6.5, §7.2 s5 |
| ``plan``      | up to max_blocks blocks to relocate                            | §6.5          |
"""
# Spec: docs/scr.md

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from policy.api import Admission
from scr.knobs import RequestKnobs
from scr.diff import diff_opcodes, edit_counts, is_passthrough
from scr.planner import Block, plan_blocks
from scr.sessions import SessionAdmission, SessionTable
from scr.settings import ScrConfig


@dataclass(frozen=True)
class Intercept(Admission):
    """SCR's admission of one request (``policy.api.Admission``: ``kind`` is one of the table
    above), carried by its plan to the step carrier (``scr.steps``)."""

    config: ScrConfig  # the request's config (server settings + its knobs)
    admission: SessionAdmission | None = None
    kept: int = 0
    deleted: int = 0
    inserted: int = 0
    resume_limit: int | None = None
    blocks: tuple[Block, ...] = ()
    # The side slot the plan reads, pinned at admission with its acquisition count (``SlotList``):
    # a relocation or restore refuses the slot if the session no longer holds this very acquisition.
    side_slot: int | None = None
    slot_generation: int = 0

    @property
    def sid(self) -> str | None:
        return self.admission.session.sid if self.admission else None

    @property
    def n_old(self) -> int:
        return len(self.admission.previous_tokens) if self.admission else 0

    @property
    def relocated_rows(self) -> int:
        return sum(block.num_rows for block in self.blocks)


def intercept(table: SessionTable, tokens: Sequence[int], knobs: RequestKnobs, config: ScrConfig,
              identity: str | None = None) -> Intercept:
    """Admit, diff and plan one new request (mutates ``table``: the session now holds ``tokens``).
    ``identity``: the conversation the request names (``sessions.request_identity``), or None."""
    cfg = knobs.apply(config)
    if knobs.off or not cfg.enabled:
        return Intercept("off", cfg)
    admission = table.admit(tokens, knobs.namespace, identity)
    session = admission.session
    old = admission.previous_tokens
    if not old or session.side_slot is None:
        return Intercept("cold", cfg, admission)
    ops = diff_opcodes(old, tokens, fastdiff=cfg.fastdiff, fastdiff_min=cfg.fastdiff_min,
                       cdc_target=cfg.cdc_target, cdc_extend=cfg.cdc_extend)
    kept, deleted, inserted = edit_counts(ops)
    counts = dict(kept=kept, deleted=deleted, inserted=inserted)
    if is_passthrough(ops):
        return Intercept("passthrough", cfg, admission, **counts)
    resume_limit, blocks = plan_blocks(
        old, tokens, side_ids=session.side_ids, max_blocks=cfg.max_blocks, min_extend=cfg.min_extend,
        min_tail=cfg.min_tail, mb_min_gap=cfg.mb_min_gap, ops=ops,
    )
    kind = "plan" if blocks else "no_plan"
    slot = session.side_slot
    return Intercept(kind, cfg, admission, resume_limit=resume_limit, blocks=tuple(blocks), side_slot=slot,
                     slot_generation=table.generation(slot), **counts)
