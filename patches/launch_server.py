"""``python -m patches.launch_server <sglang.launch_server args> --cache-policy NAME [...]``.

Our flags are taken off the command line; everything else goes to SGLang unchanged:

  --cache-policy NAME        one of ``policy.registry.names()`` (default: radix)
  --cache-policy-set K=V     a policy setting; repeatable; a later K wins
  --cache-events FILE        append one JSON line per finished request (``patches/events.py``)
  --cache-trace FILE         append the exact prompt/completion ids of each finished request
                             (``patches/trace_writer.py``; read by ``eval/traces/record.py``)

The resolved policy travels to every SGLang process as one JSON env var (``CACHE_POLICY_SPEC``),
which the plugin (``patches.plugin``) reads in each of them. A bad name, key or value exits with
status 2 and a message listing what is valid.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from policy import registry

logger = logging.getLogger("patches.launch_server")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m patches.launch_server",
        description="SGLang 0.5.16 with a switchable prefix-cache policy. "
        "All other arguments are passed to sglang.launch_server.",
        allow_abbrev=False,
        add_help=False,
    )
    parser.add_argument("--cache-policy", default="radix", choices=registry.names(), metavar="NAME",
                        help=f"prefix-cache policy: {', '.join(registry.names())} (default: radix)")
    parser.add_argument("--cache-policy-set", action="append", default=[], metavar="KEY=VALUE",
                        help="policy setting; repeatable")
    parser.add_argument("--cache-events", default=None, metavar="FILE",
                        help="append one JSON line per finished request to FILE")
    parser.add_argument("--cache-trace", default=None, metavar="FILE",
                        help="append each finished request's rid, cache salt, prompt and completion "
                        "token ids to FILE (one JSON line; eval/traces/record.py reads it)")
    return parser


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _given(argv: list[str], flag: str) -> tuple[bool, str | None]:
    """Whether ``flag`` is on the command line, and its value (None for a bare flag)."""
    for index, item in enumerate(argv):
        if item == flag:
            following = argv[index + 1] if index + 1 < len(argv) else None
            return True, None if following is None or following.startswith("--") else following
        if item.startswith(flag + "="):
            return True, item.split("=", 1)[1]
    return False, None


def apply_server_settings(policy_name: str, settings: dict, argv: list[str]) -> list[str]:
    """Add the SGLang settings a policy needs to ``argv``; a conflicting user value is an error.

    ``settings`` maps ServerArgs fields to values; True/False are store_true flags.
    """
    out = list(argv)
    for field, value in settings.items():
        flag = _flag(field)
        present, given = _given(argv, flag)
        if isinstance(value, bool):
            if present and not value:
                raise registry.PolicyError(f"--cache-policy {policy_name} cannot run with {flag}")
            if value and not present:
                out.append(flag)
            continue
        if present and given != str(value):
            raise registry.PolicyError(
                f"--cache-policy {policy_name} needs {flag} {value}; the command line gives {flag} {given}"
            )
        if not present:
            out += [flag, str(value)]
    return out


def add_server_defaults(defaults: dict, argv: list[str]) -> list[str]:
    """Add each of a policy's default SGLang settings that the command line does not give."""
    out = list(argv)
    for field, value in defaults.items():
        flag = _flag(field)
        if _given(argv, flag)[0]:
            continue
        if isinstance(value, bool):
            out += [flag] if value else []
        else:
            out += [flag, str(value)]
    return out


def parse(argv: list[str]) -> tuple[registry.PolicySpec, list[str]]:
    """Split our flags from SGLang's and resolve the policy; exits with status 2 on bad input."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        events = os.path.abspath(args.cache_events) if args.cache_events else None
        spec = registry.PolicySpec.resolve(args.cache_policy, args.cache_policy_set, events)
        policy = spec.build()
        settings = policy.server_settings() if hasattr(policy, "server_settings") else {}
        settings.update(_snapshot_budget(policy, rest))
        rest = apply_server_settings(spec.policy, settings, rest)
        rest = add_server_defaults(policy.server_defaults() if hasattr(policy, "server_defaults") else {}, rest)
    except registry.PolicyError as exc:
        parser.error(str(exc))
    return spec, rest


def _snapshot_budget(policy, argv: list[str]) -> dict:
    """``max_snapshots`` (exact) becomes SGLang's Mamba-pool size: snapshots + one working slot per
    running request. Fewer than two snapshots cannot serve one request (the lock holds one while
    the next is written)."""
    budget = getattr(policy.config, "max_snapshots", 0)
    if not budget:
        return {}
    if budget < 2:
        raise registry.PolicyError(
            f"max_snapshots={budget} is too small for one running request: it needs at least 2"
        )
    present, running = _given(argv, "--max-running-requests")
    if not present or running is None or not running.isdigit():
        raise registry.PolicyError(
            "max_snapshots needs --max-running-requests N: each running request holds a working state "
            "slot besides the snapshots"
        )
    return {"max_mamba_cache_size": budget + int(running)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spec, sglang_argv = parse(argv)
    os.environ[registry.SPEC_ENV] = spec.to_json()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    logger.info("cache policy %s, config %s, events %s", spec.policy, spec.config, spec.events_path)
    _pass_trace_path(argv)

    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(sglang_argv)
    from patches import forced  # forced decoding needs SGLang's logit processors, without a flag

    forced.enable(server_args)
    _refuse_unsafe_settings(spec, server_args)
    refusal = _refusal_file()
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


def _refusal_file() -> str:
    """Where a scheduler writes why it refused to start (``patches.plugin.refuse``)."""
    import tempfile

    from patches.plugin import REFUSAL_ENV

    handle, path = tempfile.mkstemp(prefix="cache-policy-refusal-", suffix=".txt")
    os.close(handle)
    os.environ[REFUSAL_ENV] = path
    return path


def _exit_if_refused(path: str, policy: str) -> None:
    """A scheduler refused the model (e.g. no text rotary for scr): one message, status 2."""
    try:
        with open(path) as f:
            reasons = sorted(set(filter(None, f.read().splitlines())))
    except OSError:
        return
    if reasons:
        from sglang.srt.utils import kill_process_tree

        print(f"python -m patches.launch_server: error: --cache-policy {policy} refused to start:\n  - "
              + "\n  - ".join(reasons), file=sys.stderr, flush=True)
        kill_process_tree(os.getpid(), include_parent=False)
        os.unlink(path)
        os._exit(2)


def _refuse_unsafe_settings(spec: registry.PolicySpec, server_args) -> None:
    """Exit with status 2 when the resolved server settings break what the policy guarantees."""
    import torch

    policy = spec.build()
    resolved = vars(server_args)
    problems = []
    # The command-line check in ``apply_server_settings`` cannot see repeated flags (SGLang keeps
    # the last), abbreviations or config files: compare with what SGLang actually resolved.
    settings = policy.server_settings() if hasattr(policy, "server_settings") else {}
    for field, value in settings.items():
        if resolved.get(field) != value:
            problems.append(f"needs {_flag(field)} {value}, SGLang resolved {resolved.get(field)!r}")
    if hasattr(policy, "startup_problems"):
        problems += policy.startup_problems(resolved, dict(os.environ), torch.cuda.is_available())
    if problems:
        print(f"python -m patches.launch_server: error: --cache-policy {spec.policy} cannot guarantee its "
              "results with these settings:\n  - " + "\n  - ".join(problems), file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
