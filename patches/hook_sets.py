"""The hook sets, one per way a policy plans (``CachePolicy.plans_at``); every one drives the one
``PolicyExecutor`` (``patches/executor.py``).

``patches.plugin`` installs the set that matches the selected policy's ``plans_at``, with the
policy it built for this process; the registry names no module of ``patches/``. Each hook only
forwards to the executor (``forward``), which contains failures; why each SGLang call is hooked is
the hook table of docs/ARCHITECTURE.md (targets: ``patches/targets.py``).

| plans_at  | set               | what it adds                                                          |
|-----------|-------------------|-----------------------------------------------------------------------|
| match     | ``install_match``   | plan after SGLang's own match, on SGLang's own tree (radix)          |
| tree      | ``install_tree``    | the exact tree backend that plans inside its match, chunk budgets of exactly the planned piece, batch-invariant CPU decode and split-invariant CPU prefill attention (exact) |
| enqueue   | ``install_enqueue`` | plan at enqueue; the engine port, side buffer and state shadow for the policy's step carrier, the chunked-request hooks its steps need (scr) |
"""

from __future__ import annotations

import logging

from patches import process, targets
from policy import faults

logger = logging.getLogger(__name__)



def install(register, spec, policy, plans_at: str) -> None:
    """The hook set for ``policy`` (built from ``spec``), which plans ``plans_at`` (``policy.api.PLANS_AT``)."""
    installers = {"match": install_match, "tree": install_tree, "enqueue": install_enqueue}
    if plans_at not in installers:
        raise process.fail(f"policy {spec.policy!r} plans at {plans_at!r}; the executor knows {', '.join(installers)}")
    installers[plans_at](register, spec, policy)


def starter(spec, policy, make):
    """A hook set's AFTER hook of ``Scheduler.__init__``: once the scheduler's pools and tree exist,
    ``make(scheduler, policy, events, leader)`` builds the object the set's hooks drive."""

    def after_scheduler_init(result, scheduler, *args, **kwargs):
        from serving.event_writer import EventWriter

        leader = process.is_leader(scheduler)
        faults.set_rank(scheduler.ps.tp_rank)
        events = EventWriter(spec.events_path) if spec.events_path is not None and leader else None
        process.set_executor(make(scheduler, policy, events, leader))
        if leader:
            logger.info("cache policy %s started with config %s", spec.policy, spec.config)

    return after_scheduler_init


def forward(method: str, kind: str):
    """A hook of ``kind`` calling ``executor().<method>`` with SGLang's arguments once it exists.

    AROUND hooks get ``original`` first and return the answer; BEFORE and AFTER hooks return None,
    which SGLang's registry reads as "arguments and result unchanged". Before the executor exists,
    SGLang's own code runs alone."""

    def hook(*args, **kwargs):
        target = process.executor()
        if kind == "around":
            original, *rest = args
            return original(*rest, **kwargs) if target is None else getattr(target, method)(*args, **kwargs)
        if target is not None:
            getattr(target, method)(*args, **kwargs)

    hook.__name__ = f"{kind}_{method}"
    return hook


def _forward_all(register, hooks) -> None:
    """Register a ``forward`` hook for each (target, executor method, kind) of ``hooks`` and the
    ones every set has. Targets are read from ``patches.targets`` when a set is installed."""
    common = [(targets.RELEASE_KV, "on_release", "before"), (targets.SCHEDULER_IDLE, "on_idle", "before"),
              (targets.ABORT, "on_abort", "before")]
    for target, method, kind in [*hooks, *common]:
        register(target, forward(method, kind), kind)


def install_match(register, spec, policy) -> None:
    """Plans made after SGLang's match (``Req.init_next_round_input``); SGLang's own tree."""

    def make(scheduler, policy, events, leader: bool):
        from patches.executor import PolicyExecutor

        return PolicyExecutor(policy, events, scheduler=scheduler)

    register(targets.SCHEDULER_INIT, starter(spec, policy, make), "after")
    _forward_all(register, [(targets.REQ_MATCHED, "after_match", "after")])


def install_tree(register, spec, policy) -> None:
    """The exact tree backend, chunk budgets of exactly the planned piece and, on CPU, batch-invariant decode
    and split-invariant prefill attention."""
    from patches.cpu import platform as cpu_platform
    from patches import gdn_keep_hooks
    from patches.exact_tree import planned_first_piece, register_backend, run_batch, whole_piece_budget

    register_backend()
    register(targets.ADD_CHUNKED_REQ, whole_piece_budget, "around")
    register(targets.ADD_ONE_REQ, planned_first_piece, "around")
    register(targets.RUN_BATCH, run_batch, "around")
    gdn_keep_hooks.install(register, cpu_platform.cuda_available())
    if not cpu_platform.cuda_available():
        # A decode batch must not change a row's bits (GPU: --enable-deterministic-inference), nor
        # where the prefill forward that read a row started or ended (cut=kept resumes mid-forward).
        from patches import row_invariance
        from patches.cpu import attention

        row_invariance.install(register)
        attention.tile_every_prefill()

    def make(scheduler, policy, events, leader: bool):
        from patches.exact_tree import attach
        from patches.executor import PolicyExecutor

        executor = PolicyExecutor(policy, events, scheduler=scheduler)
        attach(scheduler, executor, spec)
        return executor

    register(targets.SCHEDULER_INIT, starter(spec, policy, make), "after")
    _forward_all(register, [(targets.REQ_MATCHED, "after_match", "after")])


def install_enqueue(register, spec, policy) -> None:
    """Plans made at enqueue, carried out by the policy's step carrier over ``ScrEngine``."""

    register(targets.SCHEDULER_INIT, starter(spec, policy, enqueue_executor), "after")
    _forward_all(register, [
        (targets.ENQUEUE, "on_enqueue", "before"), (targets.REQ_MATCHED, "init_round", "around"),
        (targets.ADD_ONE_REQ, "add_one_req", "around"), (targets.ADD_CHUNKED_REQ, "add_chunked_req", "around"),
        (targets.PREFILL_RESULT, "after_prefill", "after"),
    ])


def enqueue_executor(scheduler, policy, events, leader: bool):
    """The executor of a policy that plans at enqueue (a ``policy.carrier.StepPolicy``): its side
    stores and engine port (``ScrEngine``), then its step carrier over the port."""
    from patches.executor import PolicyExecutor
    from patches.rope import RotaryMismatch
    from patches.scr_runtime import ScrEngine, logger

    try:
        engine = ScrEngine(policy, scheduler)
    except RotaryMismatch as exc:
        raise process.refuse(f"--cache-policy {policy.name} cannot re-rotate keys on this model: {exc}") from None
    steps = policy.step_carrier(engine, logger, leader)
    return PolicyExecutor(policy, events, steps=steps, log=logger, scheduler=scheduler)
