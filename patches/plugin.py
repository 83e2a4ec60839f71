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

from patches import process, versions
from patches.process import fail

logger = logging.getLogger(__name__)

# One line per process, format fixed (tests and operators grep it).
INSTALLED_LINE = "[cache-policy] overlay installed pid={pid} cpu_platform={cpu} policy={policy} hooks={hooks}"

# What this process installed: our own record (``installed_targets``), never SGLang's registry state.
_state: dict = {"installed": False, "targets": (), "cpu": False}


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
        try:
            cpu_platform.install(register)
        except ValueError as exc:  # a bad CACHE_POLICY_CPU_START_METHOD
            raise fail(str(exc)) from None
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
    """Apply the registered hooks; stop the process unless every target exists and is wrapped.

    In place means: the target resolves, after ``apply_hooks``, to another object than before it
    (what we resolved ourselves, not SGLang's private record of what it patched)."""
    originals, unresolvable = {}, []
    for target in registered:
        try:
            originals[target] = _resolve(target)
        except (ImportError, AttributeError):
            unresolvable.append(target)
    if unresolvable:
        raise _hooks_failed("these hook targets do not exist", unresolvable, spec)
    hook_registry.apply_hooks()
    missing = [t for t in registered if _resolve(t) is originals[t]]
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


def _install_policy_hooks(register, spec) -> None:
    """The hook set for the way this policy plans (``CachePolicy.plans_at``, ``patches.hook_sets``),
    driving this process's one policy: built here (a bad spec stops every process, the launcher's
    included), or the one the launcher built and held (``process.hold``)."""
    policy = process.policy_for(spec)
    from patches import hook_sets
    from policy.registry import plans_at

    hook_sets.install(register, spec, policy, plans_at(spec.policy))


def _resolve(target: str):
    owner, attr = target.rsplit(".", 1)
    obj = pkgutil.resolve_name(owner)
    raw = obj.__dict__.get(attr) if isinstance(obj, type) else None
    return raw if raw is not None else getattr(obj, attr)
