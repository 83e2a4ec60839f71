"""Hook sets for policies whose plans the ``PolicyExecutor`` runs: ``radix`` (and any plain
registered policy) after SGLang's own prefix match, ``exact`` inside its own radix tree.

Named by ``policy.registry`` (``install_plain``, ``install_exact``); ``patches.plugin`` calls the
one the selected policy names. Each hook only forwards to the executor, which contains failures.
"""

from __future__ import annotations

import logging

from patches import plugin

logger = logging.getLogger(__name__)


def install_plain(register, spec) -> None:
    """Plans made after SGLang's match (``Req.init_next_round_input``); SGLang's own tree."""
    _install_executor_hooks(register, spec, plans_in_tree=False)


def install_exact(register, spec) -> None:
    """The exact tree backend, whole-piece chunk budgets and, on CPU, batch-invariant decode."""
    from patches.cpu import platform as cpu_platform
    from patches.exact_tree import register_backend, whole_piece_budget

    register_backend()
    register(plugin.ADD_CHUNKED_REQ, whole_piece_budget, "around")
    if not cpu_platform.cuda_available():
        # A decode batch must not change a row's bits (GPU: --enable-deterministic-inference).
        from patches import row_invariance

        row_invariance.install(register)
    _install_executor_hooks(register, spec, plans_in_tree=True)


def _start_executor(scheduler, spec, plans_in_tree: bool) -> None:
    from patches.events import EventWriter
    from patches.executor import PolicyExecutor

    leader = plugin.is_leader(scheduler)
    events = EventWriter(spec.events_path) if spec.events_path is not None and leader else None
    executor = PolicyExecutor(spec.build(), events, plans_in_tree=plans_in_tree)
    plugin.set_executor(executor)
    if plans_in_tree:
        from patches.exact_tree import attach

        attach(scheduler, executor, spec)
    if leader:
        logger.info("cache policy %s started with config %s", spec.policy, spec.config)


def _install_executor_hooks(register, spec, plans_in_tree: bool) -> None:
    def after_scheduler_init(result, scheduler, server_args, *args, **kwargs):
        _start_executor(scheduler, spec, plans_in_tree)

    def after_match(result, req, tree_cache=None, *args, **kwargs):
        if tree_cache is not None and plugin.executor() is not None:
            plugin.executor().on_matched(req)

    def before_release(req, tree_cache, *args, **kwargs):
        if plugin.executor() is not None:
            plugin.executor().on_release(req)

    def before_idle(scheduler, *args, **kwargs):
        if plugin.executor() is not None:
            plugin.executor().on_idle(scheduler)

    def before_abort(scheduler, recv_req, *args, **kwargs):
        if plugin.executor() is not None:
            plugin.executor().on_abort(scheduler, recv_req)

    register(plugin.SCHEDULER_INIT, after_scheduler_init, "after")
    register(plugin.REQ_MATCHED, after_match, "after")
    register(plugin.RELEASE_KV, before_release, "before")
    register(plugin.SCHEDULER_IDLE, before_idle, "before")
    register(plugin.ABORT, before_abort, "before")
