"""The eval command lines read and fail alike (``eval/cli_types.py``): ``--run NAME=DIR`` and
``--set KEY=VALUE``, missing inputs as one-line usage errors (exit 2), exceptions mapped to exit
statuses by ``run_main``, and help that is complete and shows the defaults."""

from __future__ import annotations

import argparse
import importlib

import pytest

from eval.cli_types import (CheckFailed, HelpFormatter, Parser, UsageError, existing_dir, existing_file, failed,
                            key_value, name_list, run_main, run_spec, usage)


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
    ("piece_tokens=256", ("piece_tokens", "256")),
    (" mode =plain", ("mode", "plain")),  # the key is stripped
    ("search.k= 5", ("search.k", " 5")),  # the value is kept as given: the command types it
    ("a=b=c", ("a", "b=c")),  # only the first '=' splits
    ("nudge_ratios=", ("nudge_ratios", "")),  # an empty value is a value (YAML null, an empty string)
])
def test_key_value(text, expected):
    assert key_value(text) == expected


@pytest.mark.parametrize("text", ["piece_tokens", "=256", " =256", ""])
def test_key_value_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        key_value(text)


def test_key_value_is_a_repeatable_option(capsys):
    parser = Parser(prog="prog")
    parser.add_argument("--set", type=key_value, action="append", default=[])
    assert parser.parse_args(["--set", "a=1", "--set", "b=x=y"]).set == [("a", "1"), ("b", "x=y")]
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--set", "a"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "prog: error: argument --set: 'a': expected KEY=VALUE\n"


class Refused(Exception):
    pass


class ServerDown(RuntimeError):
    pass


class LocalUsage(UsageError, ValueError):  # how eval.soak / eval.fidelity declare theirs
    pass


def _raise(exc):
    def body():
        raise exc
    return body


RULES = (usage(Refused, label="refused"), failed(ServerDown, label="server error"), usage(KeyError, OSError))


@pytest.mark.parametrize("body, status, line", [
    pytest.param(lambda: 0, 0, "", id="done"),
    pytest.param(lambda: 1, 1, "", id="body-status-kept"),
    pytest.param(_raise(UsageError("--index: no such directory")), 2, "prog: error: --index: no such directory",
                 id="usage-error"),
    pytest.param(_raise(LocalUsage("bad scenario")), 2, "prog: error: bad scenario", id="usage-error-subclass"),
    pytest.param(_raise(CheckFailed("policy differs")), 1, "prog: check failed: policy differs", id="check-failed"),
    pytest.param(_raise(Refused("runs differ")), 2, "prog: refused: runs differ", id="rule-label"),
    pytest.param(_raise(ServerDown("HTTP 500")), 1, "prog: server error: HTTP 500", id="rule-failed"),
    pytest.param(_raise(FileNotFoundError("x.jsonl")), 2, "prog: error: x.jsonl", id="rule-subclass"),
    pytest.param(_raise(KeyError("rid")), 2, "prog: error: 'rid'", id="several-errors-one-rule"),
])
def test_run_main(body, status, line, capsys):
    assert run_main("prog", body, *RULES) == status
    err = capsys.readouterr().err
    assert err == (line + "\n" if line else "")


def test_run_main_first_matching_rule_wins(capsys):
    class Both(Refused, ServerDown):
        pass

    assert run_main("prog", _raise(Both("x")), *RULES) == 2
    assert capsys.readouterr().err == "prog: refused: x\n"
    # a command's rules come before the shared ones: a UsageError that is also a ValueError takes the command's
    assert run_main("prog", _raise(LocalUsage("y")), usage(ValueError, label="input")) == 2
    assert capsys.readouterr().err == "prog: input: y\n"


@pytest.mark.parametrize("exc", [ValueError("a bug"), AttributeError("x"), SystemExit(3)])
def test_run_main_lets_other_exceptions_through(exc):
    with pytest.raises(type(exc)):
        run_main("prog", _raise(exc), *RULES)


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
