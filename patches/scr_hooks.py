"""The hook set for ``scr``: SCR decides at enqueue and while a request is read, so its runtime
(``patches/scr_runtime.py``) is driven from more SGLang calls than the plain executor's.

Named by ``policy.registry``; ``patches.plugin`` calls ``install``. Each hook only forwards to the
runtime method named in ``install`` (``plugin.forward``; the runtime contains failures); why each
SGLang call is hooked, with its ``docs/scr.md`` section, is the hook table of docs/ARCHITECTURE.md.
"""
# Spec: docs/scr.md

from __future__ import annotations

from patches import plugin


def _runtime(scheduler, policy, events, leader: bool):
    from patches.scr_runtime import ScrRuntime
    from scr.rotary import RotaryMismatch

    try:
        return ScrRuntime(policy, scheduler, events, leader)
    except RotaryMismatch as exc:
        raise plugin.refuse(f"--cache-policy scr cannot re-rotate keys on this model: {exc}") from None


def install(register, spec) -> None:
    register(plugin.SCHEDULER_INIT, plugin.starter(spec, _runtime), "after")
    for target, method, kind in [
        (plugin.ENQUEUE, "on_enqueue", "before"), (plugin.REQ_MATCHED, "init_round", "around"),
        (plugin.ADD_ONE_REQ, "add_one_req", "around"), (plugin.ADD_CHUNKED_REQ, "add_chunked_req", "around"),
        (plugin.PREFILL_RESULT, "after_prefill", "after"), (plugin.RELEASE_KV, "on_release", "before"),
        (plugin.SCHEDULER_IDLE, "on_idle", "before"), (plugin.ABORT, "on_abort", "before"),
    ]:
        register(target, plugin.forward(method, kind), kind)
