"""The hook set for ``scr``: SCR decides at enqueue and while a request is read, so its runtime
(``patches/scr_runtime.py``) is driven from more SGLang calls than the plain executor's.

Named by ``policy.registry``; ``patches.plugin`` calls ``install``. Each hook only forwards to
the runtime, which contains failures.
"""

from __future__ import annotations

import logging

from patches import plugin

logger = logging.getLogger(__name__)


def _start_runtime(scheduler, spec) -> None:
    from patches.events import EventWriter
    from patches.rope import RotaryMismatch
    from patches.scr_runtime import ScrRuntime

    leader = plugin.is_leader(scheduler)
    events = EventWriter(spec.events_path) if spec.events_path is not None and leader else None
    try:
        plugin.set_executor(ScrRuntime(spec.build(), scheduler, events, leader))
    except RotaryMismatch as exc:
        raise plugin.refuse(f"--cache-policy scr cannot re-rotate keys on this model: {exc}") from None
    if leader:
        logger.info("cache policy %s started with config %s", spec.policy, spec.config)


def _forward(method: str):
    """A BEFORE hook calling ``runtime.<method>`` with SGLang's arguments, once a runtime exists."""

    def hook(*args, **kwargs):
        runtime = plugin.executor()
        if runtime is not None:
            getattr(runtime, method)(*args, **kwargs)

    hook.__name__ = f"before_{method}"
    return hook


def _around(method: str):
    """An AROUND hook: ``runtime.<method>(original, ...)`` once a runtime exists, else SGLang's."""

    def hook(original, *args, **kwargs):
        runtime = plugin.executor()
        if runtime is None:
            return original(*args, **kwargs)
        return getattr(runtime, method)(original, *args, **kwargs)

    hook.__name__ = f"around_{method}"
    return hook


def install(register, spec) -> None:
    def after_scheduler_init(result, scheduler, server_args, *args, **kwargs):
        _start_runtime(scheduler, spec)

    def after_prefill(result, processor, batch, *args, **kwargs):
        runtime = plugin.executor()
        if runtime is not None:
            runtime.after_prefill(result, processor, batch, *args, **kwargs)
        return result

    def before_idle(scheduler, *args, **kwargs):
        runtime = plugin.executor()
        if runtime is not None:
            runtime.on_idle(scheduler)

    register(plugin.SCHEDULER_INIT, after_scheduler_init, "after")
    register(plugin.ENQUEUE, _forward("on_enqueue"), "before")
    register(plugin.REQ_MATCHED, _around("init_round"), "around")
    register(plugin.ADD_ONE_REQ, _around("add_one_req"), "around")
    register(plugin.ADD_CHUNKED_REQ, _around("add_chunked_req"), "around")
    register(plugin.PREFILL_RESULT, after_prefill, "after")
    register(plugin.RELEASE_KV, _forward("on_release"), "before")
    register(plugin.SCHEDULER_IDLE, before_idle, "before")
    register(plugin.ABORT, _forward("on_abort"), "before")
