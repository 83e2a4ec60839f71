"""What the eval command lines share, so they read and fail alike.

* ``type=`` converters: a bad value (or a missing input file) is a one-line usage error naming the
  value, exit status 2, never a traceback;
* ``run_spec``: the one spelling of a named run, ``--run NAME=DIR``; ``name_list``: the one
  spelling of several policies, ``--policies radix,exact,scr``;
* ``Parser`` / ``HelpFormatter``: help that shows every default, usage errors on one line.

Exit statuses across the commands: 0 done, 1 a check failed (or the server failed the run),
2 a usage error (flags, missing or unreadable input).
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path


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
