"""The ``sglang.srt.plugins`` entry point: runs in every SGLang process before the engine starts.

``install`` refuses an SGLang other than the pinned one, registers the hooks (text-only serving of a
text-only checkpoint on every platform, CPU platform support without CUDA, request validation, the hook set for the way the selected policy plans, the
``--cache-trace`` writer), applies them and verifies that every one is in place. SGLang's plugin
loader logs and swallows ``Exception``, so failures here raise ``SystemExit``: a selected policy
whose hook is missing stops the process with a message naming the hook, instead of silently
serving stock behaviour.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import sys

from patches import versions
from serving import faults, refusals

logger = logging.getLogger(__name__)

REQ_MATCHED = "sglang.srt.managers.schedule_batch.Req.init_next_round_input"
RELEASE_KV = "sglang.srt.mem_cache.common.release_kv_cache"
SCHEDULER_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
SCHEDULER_INIT = "sglang.srt.managers.scheduler.Scheduler.__init__"
ADD_CHUNKED_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
ENQUEUE = "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue"
ABORT = "sglang.srt.managers.scheduler.Scheduler.abort_request"
PREFILL_RESULT = ("sglang.srt.managers.scheduler_components.batch_result_processor."
                  "SchedulerBatchResultProcessor.process_batch_result_prefill")

# One line per process, format fixed (tests and operators grep it).
INSTALLED_LINE = "[cache-policy] overlay installed pid={pid} cpu_platform={cpu} policy={policy} hooks={hooks}"

_state: dict = {"installed": False, "targets": (), "executor": None, "cpu": False}


def fail(message: str) -> "SystemExit":
    logger.critical("cache-policy overlay: %s", message)
    return SystemExit(f"cache-policy overlay: {message}")


def refuse(message: str) -> "SystemExit":
    """A start-up refusal found inside a scheduler process, passed on to the launcher."""
    refusals.record(message)
    return fail(message)


def install() -> None:
    if _state["installed"]:
        return
    try:
        versions.check_pins()
    except versions.VersionMismatch as exc:
        raise fail(str(exc)) from None
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from patches import log_guard  # one record, one line: no request field starts a log line

    log_guard.install()
    registered: list[str] = []

    def register(target: str, hook, kind: str) -> None:
        HookRegistry.register(target, hook, HookType[kind.upper()])
        if target not in registered:  # a target may carry several of our hooks (ServerArgs.__post_init__)
            registered.append(target)

    from patches import text_only  # a checkpoint without processor configs is served text-only, any device

    text_only.install(register)
    from patches.cpu import platform as cpu_platform

    use_cpu = not cpu_platform.cuda_available()
    if use_cpu:
        cpu_platform.install(register)
    from patches import validation  # request checks before the scheduler, for every policy and none

    validation.install(register)
    from patches import routes  # what the route table's open routes need (the table itself: the launcher)

    routes.install_hooks(register)
    spec = current_spec()
    if spec is not None:
        _install_policy_hooks(register, spec)
    from patches import trace_writer  # --cache-trace: the exact ids of every request, any policy

    trace_writer.install(register)
    _apply_and_verify(HookRegistry, registered, spec)
    if use_cpu:
        cpu_platform.after_hooks_applied()
    _state.update(installed=True, targets=tuple(registered), cpu=use_cpu)
    # Printed, not logged: SGLang configures logging only after plugins load in the main process.
    print(INSTALLED_LINE.format(pid=os.getpid(), cpu=use_cpu, policy=spec.policy if spec else None,
                                hooks=len(registered)), file=sys.stderr, flush=True)


def _apply_and_verify(hook_registry, registered: list[str], spec) -> None:
    """Apply the registered hooks; stop the process unless every target exists and is wrapped."""
    originals, unresolvable = {}, []
    for target in registered:
        try:
            originals[target] = _resolve(target)
        except (ImportError, AttributeError):
            unresolvable.append(target)
    if unresolvable:
        raise _hooks_failed("these hook targets do not exist", unresolvable, spec)
    hook_registry.apply_hooks()
    missing = [t for t in registered if t not in hook_registry._patched or _resolve(t) is originals[t]]
    if missing:
        raise _hooks_failed("these hooks are not in place", missing, spec)


def _hooks_failed(problem: str, targets: list[str], spec) -> SystemExit:
    consequence = f"; policy {spec.policy!r} cannot run" if spec else ""
    return fail(f"{problem} (SGLang internals changed?): {', '.join(targets)}{consequence}")


def installed_targets() -> tuple[str, ...]:
    return _state["targets"]


def current_spec():
    from policy.registry import SPEC_ENV, PolicySpec

    text = os.environ.get(SPEC_ENV)
    if not text:
        return None
    try:
        return PolicySpec.from_json(text)
    except (ValueError, KeyError) as exc:
        raise fail(f"cannot parse {SPEC_ENV}: {exc}") from None


def executor():
    """The scheduler process's policy executor (None before the scheduler is built)."""
    return _state["executor"]


def set_executor(executor) -> None:
    """Called once by a hook set's scheduler-init hook with the object its hooks drive."""
    _state["executor"] = executor


def starter(spec, make):
    """A hook set's AFTER hook of ``Scheduler.__init__``: once the scheduler's pools and tree exist,
    ``make(scheduler, policy, events, leader)`` builds the object the set's hooks drive."""

    def after_scheduler_init(result, scheduler, *args, **kwargs):
        from serving.event_writer import EventWriter

        leader = is_leader(scheduler)
        faults.set_rank(scheduler.ps.tp_rank)
        events = EventWriter(spec.events_path) if spec.events_path is not None and leader else None
        set_executor(make(scheduler, spec.build(), events, leader))
        if leader:
            logger.info("cache policy %s started with config %s", spec.policy, spec.config)

    return after_scheduler_init


def forward(method: str, kind: str):
    """A hook of ``kind`` calling ``executor().<method>`` with SGLang's arguments once it exists.

    AROUND hooks get ``original`` first and return the answer; BEFORE and AFTER hooks return None,
    which SGLang's registry reads as "arguments and result unchanged". Before the executor exists,
    SGLang's own code runs alone."""

    def hook(*args, **kwargs):
        target = executor()
        if kind == "around":
            original, *rest = args
            return original(*rest, **kwargs) if target is None else getattr(target, method)(*args, **kwargs)
        if target is not None:
            getattr(target, method)(*args, **kwargs)

    hook.__name__ = f"{kind}_{method}"
    return hook


def _install_policy_hooks(register, spec) -> None:
    """The hook set for the way this policy plans (``CachePolicy.plans_at``, ``patches.hook_sets``)."""
    try:
        spec.build()  # fail in every process, the launcher's included, on a bad spec
    except Exception as exc:  # noqa: BLE001 - any construction error stops the server
        raise fail(f"cannot build policy {spec.policy!r}: {exc}") from None
    from patches import hook_sets
    from policy.registry import plans_at

    hook_sets.install(register, spec, plans_at(spec.policy))


def is_leader(scheduler) -> bool:
    """One scheduler per data-parallel group writes events and logs: attention TP/CP rank 0
    of the first pipeline stage (every rank of a group sees the same requests)."""
    ps = scheduler.ps
    return ps.attn_tp_rank == 0 and ps.attn_cp_rank == 0 and ps.pp_rank == 0


def _resolve(target: str):
    owner, attr = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(owner)
    raw = obj.__dict__.get(attr) if isinstance(obj, type) else None
    return raw if raw is not None else getattr(obj, attr)
