"""``python -m eval.traces SUBCOMMAND ...``: a small dispatcher; each subcommand's work lives in its module.

* ``synth --out FILE [--questions N] [--seed S] [--small] [--with-messages] [--tokenizer DIR]
  [--render default|preserve]``: BCP-shaped CLM agent traces from the scripted stand-in
  (``eval/traces/synth.py``).
* ``import --format chat|bcp-run INPUT... --out FILE [--render default|preserve] [--tokenizer qwen|DIR]
  [--queries FILE]``: real agent transcripts (chat JSONL, or BrowseComp-Plus run files) rendered and
  tokenized into a trace (``eval/traces/importer.py``).
"""

from __future__ import annotations

import sys

from eval import render
from pathlib import Path

from eval.cli_types import Parser, existing_dir, existing_file, int_at_least


def tokenizer_choice(text: str):
    return text if text in ("qwen", "tiny") else existing_dir(text)


def add_render(parser) -> None:
    parser.add_argument("--render", choices=render.RENDERINGS, default=render.DEFAULT,
                        help="how earlier turns are rendered (eval/render.py): default strips an assistant turn's "
                        "reasoning once a new real user turn follows (Qwen3.6's template), preserve keeps it "
                        "(chat_template_kwargs.preserve_thinking=true: old turns are never rewritten). Recorded "
                        "in every line's meta.render and in FILE.stats.json")


def add_synth(subparsers) -> None:
    from eval.traces import synth

    parser = subparsers.add_parser(
        "synth", help="BCP-shaped CLM agent traces without a GPU",
        description="Run the project's CLM agent (eval/bcp, mode clm) with a seeded, scripted stand-in for the "
                    "model over a synthetic corpus, render every call with Qwen3.6's tokenizer and the project's "
                    "chat template, and write the calls as a trace (eval/traces/format.py). A summary and the "
                    "set's statistics go to stdout, progress to stderr.")
    parser.add_argument("--out", required=True, metavar="FILE", help="trace file to write (JSONL)")
    parser.add_argument("--questions", type=int_at_least(1), default=synth.DEFAULT_QUESTIONS, metavar="N",
                        help="questions to run the agent on")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the corpus and the stand-in")
    parser.add_argument("--with-messages", action="store_true", help="store each call's message list too")
    parser.add_argument("--small", action="store_true",
                        help="the small preset (6,144-token budget, short documents; tests and smoke runs)")
    parser.add_argument("--tokenizer", type=tokenizer_choice, default="qwen", metavar="qwen|tiny|DIR",
                        help="qwen: Qwen3.5/3.6's own tokenizer with English text (default; eval/qwen_tokenizer.py); "
                        "tiny: the tiny model's 480-token tokenizer with its word salad (fast tests); or a "
                        "tokenizer directory. The set's statistics go beside the trace (FILE.stats.json).")
    add_render(parser)
    parser.set_defaults(run=synth.main)


def add_import(subparsers) -> None:
    from eval.traces import bcp_runs, importer

    parser = subparsers.add_parser(
        "import", help="real agent transcripts into a trace",
        description="Render and tokenize agent transcripts into a trace (eval/traces/format.py) and its statistics "
                    "(FILE.stats.json), like synth. Every assistant message is one LM call: its prompt is the chat "
                    "template's rendering of the messages before it, its completion the message as the model wrote "
                    "it. chat: JSONL, one {\"messages\": [...], \"tools\": [...]} conversation per line (OpenAI chat "
                    "form; eval/traces/transcripts.py). bcp-run: BrowseComp-Plus run files (one JSON object per "
                    "query, a JSONL of them, or a folder), each call rebuilt as the client that wrote the file made "
                    "it (eval/traces/bcp_runs.py). A bad input is one line naming the file and line, exit status 2; "
                    "nothing is written under --out unless the whole input imported.")
    parser.add_argument("--format", required=True, choices=("chat", "bcp-run"), help="what the inputs are")
    parser.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="transcript files (bcp-run: or folders)")
    parser.add_argument("--out", required=True, type=Path, metavar="FILE", help="trace file to write (JSONL)")
    add_render(parser)
    parser.add_argument("--tokenizer", type=tokenizer_choice, default="qwen", metavar="qwen|tiny|DIR",
                        help="the tokenizer and chat template (qwen: Qwen3.6's own, eval/qwen_tokenizer.py)")
    parser.add_argument("--queries", type=existing_file, default=None, metavar="FILE",
                        help="bcp-run: question texts, a TSV (query_id<TAB>query) or JSONL (query_id, query); "
                        f"without it each question is a placeholder of {bcp_runs.PLACEHOLDER_WORDS} English words")
    parser.add_argument("--bcp-client", choices=("auto", *bcp_runs.CLIENTS), default="auto",
                        help="bcp-run: the client that wrote the files (auto: from the keys each record carries)")
    parser.add_argument("--max-context", type=int_at_least(2), default=importer.DEFAULT_MAX_CONTEXT, metavar="N",
                        help="the served context: a call whose prompt + completion is longer is an error")
    parser.set_defaults(run=importer.main)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m eval.traces", description="Agent-run trace tools. Exit status: 0 done, "
                    "2 a usage error.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="{synth,import}")
    add_synth(subparsers)
    add_import(subparsers)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
