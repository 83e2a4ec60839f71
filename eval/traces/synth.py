"""BCP-shaped CLM agent traces without a GPU: ``python -m eval.traces synth --out FILE``.

The project's own CLM-style agent (``eval/bcp/agent.py``, mode ``clm`` with the ``bcp.yaml``
settings: budget 28,672, enforced limit 26,624, nudges at 25/50/75 %, urgent at 90 %, rollback
margin 2,048, the shrink gate) runs over a synthetic corpus with BrowseComp-Plus-like document
lengths (``corpus.py``; the real ``search``/``get_document`` tools with k = 5 and 512-token
snippets) and is driven by the seeded stand-in model of ``standin.py``. Prompts and completions
are the tokenizer's tokens under the project's chat template. ``--render`` picks how earlier turns
render (``eval/render.py``): ``default`` strips reasoning before the last real user turn, as
Qwen3.6's template does (every harness message is a user turn), ``preserve`` keeps it. One
``TraceCall`` per LM call goes to the trace file (``eval/traces/format.py``), each with the
rendering in ``meta.render``; the summary in ``FILE.stats.json`` records it too.

``radix_prefix_estimate`` predicts what SGLang's hybrid radix cache reuses per call, offline, so
the stand-in can be calibrated (only against radix; the exact and scr splits measured on replay
are predictions). It lives in ``tree_model.py``, which says what it assumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable


from eval import render as render_mod
from eval.bcp.agent import Agent
from eval.bcp.config import AgentConfig, load_config
from eval.bcp.retrieval import Searcher
from eval.bcp.tools import ToolBox
from eval.traces import corpus
from eval.traces.format import TraceCall
from eval.traces.standin import Renderer, StandIn, StandinParams
from eval.traces.stats import format_statistics, set_statistics
from eval.traces.tree_model import (DEFAULT_CHUNK, checkpoints, prefix_hashes,  # noqa: F401 - re-exported
                                    radix_prefix_estimate)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_QUESTIONS = 10  # the benchmark's default set (eval/bench_policies.py)


# ---- the tiny tokenizer


TOKENIZER_KINDS = ("qwen", "tiny")


def load_tokenizer(which: str | Path | None = "qwen", artifacts: Path = ROOT / ".artifacts"):
    """A tokenizer with the project's chat template: ``"qwen"`` (the default: Qwen3.5/3.6's own,
    ``eval/qwen_tokenizer.py``), ``"tiny"`` (the tiny model's 480-token BPE, for the fast tests;
    ``None`` means the same), or a tokenizer directory. Built once per content of its builder and
    chat template under ``artifacts`` (tokenizer files only; no weights needed)."""
    from transformers import AutoTokenizer

    from eval import qwen_tokenizer, tiny_model

    if which == "qwen":
        path = qwen_tokenizer.cached(artifacts)
    elif which in (None, "tiny"):
        sources = (Path(tiny_model.__file__), tiny_model.CHAT_TEMPLATE_PATH)
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
        path = Path(artifacts) / f"tiny-tokenizer-{digest}"
        if not (path / "tokenizer.json").is_file():
            scratch = path.with_name(f"{path.name}.partial-{os.getpid()}")
            tiny_model.build_tokenizer(scratch)
            try:
                scratch.rename(path)
            except OSError:  # another process finished the same build first
                shutil.rmtree(scratch, ignore_errors=True)
    else:
        path = Path(which)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.model_max_length = 1 << 30  # contexts run to ~27K tokens; silence the length warning
    return tokenizer


def language_for(tokenizer) -> str:
    """The corpus language that suits ``tokenizer``: English for a real vocabulary, the tiny
    tokenizer's word salad for its 480 tokens."""
    return "salad" if len(tokenizer) < 1000 else "english"


# ---- generation


class MemoEncoder:
    """The tokenizer for search snippets, remembering each document's ids: a question's searches
    return the same few documents again and again, and encoding a whole page is the slow part."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.memo: dict[str, list[int]] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text not in self.memo:
            self.memo[text] = list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return self.memo[text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


# The small preset (``--small``): a 6,144-token budget, short documents and snippets, 6-10 task
# steps, and a stand-in that edits on every late notice; nudges, edits and rollbacks still occur.
# For tests and smoke runs (the engine tier replays 2 questions of it under every policy).
SMALL_CONFIG = {"context_budget_tokens": 6144, "context_budget_reserve_tokens": 1024, "retry_edit_margin_tokens": 512,
                "observation_max_chars": 6000, "search.snippet_max_tokens": 96, "max_steps": 30}
SMALL_CORPUS = corpus.CorpusParams(docs_per_question=8, doc_words_mean=500)
SMALL_PARAMS = StandinParams(task_steps=(6, 10), p_get_document=0.35, p_ignore_urgent=0.5, p_replace=0.5,
                             reasoning_tokens_median=24, reasoning_sigma=0.6, reasoning_tokens_max=400,
                             p_edit_on_nudge=(0.0, 1.0, 1.0))


def synthesize_small(tokenizer, num_questions: int, seed: int = 0, with_messages: bool = False,
                     progress: Callable[[str], None] | None = None,
                     render: str = render_mod.DEFAULT) -> "Synthesis":
    language = language_for(tokenizer)
    return synthesize(tokenizer, num_questions, seed, params=replace(SMALL_PARAMS, language=language),
                      corpus_params=replace(SMALL_CORPUS, language=language),
                      config=rendered_config(render, SMALL_CONFIG), with_messages=with_messages, progress=progress)


def rendered_config(render: str = render_mod.DEFAULT, overrides: dict | None = None) -> AgentConfig:
    """``bcp.yaml`` with ``overrides`` and the ``preserve_thinking`` of rendering ``render``."""
    return load_config(overrides={**(overrides or {}), "preserve_thinking": render_mod.preserve_thinking(render)})


@dataclass
class Synthesis:
    calls: list[TraceCall]
    records: list[dict] = field(default_factory=list)  # the agent's per-question records
    render: str = render_mod.DEFAULT  # eval/render.py: how earlier turns were rendered


def synthesize(tokenizer, num_questions: int = DEFAULT_QUESTIONS, seed: int = 0, *,
               params: StandinParams = StandinParams(), corpus_params: corpus.CorpusParams = corpus.CorpusParams(),
               config: AgentConfig | None = None, with_messages: bool = False,
               progress: Callable[[str], None] | None = None) -> Synthesis:
    """Run the agent on ``num_questions`` synthetic questions, in order, one at a time. The
    rendering (``eval/render.py``) is the config's ``preserve_thinking``; every call records it
    in ``meta.render``."""
    config = config or load_config()
    if config.mode != "clm":
        raise ValueError("synthetic traces are of the CLM agent: mode must be clm")
    if params.language != corpus_params.language:
        raise ValueError(f"the stand-in writes {params.language}, the corpus is {corpus_params.language}")
    questions, docs = corpus.build(seed, num_questions, corpus_params)
    searcher = Searcher(docs, snippet_max_tokens=config.search.snippet_max_tokens,
                        tokenizer=MemoEncoder(tokenizer), tokenizer_name=getattr(tokenizer, "name_or_path", "tiny"))
    renderer = Renderer(tokenizer, config.chat_template_kwargs)
    standin = StandIn(renderer, params, seed, config.context_budget_tokens, with_messages)
    agent = Agent(config, standin, lambda: ToolBox(searcher, k=config.search.k,
                                                   get_document=config.search.get_document),
                  model_name="standin", clock=lambda: 0.0)
    records = []
    for question in questions:
        run = agent.run(question.qid, question.text, f"synth.{question.qid}")
        records.append(run.record)
        if progress:
            progress(f"{question.qid}: {len(run.record['rids'])} calls, status {run.record['status']}")
    render = render_mod.from_kwargs(config.chat_template_kwargs)
    for call in standin.calls:
        call.meta["render"] = render
    return Synthesis(standin.calls, records, render)


# ---- the summary


def summarize(synthesis: Synthesis, chunk: int = DEFAULT_CHUNK) -> dict:
    calls = synthesis.calls
    reused = radix_prefix_estimate(calls, chunk)
    prompt = sum(len(c.prompt_ids) for c in calls)
    stats = Counter()
    for record in synthesis.records:
        stats.update(record["agent_stats"])
    return {
        "render": synthesis.render,
        "questions": len(synthesis.records),
        "calls": len(calls),
        "prompt_tokens": prompt,
        "completion_tokens": sum(len(c.completion_ids) for c in calls),
        "max_prompt_tokens": max((len(c.prompt_ids) for c in calls), default=0),
        "kinds": dict(sorted(Counter(c.kind for c in calls).items())),
        "nudged_calls": sum(1 for c in calls if c.meta.get("nudged")),
        "nudges": stats["nudges"],
        "edits_accepted": stats["ctx_accepted"],
        "edits_rejected": stats["ctx_rejected"],
        "rollbacks": stats["retries_on_limit"],
        "statuses": dict(sorted(Counter(r["status"] for r in synthesis.records).items())),
        "radix_reused_tokens": sum(reused),
        "radix_prefix_share": round(sum(reused) / prompt, 4) if prompt else 0.0,
        "radix_chunk": chunk,
    }


def format_summary(summary: dict) -> str:
    lines = [f"{key}: {value}" for key, value in summary.items() if key != "radix_prefix_share"]
    lines.append(f"estimated radix prefix share of prompt tokens: {summary['radix_prefix_share']:.1%} "
                 f"(paper: 72.9%)")
    return "\n".join(lines)


def main(args) -> int:
    """The ``synth`` subcommand (arguments from ``eval/traces/__main__.py``)."""
    from eval.traces.format import write_trace

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    tokenizer = load_tokenizer(args.tokenizer)
    render = getattr(args, "render", render_mod.DEFAULT)
    if getattr(args, "small", False):
        synthesis = synthesize_small(tokenizer, args.questions, args.seed, args.with_messages, progress, render)
    else:
        language = language_for(tokenizer)
        synthesis = synthesize(tokenizer, args.questions, args.seed, params=StandinParams(language=language),
                               corpus_params=corpus.CorpusParams(language=language), config=rendered_config(render),
                               with_messages=args.with_messages, progress=progress)
    write_trace(synthesis.calls, args.out)
    summary = summarize(synthesis)
    statistics = set_statistics(synthesis.calls, tokenizer)
    Path(str(args.out) + ".stats.json").write_text(json.dumps({**summary, "statistics": statistics}, indent=2) + "\n")
    print(format_summary(summary))
    print(format_statistics(statistics))
    return 0
