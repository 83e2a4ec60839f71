"""``python -m patches.launch_server <sglang.launch_server args> --cache-policy NAME [...]``.

Our flags are taken off the command line; everything else goes to SGLang unchanged:

  --cache-policy NAME        one of ``policy.registry.names()`` (default: radix)
  --cache-policy-set K=V     a policy setting; repeatable; a later K wins
  --cache-events FILE        append one JSON line per finished request (``patches/events.py``)

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
    return parser


def parse(argv: list[str]) -> tuple[registry.PolicySpec, list[str]]:
    """Split our flags from SGLang's and resolve the policy; exits with status 2 on bad input."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        events = os.path.abspath(args.cache_events) if args.cache_events else None
        spec = registry.PolicySpec.resolve(args.cache_policy, args.cache_policy_set, events)
    except registry.PolicyError as exc:
        parser.error(str(exc))
    return spec, rest


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spec, sglang_argv = parse(argv)
    os.environ[registry.SPEC_ENV] = spec.to_json()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    logger.info("cache policy %s, config %s, events %s", spec.policy, spec.config, spec.events_path)

    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(sglang_argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
