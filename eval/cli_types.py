"""What the eval command lines share, so they read and fail alike.

* ``type=`` converters: a bad value (or a missing input file) is a one-line usage error naming the
  value, exit status 2, never a traceback;
* ``run_spec``: the one spelling of a named run, ``--run NAME=DIR``; ``name_list``: the one
  spelling of several policies, ``--policies radix,exact,scr``;
* ``key_value``: the one spelling of a repeatable setting, ``--set KEY=VALUE``;
* ``Parser`` / ``HelpFormatter``: help that shows every default, usage errors on one line, the
  one ``--server`` of the commands that talk to a loopback server;
* ``run_main``: runs a command's body and turns the exceptions it names into an exit status and
  one line on stderr (``UsageError`` -> 2, ``CheckFailed`` -> 1, and the rules a command adds).

Exit statuses across the commands: 0 done, 1 a check failed (or the server failed the run),
2 a usage error (flags, missing or unreadable input).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

USAGE = 2  # exit status of a usage error: flags, a missing or unreadable input
FAILED = 1  # exit status of a failed check (or a server that failed the run)


def int_at_least(minimum: int):
    """An integer >= ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be >= {minimum}")
        return value
    return parse


def positive_number(text: str) -> float:
    """A number > 0 (minutes, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return value


def name_list(choices):
    """A comma-separated, non-empty list of names out of ``choices`` (``--policies radix,scr``)."""
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)}")
        return names
    return parse


def run_spec(text: str) -> tuple[str, Path]:
    """``NAME=DIR``: one named run, as every command that takes runs spells it (``--run NAME=DIR``)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=DIR")
    return name, Path(path)


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE``: one repeatable setting (``--set``, ``--policy-set``), split at the first ``=``;
    the key is stripped, the value is kept as given (the command types it)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value


def existing_file(text: str) -> Path:
    """A path to a file that exists (an input): a missing one is a usage error, not a traceback."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


def existing_dir(text: str) -> Path:
    """A path to a directory that exists (an input)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return path


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions keep their paragraphs (a paragraph with an indented line, such as a command
    list, keeps its lines; the others are wrapped to the terminal); every option with a default
    shows it, unless its help already says ``default``. ``None`` and ``False`` are not shown: they
    mean "not given" and "off"."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip("\n").split("\n\n"):
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                                initial_indent=indent, subsequent_indent=indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == argparse.SUPPRESS or "default" in text.lower() or not action.option_strings
                or isinstance(default, list) and not default):
            return text
        shown = default if not isinstance(default, (list, tuple)) else ",".join(map(str, default))
        return f"{text} (default: {str(shown).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """The eval commands' parser: :class:`HelpFormatter`, and a usage error is one line
    (``PROG: error: MESSAGE``) with exit status 2, like the commands' own input errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_server(self) -> None:
        """``--server URL``: the loopback server a command talks to (checked by ``eval.fidelity``'s
        ``check_loopback`` when the command runs)."""
        self.add_argument("--server", required=True, metavar="URL", help="loopback base URL, e.g. http://127.0.0.1:30000")


class UsageError(Exception):
    """A usage error found after parsing (a bad input, a refused combination): one line, exit 2."""


class CheckFailed(Exception):
    """A check failed (the result or the server is not what it must be): one line, exit 1."""


@dataclass(frozen=True)
class ExitRule:
    """Exceptions of ``errors`` end the command with ``status`` and ``PROG: LABEL: MESSAGE``."""

    errors: tuple[type[BaseException], ...]
    status: int
    label: str = "error"


def usage(*errors: type[BaseException], label: str = "error") -> ExitRule:
    """``errors`` are usage errors: exit status 2."""
    return ExitRule(errors, USAGE, label)


def failed(*errors: type[BaseException], label: str = "error") -> ExitRule:
    """``errors`` are failed checks (or a server that failed the run): exit status 1."""
    return ExitRule(errors, FAILED, label)


DEFAULT_RULES = (usage(UsageError), failed(CheckFailed, label="check failed"))


def run_main(prog: str, body: Callable[[], int], *rules: ExitRule) -> int:
    """``body()``'s exit status; an exception one of ``rules`` (then :data:`DEFAULT_RULES`) names
    becomes that rule's status and one line on stderr, ``PROG: LABEL: MESSAGE``. The first rule
    that matches wins; any other exception propagates (a bug keeps its traceback)."""
    ordered = (*rules, *DEFAULT_RULES)
    try:
        return body()
    except tuple(error for rule in ordered for error in rule.errors) as exc:
        rule = next(rule for rule in ordered if isinstance(exc, rule.errors))
        print(f"{prog}: {rule.label}: {exc}", file=sys.stderr)
        return rule.status
