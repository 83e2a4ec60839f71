"""Hook sets for policies whose plans the ``PolicyExecutor`` runs: ``radix`` (and any plain
registered policy) after SGLang's own prefix match, ``exact`` inside its own radix tree.

Named by ``policy.registry`` (``install_plain``, ``install_exact``); ``patches.plugin`` calls the
one the selected policy names. Each hook only forwards to the executor (``plugin.forward``), which
contains failures.
"""

from __future__ import annotations

from patches import plugin


def install_plain(register, spec) -> None:
    """Plans made after SGLang's match (``Req.init_next_round_input``); SGLang's own tree."""
    _install_executor_hooks(register, spec, plans_in_tree=False)


def install_exact(register, spec) -> None:
    """The exact tree backend, chunk budgets of exactly the planned piece and, on CPU, batch-invariant decode."""
    from patches.cpu import platform as cpu_platform
    from patches.exact_tree import planned_first_piece, register_backend, whole_piece_budget

    register_backend()
    register(plugin.ADD_CHUNKED_REQ, whole_piece_budget, "around")
    register(plugin.ADD_ONE_REQ, planned_first_piece, "around")
    if not cpu_platform.cuda_available():
        # A decode batch must not change a row's bits (GPU: --enable-deterministic-inference).
        from patches import row_invariance

        row_invariance.install(register)
    _install_executor_hooks(register, spec, plans_in_tree=True)


def _install_executor_hooks(register, spec, plans_in_tree: bool) -> None:
    def make(scheduler, policy, events, leader: bool):
        from patches.executor import PolicyExecutor

        executor = PolicyExecutor(policy, events, plans_in_tree=plans_in_tree)
        if plans_in_tree:
            from patches.exact_tree import attach

            attach(scheduler, executor, spec)
        return executor

    register(plugin.SCHEDULER_INIT, plugin.starter(spec, make), "after")
    for target, method, kind in [
        (plugin.REQ_MATCHED, "after_match", "after"), (plugin.RELEASE_KV, "on_release", "before"),
        (plugin.SCHEDULER_IDLE, "on_idle", "before"), (plugin.ABORT, "on_abort", "before"),
    ]:
        register(target, plugin.forward(method, kind), kind)
