"""BrowseComp-Plus run files as transcripts: each LM call rebuilt as the client that wrote the file made it.

A run file (``docs/eval.md`` §1.7) is one JSON object per query: ``query_id``, ``result`` (ordered
``reasoning`` / ``tool_call`` (``tool_name``, ``arguments``, ``output``) / ``output_text`` items),
``metadata`` and whatever else its client adds. The clients of texttron/BrowseComp-Plus
``search_agent/`` write one pretty-printed ``run_<time>.json`` per query; the published run
collections are JSONL, one object per line. An INPUT may be either, or a folder of them.

The clients differ in what they send (``CLIENTS``; ``--bcp-client auto`` tells them apart by the
keys the file carries, ``client_of``):

* ``tongyi`` (``tongyi_client.py``, Tongyi-DeepResearch-30B-A3B's ReAct loop): a system prompt with
  the search tool's signature and the date, the bare question as the user turn; each model reply
  (``<think>`` reasoning, then one JSON ``<tool_call>`` or an ``<answer>``) goes back as the
  assistant's text, each tool output as a user turn ``<tool_response>\\n...\\n</tool_response>``, so
  the chat template never strips reasoning. A run that hit the context limit had its last tool
  response replaced by a final-answer instruction (a plain user turn) before one last call.
* ``responses`` (``openai_client.py``, ``oss_client.py``, OpenAI's Responses API): the question in
  the query template, the tools as tool definitions (``search``, or ``local_knowledge_base_retrieval``
  with ``user_query``; ``get_document`` when the run called it); every output item, reasoning
  included, goes back into the next call, the tool outputs as function-call outputs.
* ``qwen-agent`` (``qwen_client.py``): the question in the query template, the MCP tools as tool
  definitions; its run files drop the reasoning of every turn that called a tool, so those turns
  are rebuilt without reasoning.

The fixed texts are this project's (``bcp_texts.py``: same place and length, not the clients'
words). Without ``--queries`` each question is a placeholder of ``PLACEHOLDER_WORDS`` English words
drawn per query id (``conversation.meta.question`` says which). Every guess is listed in
``GUESSES`` (printed into the statistics file) and in ``docs/benchmark.md``.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from eval.traces import bcp_texts
from eval.traces.transcripts import Conversation, TranscriptError, check_messages, json_object

CLIENTS = ("tongyi", "responses", "qwen-agent")
PLACEHOLDER_WORDS = 90  # a BrowseComp question is one paragraph of constraints (eval/traces/corpus.py: 60-120 words)
DEFAULT_DATE = "2025-08-15"  # the Tongyi prompt's date when the file name carries none (run_<YYYYMMDD>T...)
GUESSES = (
    "the clients' fixed texts: this project's words of the same length and place (bcp_texts.py)",
    "turn boundaries: a turn is its reasoning items, then its tool calls (one per turn for tongyi) or its answer",
    "tongyi: the reply text is '<think>\\nREASONING\\n</think>\\n\\n<tool_call>\\nJSON\\n</tool_call>' "
    "(or '<answer>ANSWER</answer>'), the call JSON re-serialised from the file's arguments",
    "tongyi: the prompt's date is the one in the run file's name, else " + DEFAULT_DATE,
    "responses / qwen-agent: the query template without get_document unless the run called get_document "
    "(the clients' default); no system prompt (the clients send none unless --system was given)",
    "qwen-agent: turns that called a tool have no reasoning (the client does not record it)",
    "reasoning given as several summary parts is joined with newlines",
)


@dataclass
class Turn:
    """One model reply: its reasoning, then its tool calls (name, arguments, output) or its answer."""

    reasoning: list[str] = field(default_factory=list)
    calls: list[tuple[str, dict, str]] = field(default_factory=list)
    answer: str | None = None


# ---- reading the files


def run_files(inputs: list[Path]) -> list[Path]:
    """The files to read: each INPUT, or a folder's ``*.json`` and ``*.jsonl`` files in name order."""
    out = []
    for path in inputs:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file())
            if not found:
                raise TranscriptError(f"{path}: no .json or .jsonl run files in this folder")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise TranscriptError(f"{path}: no such file or folder")
    return out


def read_records(path: Path) -> Iterator[tuple[dict, str]]:
    """(record, "FILE:LINE") for each query of one run file (one JSON object, or JSONL)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TranscriptError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        yield whole, f"{path}:1"
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield json_object(line, f"{path}:{number}", "a run record"), f"{path}:{number}"


def read_queries(path: Path) -> dict[str, str]:
    """Question texts by query id: a TSV (``id<TAB>text``, BrowseComp-Plus's queries.tsv) or JSONL
    (``query_id``/``id`` and ``query``/``text``/``question``)."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8", newline="") as f:
        first = f.readline()
        f.seek(0)
        if first.lstrip().startswith("{"):
            for number, line in enumerate(f, 1):
                if line.strip():
                    qid, text = _query_of(line, f"{path}:{number}")
                    out[qid] = text
            return out
        for number, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if row and any(cell.strip() for cell in row):
                if len(row) < 2:
                    raise TranscriptError(f"{path}:{number}: expected query_id<TAB>query")
                out[row[0].strip()] = row[1].strip()
    return out


def _query_of(line: str, where: str) -> tuple[str, str]:
    data = json_object(line, where, "a query line")
    qid = next((data[k] for k in ("query_id", "id", "qid") if k in data), None)
    text = next((data[k] for k in ("query", "text", "question") if k in data), None)
    if qid is None or not isinstance(text, str):
        raise TranscriptError(f"{where}: a query line needs query_id (or id) and query (or text, question)")
    return str(qid), text


# ---- the run's items, as turns


def text_of_output(value, where: str) -> str:
    """An item's ``output``: text, a list of texts, or a list of parts with ``text`` (the published files)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p if isinstance(p, str) else p.get("text") if isinstance(p, dict) else None for p in value]
        if all(isinstance(p, str) for p in parts):
            return "\n".join(p.strip() for p in parts if p.strip())
    raise TranscriptError(f"{where}: output must be text, a list of texts or a list of {{\"text\": ...}} parts")


def arguments_of(value, where: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise TranscriptError(f"{where}: arguments must be JSON object text") from None
    if not isinstance(value, dict):
        raise TranscriptError(f"{where}: arguments must be a JSON object")
    return value


def turns_of(result, where: str, one_call_per_turn: bool) -> list[Turn]:
    """The run's replies, in order (``GUESSES``: a turn is reasoning, then calls or an answer)."""
    if not isinstance(result, list):
        raise TranscriptError(f"{where}: result must be a list of items")
    turns = [Turn()]
    for index, item in enumerate(result):
        at = f"{where}: result item {index}"
        kind = item.get("type") if isinstance(item, dict) else None
        current = turns[-1]
        closed = current.answer is not None or bool(current.calls)
        if kind == "reasoning":
            if closed:
                turns.append(current := Turn())
            current.reasoning.append(text_of_output(item.get("output"), at))
        elif kind == "tool_call":
            if current.answer is not None or (one_call_per_turn and current.calls):
                turns.append(current := Turn())
            name = item.get("tool_name")
            if not isinstance(name, str) or not name:
                raise TranscriptError(f"{at}: tool_call without a tool_name")
            current.calls.append((name, arguments_of(item.get("arguments"), at), text_of_output(item.get("output"), at)))
        elif kind == "output_text":
            if closed:
                turns.append(current := Turn())
            current.answer = text_of_output(item.get("output"), at)
        else:
            raise TranscriptError(f"{at}: unknown item type {kind!r} (expected reasoning, tool_call or output_text)")
    return [t for t in turns if t.reasoning or t.calls or t.answer is not None]


# ---- which client, and its messages


def client_of(record: dict, where: str) -> str:
    """The client that wrote ``record``, from the keys it carries (``--bcp-client auto``)."""
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    if "tool_call_counts_all" in record or "presence_penalty" in metadata or "searcher_type" in metadata:
        return "tongyi"
    if "reasoning" in metadata:
        return "responses"
    if "max_output_tokens" in metadata:
        return "qwen-agent"
    raise TranscriptError(f"{where}: cannot tell which BrowseComp-Plus client wrote this record (no Tongyi, "
                          "Responses-API or Qwen-Agent metadata); name it with --bcp-client")


def reasoning_text(turn: Turn) -> str:
    return "\n".join(r.strip() for r in turn.reasoning if r.strip())


def react_messages(turns: list[Turn], question: str, date: str, hit_limit: bool) -> list[dict]:
    """Tongyi's ReAct conversation (module docstring)."""
    messages = [{"role": "system", "content": bcp_texts.REACT_SYSTEM + date}, {"role": "user", "content": question}]
    for turn in turns:
        head = f"<think>\n{reasoning_text(turn)}\n</think>\n\n"
        if turn.calls:
            name, arguments, output = turn.calls[0]
            call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            messages.append({"role": "assistant", "content": f"{head}<tool_call>\n{call}\n</tool_call>"})
            messages.append({"role": "user", "content": f"<tool_response>\n{output}\n</tool_response>"})
        else:
            answer = f"<answer>{turn.answer}</answer>" if turn.answer is not None else ""
            messages.append({"role": "assistant", "content": head + answer})
    if hit_limit and len(messages) > 3 and messages[-1]["role"] == "assistant" and messages[-2]["role"] == "user":
        messages[-2] = {"role": "user", "content": bcp_texts.REACT_FINAL}
    return messages


def tool_messages(turns: list[Turn], question: str, with_reasoning: bool) -> tuple[list[dict], list[dict]]:
    """The Responses-API / Qwen-Agent conversation and its tools (module docstring)."""
    names = {name for t in turns for name, _, _ in t.calls}
    get_document = "get_document" in names
    search = "local_knowledge_base_retrieval" if "local_knowledge_base_retrieval" in names else "search"
    tools = bcp_texts.tool_definitions(search, "user_query" if search != "search" else "query", get_document)
    messages = [{"role": "user", "content": bcp_texts.query_prompt(question, get_document)}]
    for number, turn in enumerate(turns):
        reply: dict = {"role": "assistant", "content": turn.answer or ""}
        if with_reasoning or not turn.calls:
            reply["reasoning_content"] = reasoning_text(turn)
        if turn.calls:
            reply["tool_calls"] = [{"type": "function", "id": f"call_{number}_{k}",
                                    "function": {"name": name, "arguments": arguments}}
                                   for k, (name, arguments, _) in enumerate(turn.calls)]
        messages.append(reply)
        messages += [{"role": "tool", "tool_call_id": f"call_{number}_{k}", "content": output}
                     for k, (_, _, output) in enumerate(turn.calls)]
    return messages, tools


def placeholder_question(qid: str) -> str:
    from eval.traces.corpus import prose, rng_for

    return prose(rng_for(0, f"bcp-question:{qid}"), PLACEHOLDER_WORDS, language="english")


def file_date(path: Path) -> str:
    found = re.search(r"run_(\d{4})(\d{2})(\d{2})T", path.name)
    return "-".join(found.groups()) if found else DEFAULT_DATE


def conversation(record: dict, where: str, path: Path, client: str, queries: dict[str, str] | None) -> Conversation:
    """One run record as a transcript (``client``: one of ``CLIENTS``, or ``auto``)."""
    client = client_of(record, where) if client == "auto" else client
    qid = record.get("query_id")
    qid = str(qid) if qid not in (None, "") else f"{path.stem}-{where.rsplit(':', 1)[1]}"
    if any(c.isspace() for c in qid):
        raise TranscriptError(f"{where}: query_id {qid!r} contains white space (it is part of a rid)")
    if queries is not None and qid not in queries:
        raise TranscriptError(f"{where}: query_id {qid} is not in the --queries file")
    question = queries[qid] if queries is not None else placeholder_question(qid)
    turns = turns_of(record.get("result"), where, one_call_per_turn=client == "tongyi")
    if not turns:
        raise TranscriptError(f"{where}: the run has no reasoning, tool call or answer: no LM call to import")
    tools = None
    if client == "tongyi":
        hit_limit = "token limit" in str(record.get("status", ""))
        messages = react_messages(turns, question, file_date(path), hit_limit)
    else:
        messages, tools = tool_messages(turns, question, with_reasoning=client == "responses")
    meta = {"client": client, "question": "given" if queries is not None else "placeholder",
            "status": record.get("status")}
    return Conversation(qid, check_messages(messages, where), tools, where, meta)


def read_runs(inputs: list[Path], client: str = "auto", queries: dict[str, str] | None = None) -> Iterator[Conversation]:
    """Every query of every run file among ``inputs`` (files or folders), as transcripts."""
    for path in run_files(inputs):
        for record, where in read_records(path):
            yield conversation(record, where, path, client, queries)
