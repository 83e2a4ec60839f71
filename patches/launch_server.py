"""``python -m patches.launch_server [--cache-policy NAME ...] <sglang.launch_server args>``.

Our flags (``--help`` lists them) and the settings the policy adds to SGLang's are worked out
(``serving/launch_args.py``, ``policy.registry``) before SGLang is imported. The resolved policy
travels to every SGLang process as one JSON env var (``CACHE_POLICY_SPEC``), which the plugin
(``patches.plugin``) reads in each of them. The policy is built once in this process (``parse``)
and held (``patches.process``): the serving profile, the plugin and the start-up refusals ask it,
none builds another. A bad name, key or value exits with status 2 and a message listing what is
valid. Before SGLang serves, its HTTP app gets the route table (``patches/routes.py``: closed
routes 404, admin routes behind ``--admin-api-key``) and the served request schema; settings that
would serve requests around them exit with status 2.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from patches import process
from policy import registry
from policy.api import CHECKPOINT_QUANTIZATION, KERNEL_SPLIT_FAILURES, SPLIT_INVARIANCE
from serving import checkpoint, launch_args, profile, refusals, request_limits
from serving.event_writer import write_startup_record
from serving.launch_args import LaunchError, add_server_defaults, apply_server_settings, snapshot_settings

logger = logging.getLogger("patches.launch_server")


def build_parser():
    """Our flags, with every registered policy and its settings' defaults in ``--help``."""
    return launch_args.build_parser({name: registry.setting_defaults(name) for name in registry.names()})


def parse(argv: list[str]) -> tuple[registry.PolicySpec, list[str]]:
    """Split our flags from SGLang's and resolve the policy, adding the SGLang settings it needs;
    exits with status 2 on bad input (and with 0 after printing ``--help``). The policy built here
    is this process's (``process.hold``); a setting that names a token builds it again with the id."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        events = os.path.abspath(args.cache_events) if args.cache_events else None
        spec = registry.PolicySpec.resolve(args.cache_policy, args.cache_policy_set, events)
        policy = spec.build()
        looked_up = resolve_token_settings(policy.token_lookups(), rest)
        if looked_up:
            spec = dataclasses.replace(spec, config={**spec.config, **looked_up})
            policy = spec.build()
        settings = {**policy.server_settings(), **snapshot_settings(policy.snapshot_budget(), rest)}
        rest = apply_server_settings(spec.policy, settings, rest)
        rest = add_server_defaults(policy.server_defaults(), rest)
    except (registry.PolicyError, LaunchError) as exc:
        parser.error(str(exc))
    process.hold(spec, policy)
    return spec, rest


def resolve_token_settings(lookups: dict[str, str], argv: list[str]) -> dict[str, int]:
    """``launch_args.token_ids`` with the tokenizer the command line serves (loaded only when a
    policy setting names a token)."""
    if not lookups:
        return {}
    from transformers import AutoTokenizer

    path = launch_args.tokenizer_path(argv)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code="--trust-remote-code" in argv)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"cannot load the tokenizer at {path} to look up {sorted(lookups)}: {exc}") from None
    return launch_args.token_ids(lookups, tokenizer)


def with_profile(spec: registry.PolicySpec, argv: list[str], sglang_argv: list[str],
                 cuda: bool) -> tuple[profile.ServingProfile, list[str], dict[str, str]]:
    """The ``--serving-profile`` of ``argv`` added to ``sglang_argv`` for a server on CUDA or CPU,
    and the environment it sets; exits with status 2 when the command line or the environment
    contradicts it."""
    parser = build_parser()
    args, _ = parser.parse_known_args(argv)
    chosen = profile.get(args.serving_profile)
    try:
        out = launch_args.apply_profile(chosen, spec.policy, process.policy_for(spec).server_settings(), sglang_argv,
                                        cuda)
        clash = profile.env_problems(chosen, os.environ, cuda)
        if clash:
            raise LaunchError(f"--serving-profile {chosen.name}: " + "; ".join(clash))
    except LaunchError as exc:
        parser.error(str(exc))
    return chosen, out, chosen.environment(cuda)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spec, sglang_argv = parse(argv)
    cuda = launch_args.on_cuda(sglang_argv, _torch_sees_a_gpu)
    chosen, sglang_argv, profile_env = with_profile(spec, argv, sglang_argv, cuda)
    os.environ.update(profile_env)  # inherited by every SGLang process
    os.environ[registry.SPEC_ENV] = spec.to_json()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    logger.info("cache policy %s, config %s, events %s", spec.policy, spec.config, spec.events_path)
    logger.info("serving profile %s on %s: %s%s", chosen.name, "CUDA" if cuda else "CPU",
                chosen.settings(cuda) or "nothing added", f", environment {profile_env}" if profile_env else "")
    _pass_trace_path(argv)
    _pass_request_limits(argv)

    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(sglang_argv)
    from patches import forced  # forced decoding needs SGLang's logit processors, without a flag

    forced.enable(server_args)
    from sglang.srt.entrypoints.http_server import app

    from patches import routes, validation  # the body schemas, served for clients that fuzz them

    _refuse_route_bypass(server_args)
    validation.serve_schema(app)
    from patches import request_bodies  # the generating routes read bodies within --max-request-body

    request_bodies.bound_bodies(app)
    routes.install(app, server_args.admin_api_key)  # closed 404, admin behind --admin-api-key
    _refuse_unsafe_settings(spec, server_args, chosen, cuda)
    write_startup_record(spec.events_path, spec.policy, spec.config, sglang_argv, chosen.name)
    refusal = refusals.open_channel()
    try:
        run_server(server_args)
    except BaseException:
        _exit_if_refused(refusal, spec.policy)
        raise
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
        if os.path.exists(refusal):
            os.unlink(refusal)


def _pass_trace_path(argv: list[str]) -> None:
    """``--cache-trace FILE`` travels to the scheduler processes as an env var (absent: removed)."""
    from patches.trace_writer import set_trace_env

    args, _ = build_parser().parse_known_args(argv)
    set_trace_env(args.cache_trace)
    if args.cache_trace:
        logger.info("cache trace %s", os.path.abspath(args.cache_trace))


def _pass_request_limits(argv: list[str]) -> request_limits.RequestLimits:
    """The request limits (``serving/request_limits.py``) travel to every SGLang process as one env
    var; a bad value exits with status 2 before SGLang is imported."""
    parser = build_parser()
    args, _ = parser.parse_known_args(argv)
    try:
        limits = launch_args.request_limits_of(args)
    except LaunchError as exc:
        parser.error(str(exc))
    os.environ[request_limits.LIMITS_ENV] = limits.to_json()
    logger.info("request limits %s", ", ".join(limits.shown(name) for name in request_limits.FLAGS))
    return limits


def _exit_if_refused(path: str, policy: str) -> None:
    """A scheduler refused the model (e.g. no text rotary for scr): one message, status 2."""
    reasons = refusals.reasons(path)
    if reasons:
        from sglang.srt.utils import kill_process_tree

        print(f"python -m patches.launch_server: error: --cache-policy {policy} refused to start:\n  - "
              + "\n  - ".join(reasons), file=sys.stderr, flush=True)
        kill_process_tree(os.getpid(), include_parent=False)
        os.unlink(path)
        os._exit(2)


def split_invariance_failures(server_args, cuda: bool) -> dict[str, str]:
    """Kernel -> what differed when a forward was split on the 64-token grid, on the device that
    will serve: on CUDA SGLang's own kernels at the served dtype and the model's per-rank shapes
    (``patches.kernel_selftest``, a few seconds); on CPU the CPU engine's measured property
    (``patches.cpu.platform.SPLIT_INVARIANCE``)."""
    if not cuda:
        from patches.cpu import platform as cpu_platform

        return dict(cpu_platform.SPLIT_INVARIANCE_FAILURES)
    from patches import kernel_selftest

    dtype = server_args.dtype if server_args.dtype not in (None, "auto") else "bfloat16"
    geometry = kernel_selftest.model_geometry(server_args.model_path, server_args.tp_size or 1)
    return kernel_selftest.split_invariance_failures("cuda", dtype, geometry=geometry)


def _torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _refuse_route_bypass(server_args) -> None:
    """Exit with status 2 when requests could reach SGLang around the route table and the request
    checks (``serving.route_policy.launch_problems``)."""
    from serving.route_policy import launch_problems

    problems = launch_problems(vars(server_args))
    if problems:
        print("python -m patches.launch_server: error: these settings would serve requests unchecked:\n  - "
              + "\n  - ".join(problems), file=sys.stderr)
        sys.exit(2)


def _refuse_unsafe_settings(spec: registry.PolicySpec, server_args, chosen: profile.ServingProfile,
                            cuda: bool) -> None:
    """Exit with status 2 when the resolved server settings break what the policy guarantees, or
    what the serving profile promises (SGLang may resolve a flag to something else)."""
    policy = process.policy_for(spec)
    resolved = {**vars(server_args), CHECKPOINT_QUANTIZATION: checkpoint.quantization(
        checkpoint.config_json(server_args.model_path, server_args.revision))}
    if SPLIT_INVARIANCE in policy.kernel_premises():
        resolved[KERNEL_SPLIT_FAILURES] = split_invariance_failures(server_args, cuda)
    problems = launch_args.resolved_setting_problems(policy.server_settings(), resolved)
    problems += [f"--serving-profile {chosen.name} {p}"
                 for p in launch_args.resolved_setting_problems(chosen.settings(cuda), resolved)]
    problems += policy.startup_problems(resolved, dict(os.environ), _torch_sees_a_gpu())
    if problems:
        print(f"python -m patches.launch_server: error: --cache-policy {spec.policy} cannot guarantee its "
              "results with these settings:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
