"""The eval command lines read and fail alike (``eval/cli_types.py``): ``--run NAME=DIR``, missing
inputs as one-line usage errors (exit 2), and help that is complete and shows the defaults."""

from __future__ import annotations

import argparse
import importlib

import pytest

from eval.cli_types import HelpFormatter, Parser, existing_dir, existing_file, name_list, run_spec


@pytest.mark.parametrize("text, expected", [
    ("radix=runs/radix", ("radix", "runs/radix")),
    ("a=b=c", ("a", "b=c")),  # only the first '=' splits
])
def test_run_spec(text, expected):
    name, path = run_spec(text)
    assert (name, str(path)) == expected


@pytest.mark.parametrize("text", ["runs/radix", "=runs/radix", "radix=", ""])
def test_run_spec_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=DIR"):
        run_spec(text)


@pytest.mark.parametrize("text, expected", [
    ("radix,scr", ["radix", "scr"]),
    (" exact , radix ,", ["exact", "radix"]),
    ("", None), (",", None), ("radix,lru", None),
])
def test_name_list(text, expected):
    parse = name_list(("radix", "exact", "scr"))
    if expected is None:
        with pytest.raises(argparse.ArgumentTypeError, match="choose from radix, exact, scr"):
            parse(text)
    else:
        assert parse(text) == expected


def test_existing_inputs(tmp_path):
    (tmp_path / "f").write_text("x")
    assert existing_file(str(tmp_path / "f")) == tmp_path / "f"
    assert existing_dir(str(tmp_path)) == tmp_path
    for check, text, words in ((existing_file, tmp_path, "no such file"), (existing_file, tmp_path / "g", "no such file"),
                               (existing_dir, tmp_path / "f", "no such directory")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            check(str(text))


def test_parser_usage_error_is_one_line_and_status_2(tmp_path, capsys):
    parser = Parser(prog="prog")
    parser.add_argument("--events", type=existing_file)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--events", str(tmp_path / "missing")])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"prog: error: argument --events: {tmp_path / 'missing'}: no such file\n"


@pytest.mark.parametrize("default, help_text, shown", [
    (4, "parallel conversations", "parallel conversations (default: 4)"),
    (0, "seed", "seed (default: 0)"),  # 0 is a value, not "off"
    ("radix,exact", "policies", "policies (default: radix,exact)"),
    (None, "the server's log", "the server's log"),  # not given
    (False, "a switch", "a switch"),
    (5.0, "wait (default: 5 s)", "wait (default: 5 s)"),  # the help already says it
    ("50%", "share", "share (default: 50%%)"),  # argparse %-formats help strings
])
def test_help_formatter_shows_defaults_once(default, help_text, shown):
    action = argparse.Action(["--x"], "x", default=default, help=help_text)
    assert HelpFormatter("prog")._get_help_string(action) == shown


def test_help_formatter_keeps_command_lists_and_wraps_prose():
    text = "A sentence that goes on " * 6 + "\n\n    python -m x --a\n        --b\n\nEnd."
    filled = HelpFormatter("prog", width=60)._fill_text(text, 60, "")
    paragraphs = filled.split("\n\n")
    assert len(paragraphs) == 3 and all(len(line) <= 60 for line in paragraphs[0].splitlines())
    assert paragraphs[1] == "    python -m x --a\n        --b" and paragraphs[2] == "End."


COMMANDS = [  # (module, argv): every eval command line this project ships, and a subcommand each
    ("eval.report", ["ingest"]), ("eval.report", ["compare"]),
    ("eval.soak.__main__", []), ("eval.soak.policies", []), ("eval.fidelity.__main__", []),
    ("eval.replay.__main__", []), ("eval.traces.__main__", ["synth"]), ("eval.demo", []),
    ("eval.workload", []), ("eval.bench_policies", []), ("eval.bench_exact", []),
    ("eval.bench_batch_invariance", []), ("eval.bcp.fixtures", []),
]


@pytest.mark.parametrize("module, argv", COMMANDS, ids=[" ".join([m, *a]) for m, a in COMMANDS])
def test_help_is_complete(module, argv, capsys):
    main = importlib.import_module(module).main
    try:
        code = main([*argv, "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    text = capsys.readouterr().out
    options = [line for line in text.splitlines() if line.startswith("  --") and "--help" not in line]
    assert options, text
    assert "default: None" not in text and "(default: False)" not in text
    # every option says what it is: its line (or the next one) carries words after the flag
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("  --") and "--help" not in line:
            rest = line.split("  ", 2)[-1].strip() if len(line.strip().split()) > 2 else ""
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            assert rest or (following and not following.startswith("--")), (module, line)
