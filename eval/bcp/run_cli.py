"""The command line of ``python -m eval.bcp.run`` (its flags and help); the commands themselves
are in ``eval/bcp/run.py``, their errors are ``eval.cli_types``' ``UsageError`` and ``CheckFailed``."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval import render
from eval.bcp.config import DEFAULT_CONFIG
from eval.cli_types import Parser, existing_dir, existing_file, int_at_least, key_value


def _policy_names() -> tuple[str, ...]:
    from policy import registry

    return registry.names()


def _add_run_inputs(run: argparse.ArgumentParser) -> None:
    run.add_argument("--dataset", metavar="DIR", type=existing_dir, required=True,
                     help="the BCP dataset directory (queries, qrels, corpus; see eval/bcp/data.py)")
    run.add_argument("--config", metavar="FILE", type=existing_file, default=DEFAULT_CONFIG,
                     help="the agent's YAML config (default: eval/bcp/bcp.yaml)")
    run.add_argument("--set", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key (the value is read as YAML; search.k etc. for the search "
                          "section); repeatable")
    run.add_argument("--render", choices=render.RENDERINGS, default=None,
                     help="how earlier turns are rendered (eval/render.py): default strips reasoning before the "
                          "last user turn (Qwen3.6's template), preserve keeps it (preserve_thinking=true). Sets "
                          "the config's preserve_thinking, refuses a --set preserve_thinking that says otherwise, "
                          "and is recorded in the manifest as render (unset: what the config says); compare "
                          "refuses to pair runs rendered differently")
    run.add_argument("--index", metavar="DIR", type=Path, default=None,
                     help="bm25s index directory: loaded when it holds this corpus's index, else built and "
                          "saved there (not saved when left out)")
    run.add_argument("--snippet-tokenizer", default="auto", metavar="auto|words|qwen|DIR",
                     help="what the search tool's snippets are cut by: 'auto' is the served model's tokenizer "
                          "when it is a local directory (else words, with a warning), 'words' whitespace words, "
                          "'qwen' Qwen3.5/3.6's own tokenizer (built offline, eval/qwen_tokenizer.py), DIR a local "
                          "tokenizer directory (BCP: Qwen3-0.6B's)")
    run.add_argument("--limit", metavar="N", type=int_at_least(1), default=None, help="only the first N questions")
    run.add_argument("--subset", metavar="N", type=int_at_least(1), default=None,
                     help="a stable seeded subset of N questions (applied before --limit)")
    run.add_argument("--subset-seed", metavar="SEED", type=int, default=0, help="the seed of --subset")


def _add_run_server(run: argparse.ArgumentParser) -> None:
    run.add_argument("--server", metavar="URL", required=True, help="base URL of the policy server, e.g. http://127.0.0.1:30000")
    run.add_argument("--policy", required=True, choices=_policy_names(),
                     help="the server's --cache-policy (checked against the events file's start-up record; "
                          "compare keys on it)")
    run.add_argument("--policy-set", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="a --cache-policy-set the server was started with, checked against its start-up "
                          "record; repeatable")
    run.add_argument("--events", metavar="FILE", type=Path, default=None,
                     help="the server's --cache-events file: its start-up record is checked and copied into the "
                          "manifest, the run's lines copied to OUT/events.jsonl")
    run.add_argument("--server-trace", metavar="FILE", type=Path, default=None,
                     help="the server's --cache-trace file: the run's calls with their exact token ids are "
                          "written to OUT/trace.jsonl")
    run.add_argument("--server-log", metavar="FILE", type=Path, default=None, help="the server's log, copied into the run at the end")
    run.add_argument("--model", metavar="NAME", default=None, help="model name to send (default: the one the server serves)")
    run.add_argument("--server-kind", default="real", choices=("real", "stub"),
                     help="a stub server's run is never a result")
    run.add_argument("--server-command", metavar="CMD", default=None, help="the server's launch command, recorded verbatim")


def _add_run_output(run: argparse.ArgumentParser) -> None:
    run.add_argument("--out", metavar="DIR", type=Path, required=True,
                     help="the run directory (created; an unfinished run there is resumed)")
    run.add_argument("--run-id", metavar="ID", default=None,
                     help="the rid prefix (default: the --out folder name, dots replaced by underscores)")
    run.add_argument("--concurrency", metavar="N", type=int_at_least(1), default=1,
                     help="questions in flight at once (same in every arm; at most the scr side sessions)")
    run.add_argument("--not-a-result", default=None, metavar="REASON",
                     help="stamp the run as not a result (tests, smoke runs)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_judge_flags(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--judge-server", metavar="URL", required=required, default=None,
                        help="base URL of the judge's OpenAI-compatible server"
                             + ("" if required else "; each question is judged as it finishes"))
    parser.add_argument("--judge-model", metavar="NAME", default=None, help="judge model name (default: the one the server serves)")
    parser.add_argument("--judge-max-tokens", metavar="N", type=int_at_least(1), default=4096,
                        help="the judge's output token limit")


def _add_finished_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", type=existing_dir, required=True, metavar="DIR",
                        help="a run directory written by `run`")
    parser.add_argument("--dataset", metavar="DIR", type=existing_dir, default=None,
                        help="the dataset directory (default: the one the manifest names)")


def build_parser(prog: str, description: str) -> Parser:
    parser = Parser(prog=prog, description=description)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run the agent over the questions (resumable)",
                              description="Run the agent over the questions; an interrupted run resumes.")
    _add_run_inputs(run)
    _add_run_server(run)
    _add_run_output(run)
    _add_judge_flags(run, required=False)
    judge = commands.add_parser("judge", help="judge a run's completed questions, then score",
                                description="Judge a run's completed questions (cached), then score the run.")
    _add_finished_run(judge)
    _add_judge_flags(judge, required=True)
    score = commands.add_parser("score", help="metrics from run files and judgments",
                                description="Compute a run's metrics from its run files and judgments.")
    _add_finished_run(score)
    return parser
