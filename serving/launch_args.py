"""The launcher's command line: our flags, SGLang's flags, and the settings a policy adds to them.

``python -m patches.launch_server`` takes its own flags off the command line and hands the rest to
``sglang.launch_server``, after adding the SGLang settings the selected policy needs. Everything
here is argv arithmetic on names and values the launcher passes in (it asks ``policy.registry``),
so ``--help`` and every usage error come back before SGLang is imported (which takes about 20 s).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from typing import Callable, Mapping

from serving import profile, request_limits

PROG = "python -m patches.launch_server"

DESCRIPTION = (
    "Start SGLang 0.5.16 with a switchable prefix-cache policy. The flags below are this "
    "launcher's own. Every other argument goes to sglang.launch_server unchanged; run "
    f"'{PROG} --help-sglang' to list those."
)

SUMMARIES = {  # one line per built-in policy for --help; a registered policy may have none
    "radix": "SGLang's own prefix caching, through the overlay",
    "exact": "an exact checkpointed prefix cache for hybrid GDN + attention models",
    "scr": "Suffix Cache Reuse: unchanged spans of an edited prompt are relocated, not read again",
}


class LaunchError(ValueError):
    """A command line the selected policy cannot run with; the message says what to change."""


class _SglangHelp(argparse.Action):
    """``--help-sglang``: replace this process with ``sglang.launch_server --help``."""

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "sglang.launch_server", "--help"])


def build_parser(settings: Mapping[str, Mapping[str, object]]) -> argparse.ArgumentParser:
    """Our flags; ``settings`` maps each policy name to its settings' defaults (for ``--help``)."""
    names = sorted(settings)
    parser = argparse.ArgumentParser(
        prog=PROG, description=textwrap.fill(DESCRIPTION, 96), epilog=settings_epilog(settings),
        allow_abbrev=False, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cache-policy", default="radix", choices=names, metavar="NAME", help=(
        f"The prefix-cache policy to serve with, one of: {', '.join(names)}. "
        "Default: radix (SGLang's own prefix caching)."))
    parser.add_argument("--cache-policy-set", action="append", default=[], metavar="KEY=VALUE", help=(
        "Set one of the selected policy's settings (listed below with their defaults). Repeat the "
        "flag to set several; when a key is given twice, the later value wins. Default: none."))
    parser.add_argument("--cache-events", default=None, metavar="FILE", help=(
        "Append a start-up record, then one JSON line per finished request, to FILE (the format "
        "is documented in policy/events.py). Default: no events file."))
    parser.add_argument("--cache-trace", default=None, metavar="FILE", help=(
        "Append each finished request's rid, cache salt, prompt and completion token ids to FILE, "
        "one JSON line per request (eval/traces/record.py reads it). Default: no trace file."))
    parser.add_argument("--serving-profile", default=profile.DEFAULT, choices=list(profile.PROFILES),
                        metavar="NAME", help=(
        "The SGLang settings every arm of a comparison shares (serving/profile.py), added to the "
        "command line like a policy's: " + "; ".join(f"{p.name}: {p.summary}" for p in profile.PROFILES.values())
        + f". Default: {profile.DEFAULT}."))
    add_request_limit_flags(parser)
    parser.add_argument("-h", "--help", action="help", help="Show this help and exit.")
    parser.add_argument("--help-sglang", nargs=0, action=_SglangHelp, help=(
        "Show sglang.launch_server's own help (about 2,000 lines; importing SGLang takes about "
        "20 s) and exit."))
    return parser


# field of ``RequestLimits`` -> (metavar, what it bounds): the flags' help; the defaults and the reasons
# for them are in ``serving/request_limits.py``.
REQUEST_LIMIT_HELP: dict[str, tuple[str, str]] = {
    "max_body_bytes": ("SIZE", "The largest request body a generating route reads (bytes, or with K, M or G), "
                               "checked before it is parsed"),
    "max_prompts": ("N", "The most prompts one request may carry (a text or input_ids list, an OpenAI prompt list)"),
    "max_sequences": ("N", "The most sequences one request may start: its prompts times n"),
    "max_stop_regexes": ("N", "The most distinct stop_regex patterns one request may carry, all its prompts together"),
    "max_stop_regex_chars": ("N", "The most characters those stop_regex patterns may have together"),
    "stop_regex_max_mem": ("SIZE", "The memory RE2 may use to compile and match one stop_regex pattern "
                                   "(its max_mem); a pattern that needs more is refused"),
    "stop_regex_cache_bytes": ("SIZE", "The memory each server process may keep compiled stop_regex patterns in, "
                                 "counting each at the most it may hold"),
}


def add_request_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The request limits (``serving/request_limits.py``): what one request may cost. A request over
    one gets a 400 naming the flag."""
    group = parser.add_argument_group(
        "request limits", "What one request to /generate, /v1/completions or /v1/chat/completions may cost; "
        "a request over a limit gets a 400 naming the flag (docs/serving.md, Request limits).")
    defaults = dataclasses.asdict(request_limits.RequestLimits())
    for field, flag_name in request_limits.FLAGS.items():
        metavar, text = REQUEST_LIMIT_HELP[field]
        size = field in request_limits.SIZES
        shown = request_limits.format_size(defaults[field]) if size else defaults[field]
        group.add_argument(flag_name, dest=field, type=_size if size else _count, default=None, metavar=metavar,
                           help=f"{text}. Default: {shown}.")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        value = request_limits.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def request_limits_of(args: argparse.Namespace) -> request_limits.RequestLimits:
    """The limits the command line sets (the defaults where it sets none); raises LaunchError."""
    values = vars(args)
    given_values = {field: values[field] for field in request_limits.FLAGS if values.get(field) is not None}
    try:
        return request_limits.RequestLimits(**given_values)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def settings_epilog(settings: Mapping[str, Mapping[str, object]]) -> str:
    """Each policy's settings with their defaults, wrapped for the help text."""
    lines = ["Policies, and their settings for --cache-policy-set as KEY=default:"]
    for name in sorted(settings):
        listed = ", ".join(f"{key}={_shown(value)}" for key, value in settings[name].items())
        summary = f" ({SUMMARIES[name]})" if name in SUMMARIES else ""
        lines += textwrap.wrap(f"{name}{summary}: {listed or 'no settings'}", 96, initial_indent="  ",
                               subsequent_indent="    ")
    note = ("A policy also adds the SGLang flags it needs (exact, for instance, sets --chunked-prefill-size "
            "to piece_tokens); a command line that contradicts one is an error (exit status 2). scr also "
            "reads the authors' KVREUSE_* environment variables, which --cache-policy-set overrides.")
    return "\n".join(lines + [""] + textwrap.wrap(note, 96))


def _shown(value: object) -> object:
    return '""' if value == "" else value


def flag(field: str) -> str:
    """The command-line spelling of a ServerArgs field: ``page_size`` -> ``--page-size``."""
    return "--" + field.replace("_", "-")


def given(argv: list[str], flag: str) -> tuple[bool, str | None]:
    """Whether ``flag`` is on the command line, and its value (None for a bare flag)."""
    for index, item in enumerate(argv):
        if item == flag:
            following = argv[index + 1] if index + 1 < len(argv) else None
            return True, None if following is None or following.startswith("--") else following
        if item.startswith(flag + "="):
            return True, item.split("=", 1)[1]
    return False, None


def apply_server_settings(policy_name: str, settings: dict, argv: list[str], source: str | None = None) -> list[str]:
    """Add the SGLang settings a policy needs to ``argv``; a conflicting user value is an error.

    ``settings`` maps ServerArgs fields to values; True/False are store_true flags. ``source``
    names who requires them in the error (default ``--cache-policy NAME``).
    """
    source = source or f"--cache-policy {policy_name}"
    out = list(argv)
    for field, value in settings.items():
        name = flag(field)
        present, value_given = given(argv, name)
        if isinstance(value, bool):
            if present and not value:
                raise LaunchError(f"{source} cannot run with {name}")
            if value and not present:
                out.append(name)
            continue
        if present and value_given != str(value):
            raise LaunchError(
                f"{source} needs {name} {value}; the command line gives {name} {value_given}"
            )
        if not present:
            out += [name, str(value)]
    return out


def on_cuda(argv: list[str], cuda_available: Callable[[], bool]) -> bool:
    """Whether the server will run on CUDA: ``--device`` when given, else what SGLang picks
    (CUDA when torch sees a GPU; ``cuda_available`` is only called then)."""
    present, device = given(argv, "--device")
    if present and device:
        return device.split(":")[0] == "cuda"
    return cuda_available()


def apply_profile(chosen: profile.ServingProfile, policy_name: str, policy_settings: Mapping[str, object],
                  argv: list[str], cuda: bool) -> list[str]:
    """Add the serving profile's settings to ``argv`` (after the policy's). A profile that
    contradicts the policy's needs is a defect (tested for every policy); a command line that
    contradicts the profile is a usage error that names ``--serving-profile none`` as the way out."""
    clash = profile.conflicts(chosen, policy_settings, cuda)
    if clash:
        raise LaunchError(f"--serving-profile {chosen.name} contradicts --cache-policy {policy_name}: "
                          + "; ".join(clash))
    try:
        return apply_server_settings(policy_name, chosen.settings(cuda), argv,
                                     source=f"--serving-profile {chosen.name} (every arm's shared settings)")
    except LaunchError as exc:
        raise LaunchError(f"{exc}. Drop the flag, or pass --serving-profile none to serve without "
                          "the shared settings (the server is then not comparable with other arms)") from None


def add_server_defaults(defaults: dict, argv: list[str]) -> list[str]:
    """Add each of a policy's default SGLang settings that the command line does not give."""
    out = list(argv)
    for field, value in defaults.items():
        name = flag(field)
        if given(argv, name)[0]:
            continue
        if isinstance(value, bool):
            out += [name] if value else []
        else:
            out += [name, str(value)]
    return out


def snapshot_settings(budget: int, argv: list[str]) -> dict:
    """A policy's snapshot budget as SGLang's Mamba-pool size: snapshots + one working slot per
    running request. Fewer than two snapshots cannot serve one request (the lock holds one while
    the next is written). A budget of 0 leaves SGLang's own pool sizing."""
    if not budget:
        return {}
    if budget < 2:
        raise LaunchError(
            f"max_snapshots={budget} is too small for one running request: it needs at least 2"
        )
    present, running = given(argv, "--max-running-requests")
    if not present or running is None or not running.isdigit():
        raise LaunchError(
            "max_snapshots needs --max-running-requests N: each running request holds a working state "
            "slot besides the snapshots"
        )
    return {"max_mamba_cache_size": budget + int(running)}


def resolved_setting_problems(settings: dict, resolved: dict) -> list[str]:
    """Each required setting SGLang resolved to another value. The command-line check in
    ``apply_server_settings`` cannot see repeated flags (SGLang keeps the last), abbreviations or
    config files, so the launcher compares with what SGLang actually resolved."""
    return [f"needs {flag(field)} {value}, SGLang resolved {resolved.get(field)!r}"
            for field, value in settings.items() if resolved.get(field) != value]


def tokenizer_path(argv: list[str]) -> str:
    """The tokenizer SGLang will serve: ``--tokenizer-path``, else ``--model-path``."""
    for name in ("--tokenizer-path", "--model-path", "--model"):
        present, value = given(argv, name)
        if present and value:
            return value
    raise LaunchError("a policy setting names a token, but the command line gives no --model-path or --tokenizer-path")


def token_ids(lookups: dict[str, str], tokenizer) -> dict[str, int]:
    """Each config field of ``lookups`` (field -> token text) as the id ``tokenizer`` gives that token.

    A text that is not one token of the vocabulary is an error (an id found by splitting it into
    pieces would cut at the wrong place). ``tokenizer``: anything with ``convert_tokens_to_ids``,
    ``convert_ids_to_tokens`` and ``unk_token_id`` (a Hugging Face tokenizer)."""
    found = {}
    for field, text in lookups.items():
        token_id = tokenizer.convert_tokens_to_ids(text)
        if (not isinstance(token_id, int) or token_id == tokenizer.unk_token_id
                or tokenizer.convert_ids_to_tokens(token_id) != text):
            raise LaunchError(f"{field}: the served tokenizer has no token {text!r}; "
                              f"set {field.removesuffix('_id')} to a token it has, or {field} to an id")
        found[field] = token_id
    return found

