"""The hook sets, one per way a policy plans (``CachePolicy.plans_at``); every one drives the one
``PolicyExecutor`` (``patches/executor.py``).

``patches.plugin`` installs the set that matches the selected policy's ``plans_at``; the registry
names no module of ``patches/``. Each hook only forwards to the executor (``plugin.forward``),
which contains failures; why each SGLang call is hooked is the hook table of docs/ARCHITECTURE.md.

| plans_at  | set               | what it adds                                                          |
|-----------|-------------------|-----------------------------------------------------------------------|
| match     | ``install_match``   | plan after SGLang's own match, on SGLang's own tree (radix)          |
| tree      | ``install_tree``    | the exact tree backend that plans inside its match, chunk budgets of exactly the planned piece, batch-invariant CPU decode and split-invariant CPU prefill attention (exact) |
| enqueue   | ``install_enqueue`` | plan at enqueue; the engine port, side buffer and state shadow for the policy's step carrier, the chunked-request hooks its steps need (scr) |
"""

from __future__ import annotations

from patches import plugin

COMMON = [(plugin.RELEASE_KV, "on_release", "before"), (plugin.SCHEDULER_IDLE, "on_idle", "before"),
          (plugin.ABORT, "on_abort", "before")]


def install(register, spec, plans_at: str) -> None:
    """The hook set for a policy that plans ``plans_at`` (``policy.api.PLANS_AT``)."""
    installers = {"match": install_match, "tree": install_tree, "enqueue": install_enqueue}
    if plans_at not in installers:
        raise plugin.fail(f"policy {spec.policy!r} plans at {plans_at!r}; the executor knows {', '.join(installers)}")
    installers[plans_at](register, spec)


def _forward_all(register, hooks) -> None:
    for target, method, kind in [*hooks, *COMMON]:
        register(target, plugin.forward(method, kind), kind)


def install_match(register, spec) -> None:
    """Plans made after SGLang's match (``Req.init_next_round_input``); SGLang's own tree."""

    def make(scheduler, policy, events, leader: bool):
        from patches.executor import PolicyExecutor

        return PolicyExecutor(policy, events, scheduler=scheduler)

    register(plugin.SCHEDULER_INIT, plugin.starter(spec, make), "after")
    _forward_all(register, [(plugin.REQ_MATCHED, "after_match", "after")])


def install_tree(register, spec) -> None:
    """The exact tree backend, chunk budgets of exactly the planned piece and, on CPU, batch-invariant decode
    and split-invariant prefill attention."""
    from patches.cpu import platform as cpu_platform
    from patches.exact_tree import planned_first_piece, register_backend, whole_piece_budget

    register_backend()
    register(plugin.ADD_CHUNKED_REQ, whole_piece_budget, "around")
    register(plugin.ADD_ONE_REQ, planned_first_piece, "around")
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

    register(plugin.SCHEDULER_INIT, plugin.starter(spec, make), "after")
    _forward_all(register, [(plugin.REQ_MATCHED, "after_match", "after")])


def install_enqueue(register, spec) -> None:
    """Plans made at enqueue, carried out by the policy's step carrier over ``ScrEngine``."""

    register(plugin.SCHEDULER_INIT, plugin.starter(spec, enqueue_executor), "after")
    _forward_all(register, [
        (plugin.ENQUEUE, "on_enqueue", "before"), (plugin.REQ_MATCHED, "init_round", "around"),
        (plugin.ADD_ONE_REQ, "add_one_req", "around"), (plugin.ADD_CHUNKED_REQ, "add_chunked_req", "around"),
        (plugin.PREFILL_RESULT, "after_prefill", "after"),
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
        raise plugin.refuse(f"--cache-policy {policy.name} cannot re-rotate keys on this model: {exc}") from None
    steps = policy.step_carrier(engine, logger, leader)
    return PolicyExecutor(policy, events, steps=steps, log=logger, scheduler=scheduler)
