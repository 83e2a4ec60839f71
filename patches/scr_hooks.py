"""The hook set for ``scr``: SCR decides at enqueue and while a request is read, so its runtime
(``patches/scr_runtime.py``) is driven from more SGLang calls than the plain executor's.

Named by ``policy.registry``; ``patches.plugin`` calls ``install``. Each hook only forwards to the
runtime (which contains failures); before the runtime exists, SGLang's own code runs alone.

| SGLang call (``plugin`` name)                         | kind   | runtime method    | spec     |
|-------------------------------------------------------|--------|-------------------|----------|
| ``Scheduler.__init__`` (SCHEDULER_INIT)               | AFTER  | start the runtime |          |
| ``Scheduler._add_request_to_queue`` (ENQUEUE)         | BEFORE | ``on_enqueue``    | H7, §4   |
| ``Req.init_next_round_input`` (REQ_MATCHED)           | AROUND | ``init_round``    | H10, §7  |
| ``PrefillAdder.add_one_req`` (ADD_ONE_REQ)            | AROUND | ``add_one_req``   | H8       |
| ``PrefillAdder.add_chunked_req`` (ADD_CHUNKED_REQ)    | AROUND | ``add_chunked_req``| H9      |
| ``process_batch_result_prefill`` (PREFILL_RESULT)     | AFTER  | ``after_prefill`` | H4, §9.2 |
| ``release_kv_cache`` (RELEASE_KV)                     | BEFORE | ``on_release``    | H2, §5.2 |
| ``Scheduler.on_idle`` (SCHEDULER_IDLE)                | BEFORE | ``on_idle``       | checks   |
| ``Scheduler.abort_request`` (ABORT)                   | BEFORE | ``on_abort``      |          |
"""
# Spec: docs/scr.md

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


def _forward(method: str, kind: str):
    """A hook of ``kind`` calling ``runtime.<method>`` with SGLang's arguments once a runtime exists.

    AROUND hooks get ``original`` first and return the answer; BEFORE and AFTER hooks return None,
    which SGLang's registry reads as "arguments and result unchanged"."""

    def hook(*args, **kwargs):
        runtime = plugin.executor()
        if kind == "around":
            original, *rest = args
            return original(*rest, **kwargs) if runtime is None else getattr(runtime, method)(*args, **kwargs)
        if runtime is not None:
            getattr(runtime, method)(*args, **kwargs)

    hook.__name__ = f"{kind}_{method}"
    return hook


def install(register, spec) -> None:
    def after_scheduler_init(result, scheduler, server_args, *args, **kwargs):
        _start_runtime(scheduler, spec)

    register(plugin.SCHEDULER_INIT, after_scheduler_init, "after")
    for target, method, kind in [
        (plugin.ENQUEUE, "on_enqueue", "before"), (plugin.REQ_MATCHED, "init_round", "around"),
        (plugin.ADD_ONE_REQ, "add_one_req", "around"), (plugin.ADD_CHUNKED_REQ, "add_chunked_req", "around"),
        (plugin.PREFILL_RESULT, "after_prefill", "after"), (plugin.RELEASE_KV, "on_release", "before"),
        (plugin.SCHEDULER_IDLE, "on_idle", "before"), (plugin.ABORT, "on_abort", "before"),
    ]:
        register(target, _forward(method, kind), kind)
