"""The lines the SCR runtime prints, built from plain data (formats: ``scr/authors_log.py``).

Kept apart from ``scr/steps.py`` so the step carrier only decides *when* a line is printed; what
it says (and its exact bytes, which the accounting and tests parse) is fixed here, with the words
the one executor uses for SCR (``EXECUTOR_LINES``). The authors' words ("splice", "kv6", "v6")
stay in the lines they print; our code says "relocate".
"""
# Spec: docs/scr.md

from __future__ import annotations

from functools import partial
from typing import Callable, Mapping

from policy.carrier import SideStores
from policy.executor_lines import ExecutorLines, worded
from scr import authors_log as log_lines
from scr.cursor import NextBlock, Relocation
from scr.execution import Counters, RelocationProgress, evict_floor
from scr.intercept import Intercept
from scr.kvreuse_env import AUTHORS_DEFAULTS, ENV_VARS
from scr.memory import GIB, ScrMemory, activation_margin_bytes, memory_problem, sizes_text
from scr.settings import ScrConfig

format_line = log_lines.format_line

# The executor's lines (``policy.executor_lines``) for SCR, in the ``[kvreuse]`` words the
# authors' operators grep (``[kvreuse] scr fallback: rid=...``); the placeholders are the executor's.
EXECUTOR_LINES = worded(ExecutorLines("[kvreuse] scr fallback: ", "[kvreuse] scr step ", "scr: ", "[kvreuse] scr ",
                                      "[kvreuse] scr admission "))
RELOCATION_FAILED = "[kvreuse] v6 splice failed (%s); freeing %d slots"


def phase1_again(rid: str, via: str, prefix: int, stop: int) -> str:
    return f"[kvreuse] kv6 rid={rid} phase1 re-entry ({via}): prefix={prefix} stop={stop}"


def plan_not_run(rid: str, action: str, reason: str) -> str:
    return f"[kvreuse] kv6 rid={rid} plan not run ({action}: {reason})"


def not_relocated(rid: str, block: int, reason: str) -> str:
    return f"[kvreuse] kv6 rid={rid} block {block} not spliced ({reason}) -> normal prefill of the tail"


def direct_undone(rid: str) -> str:
    return f"[kvreuse] kv6 rid={rid} direct splice undone (not admitted this round)"


def store_skipped(sid: str, reason: str) -> str:
    return f"[kvreuse] {sid} side store skipped ({reason})"


def authors_env(config: ScrConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The authors' ``config.DEFAULTS`` keys as this server runs them (for their ``[scr]`` line):
    our settings where a field exists, the process environment for the dead ones."""
    values = {var: getattr(config, name) for name, var in ENV_VARS.items() if var in AUTHORS_DEFAULTS}
    text = {var: ("1" if v else "0") if isinstance(v, bool) else str(v) for var, v in values.items()}
    return {**environ, **text}


def startup_lines(config: ScrConfig, sglang_version: str, pid: int, environ: Mapping[str, str], *,
                  bytes_per_token: int | None, shadow_gib: float | None, layers: list[int], rotary: bool,
                  pool_slots: int) -> list[str]:
    """The start-up lines of one scheduler, in the order the authors print them. ``bytes_per_token``
    None: no side buffer was allocated (SCR off), so no ``side buffer:`` line."""
    lines = [log_lines.scr_start_line(config.enabled, sglang_version, authors_env(config, environ)),
             log_lines.site_banner(config, pid)]
    if bytes_per_token is not None:
        lines.append(log_lines.side_buffer_line(config.side_sessions, config.side_tokens, bytes_per_token))
    if shadow_gib is not None:
        lines.append(format_line("ssm_shadow", sessions=config.side_sessions, gib=shadow_gib))
    lines.append(format_line(
        "init", full_attn_layers=len(layers), rotary=rotary, layers=layers[:8], pool_slots=pool_slots,
        snapshot_budget=config.side_sessions * config.side_tokens,
        evict_floor=evict_floor(pool_slots, config.evict_floor_frac)))
    return lines


def memory_fits(memory: ScrMemory, free: int, margin: int, where: str) -> str:
    """Start-up, before the stores are allocated: they fit (``scr.memory``, ``docs/scr.md`` §5.4)."""
    return (f"scr: allocating {memory.total_bytes / GIB:.2f} GiB on {where} outside SGLang's pools "
            f"({sizes_text(memory)}); {free / GIB:.2f} GiB free, {margin / GIB:.2f} GiB kept for activations")


def memory_unknown(memory: ScrMemory, where: str) -> str:
    return (f"scr: allocating {memory.total_bytes / GIB:.2f} GiB on {where} outside SGLang's pools "
            f"({sizes_text(memory)}) unchecked: the free memory there is unknown")


def memory_off(memory: ScrMemory) -> str:
    """``enabled`` false: the same code path, without SCR's stores."""
    return (f"scr: switched off (enabled=False): no side buffer or state shadow allocated (switched on, "
            f"they would take {memory.total_bytes / GIB:.2f} GiB)")


def stores_decision(config: ScrConfig, kv_bytes_per_token: int, state_bytes_per_slot: int,
                    measure: Callable[[], tuple[int, int] | None], where: str, *, on_gpu: bool,
                    chunked_prefill_size: int | None, tp_size: int, pp_size: int,
                    mem_fraction_static: float | None) -> SideStores:
    """§5.4: size the side buffer and state shadow from the engine's row sizes, and check them
    against ``measure()`` (free, total bytes where they would go; None: unknown; not asked while SCR
    is switched off) with SGLang's activation margin."""
    memory = ScrMemory(config.side_sessions, config.side_tokens, kv_bytes_per_token, state_bytes_per_slot)
    stores = partial(SideStores, memory.slots, memory.tokens, memory.state_bytes_per_slot > 0)
    if not config.enabled:
        return stores(False, None, memory_off(memory))
    found = measure()
    if found is None:
        return stores(True, None, memory_unknown(memory, where), warn=True)
    free, total = found
    margin = activation_margin_bytes(chunked_prefill_size, tp_size, pp_size, on_gpu=on_gpu)
    problem = memory_problem(memory, free, margin, where, mem_fraction_static=mem_fraction_static,
                             device_total=total)
    return stores(problem is None, problem, memory_fits(memory, free, margin, where))


def multiblock_plan(rid: str, outcome: Intercept, live: int) -> str:
    cfg, blocks = outcome.config, outcome.blocks
    return format_line(
        "multiblock_plan", rid=rid, num_blocks=len(blocks), stops=[b.new_start for b in blocks],
        reloc=[b.num_rows for b in blocks], kext=cfg.min_extend, maxb=cfg.max_blocks, cands=len(blocks), live=live)


def phase1(rid: str, state: RelocationProgress, total: int, has_state: bool, has_shadow: bool) -> str:
    """The plan starts phase 1: read ``[tree_hit, stop)`` as the chunked request."""
    cursor = state.cursor
    return format_line(
        "phase1", rid=rid, radix_n0=state.tree_hit, chunk1=cursor.stop - state.tree_hit, n_c=cursor.blocks[0].n_c,
        total=total, ssm_restore=state.gate.restore, ssm_mode=state.outcome.config.ssm_mode,
        ssm_na=not has_state, ssm_obj=has_shadow)


def relocated(rid: str, state: RelocationProgress, relocation: Relocation, prefix: int, full_len: int,
              counters: Counters) -> list[str]:
    """``phase2`` and ``splice_ok`` for ``relocation`` placed at ``[prefix, prefix + rows)``."""
    block, rows = relocation.block, relocation.block.num_rows
    left = full_len - prefix - rows
    chunk1 = block.new_start - state.tree_hit if relocation.index == 1 else 0
    return [
        format_line("phase2", rid=rid, prefilled_chunk1=chunk1, reused_tail=rows, extend2=left, total=full_len,
                    rot_delta=prefix - block.old_start),
        format_line("splice_ok", rid=rid, sid=state.sid, slot=state.outcome.side_slot, stop=prefix, relocated=rows,
                    extend=left, live=full_len, spliced=counters.relocated_blocks,
                    spliced_tokens=counters.relocated_tokens, block=relocation.index,
                    num_blocks=len(state.cursor.blocks)),
    ]


def next_block(rid: str, following: NextBlock, num_blocks: int, prefix: int) -> str:
    """After a relocation at ``prefix``: the next block's stop (``multiblock_next``) or the blocks
    abandoned (``multiblock_drop``)."""
    if following.stop is not None:
        return format_line("multiblock_next", rid=rid, block=following.number, num_blocks=num_blocks,
                           start=prefix, end=following.stop, rows=following.block.num_rows)
    return format_line("multiblock_drop", rid=rid, block=following.number, num_blocks=num_blocks,
                       stop=following.block.new_start, prefix=prefix, abandoned=following.abandoned)


def slot_stolen(rid: str, state: RelocationProgress, old_start: int, rows: int, owner: str | None, ids_match: bool,
                stolen: int) -> str:
    return format_line("slot_stolen", rid=rid, slot=state.outcome.side_slot, owner=owner, sess=state.sid,
                       row_start=old_start, row_end=old_start + rows, ids_match=ids_match, stolen=stolen)


def trace_request(rid: str, outcome: Intercept, n_new: int, text: str) -> str:
    session = outcome.admission.session
    return format_line("trace_req", rid=rid, sid=session.sid, slot=session.side_slot, n_new=n_new,
                       n_old=outcome.n_old, nsess=outcome.admission.num_sessions, tag=log_lines.trace_tag(text))
