"""``python -m eval.traces import``: small transcripts written here, in both formats, imported and
checked against prompts rendered and tokenized by hand (Qwen3.6's tokenizer, the project's template
rules: ``eval/tiny_chat_template.jinja``), reasoning stripped or kept as the rendering says; calls =
assistant messages; every bad input an error naming file and line, with nothing left under --out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.traces import bcp_runs, read_trace
from eval.traces.__main__ import main
from eval.traces.importer import SegmentEncoder, tokenizer_for

S, E = "<|im_start|>", "<|im_end|>"
TOOL = {"type": "function", "function": {"name": "search", "description": "Find pages.",
                                         "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}
SEARCH_CALL = {"type": "function", "function": {"name": "search", "arguments": "{\"query\": \"who\"}"}}


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_for("qwen")  # the one the importer loads


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def run_import(tmp_path: Path, fmt: str, inputs: list[Path], *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out" / "trace.jsonl"
    status = main(["import", "--format", fmt, *map(str, inputs), "--out", str(out), *extra])
    return status, out


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---- chat


CHAT = {"id": "c1", "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Who wrote Emma?"},
    {"role": "assistant", "reasoning_content": "Look it up.", "content": "", "tool_calls": [SEARCH_CALL]},
    {"role": "tool", "content": "Jane Austen"},
    {"role": "assistant", "content": "<think>The page says so.</think>\n\nAusten."},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "reasoning": "Yes.", "content": "Yes."},
]}
CALL_TEXT = "<tool_call>\n<function=search>\n<parameter=query>\nwho\n</parameter>\n</function>\n</tool_call>"


def chat_prompts(render: str) -> tuple[list[str], list[str]]:
    """The three calls' prompts and completions, written out from the template's rules."""
    head = f"{S}system\nYou are terse.{E}\n{S}user\nWho wrote Emma?{E}\n"
    first = f"{S}assistant\n<think>\nLook it up.\n</think>\n\n{CALL_TEXT}{E}\n"
    first_stripped = f"{S}assistant\n{CALL_TEXT}{E}\n"
    tool = f"{S}user\n<tool_response>\nJane Austen\n</tool_response>{E}\n"
    second = f"{S}assistant\n<think>\nThe page says so.\n</think>\n\nAusten.{E}\n"
    second_stripped = f"{S}assistant\nAusten.{E}\n"
    ask = f"{S}user\nSure?{E}\n"
    gen = f"{S}assistant\n<think>\n"
    keep = render == "preserve"
    prompts = [head + gen, head + first + tool + gen,
               head + (first if keep else first_stripped) + tool + (second if keep else second_stripped) + ask + gen]
    completions = [f"Look it up.\n</think>\n\n{CALL_TEXT}{E}", f"The page says so.\n</think>\n\nAusten.{E}",
                   f"Yes.\n</think>\n\nYes.{E}"]
    return prompts, completions


@pytest.mark.parametrize("render", ["default", "preserve"])
def test_chat_calls_equal_the_hand_rendering(tmp_path, tokenizer, render):
    status, out = run_import(tmp_path, "chat", [write_jsonl(tmp_path / "t.jsonl", [CHAT])], "--render", render)
    assert status == 0
    calls = read_trace(out)
    assert len(calls) == 3 == sum(m["role"] == "assistant" for m in CHAT["messages"])
    prompts, completions = chat_prompts(render)
    assert [c.prompt_ids for c in calls] == [ids(tokenizer, p) for p in prompts]
    assert [c.completion_ids for c in calls] == [ids(tokenizer, t) for t in completions]
    assert [c.turn for c in calls] == [0, 1, 2] and {c.conversation for c in calls} == {"c1"}
    assert [c.kind for c in calls] == ["tool_call", "answer", "answer"]
    assert all(c.meta["render"] == render and c.meta["edited_from_turn"] is None for c in calls)
    assert [c.meta["message"] for c in calls] == [2, 4, 6]
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["calls"] == 3 and stats["render"] == render and stats["statistics"]["conversations"] == 1


def test_text_tool_calls_and_tool_response_user_turns_keep_reasoning(tmp_path, tokenizer):
    """Harness form: the reply's own text (``</think>`` without ``<think>``, as a model writes after the
    generation prompt), a JSON ``<tool_call>`` block, the result as a ``<tool_response>`` user turn;
    the template never strips the earlier reasoning, and tools are rendered into the system turn."""
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>'
    line = {"messages": [{"role": "user", "content": "Q?"},
                         {"role": "assistant", "content": f"think a\n</think>\n\n{call}"},
                         {"role": "user", "content": "<tool_response>\nr\n</tool_response>"},
                         {"role": "assistant", "content": "think b\n</think>\n\nA."}], "tools": [TOOL]}
    status, out = run_import(tmp_path, "chat", [write_jsonl(tmp_path / "t.jsonl", [line])])
    assert status == 0
    calls = read_trace(out)
    system = (f"{S}system\n# Tools\n\nThese functions are available to you:\n\n<tools>\n"
              + json.dumps(TOOL, ensure_ascii=False) + "\n</tools>\n\nTo call a function, reply with one block per "
              "call, in exactly this form:\n\n<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n"
              "</function>\n</tool_call>\n\nGive every required parameter. A value may span several lines. "
              f"Write nothing after the last call.{E}\n")
    second = (system + f"{S}user\nQ?{E}\n{S}assistant\n<think>\nthink a\n</think>\n\n{call}{E}\n"
              f"{S}user\n<tool_response>\nr\n</tool_response>{E}\n{S}assistant\n<think>\n")
    assert calls[1].prompt_ids == ids(tokenizer, second)
    assert calls[0].completion_ids == ids(tokenizer, f"think a\n</think>\n\n{call}{E}")
    assert calls[0].conversation == "t-1"  # no id: the file's stem and line


@pytest.mark.parametrize("line, message", [
    ("{not json", "t.jsonl:2: not JSON"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "t.jsonl:2: message 0: unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}]},
     "t.jsonl:2: message 1: a tool result with no call before it"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"},
                   {"role": "user", "content": "<tool_response>\nr\n</tool_response>"}]},
     "t.jsonl:2: message 2: a tool result with no call before it"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "s"},
                   {"role": "assistant", "content": "a"}]}, "message 1: a system message may only be the first"),
    ({"messages": [{"role": "user", "content": "x"}]}, "t.jsonl:2: no assistant message"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "[1]"}}]}]}, "message 1: tool call 0 (f): tool call function.arguments must be a JSON object"),
    ({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "a"}]},
     "message 0: content must be a string"),
    ({"messages": "x"}, "t.jsonl:2: messages must be a non-empty list"),
    ({"id": "a b", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}]},
     "id must be a non-empty string without white space"),
])
def test_bad_chat_input_names_file_and_line_and_leaves_nothing(tmp_path, capsys, line, message):
    good = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}]}
    status, out = run_import(tmp_path, "chat", [write_jsonl(tmp_path / "t.jsonl", [good, line])])
    assert status == 2
    assert message in capsys.readouterr().err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_call_longer_than_the_served_context_is_refused(tmp_path, capsys):
    line = {"messages": [{"role": "user", "content": "word " * 50}, {"role": "assistant", "content": "a"}]}
    status, out = run_import(tmp_path, "chat", [write_jsonl(tmp_path / "t.jsonl", [line])], "--max-context", "40")
    assert status == 2
    err = capsys.readouterr().err
    assert "t.jsonl:1: message 1: prompt" in err and "do not fit the served context of 40" in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_a_conversation_twice_is_refused(tmp_path, capsys):
    line = {"id": "same", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}]}
    status, _ = run_import(tmp_path, "chat", [write_jsonl(tmp_path / "t.jsonl", [line, line])])
    assert status == 2 and "t.jsonl:2: conversation 'same' also comes from" in capsys.readouterr().err


def test_an_earlier_trace_is_kept_when_the_import_fails(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [CHAT])
    status, out = run_import(tmp_path, "chat", [good])
    before = out.read_bytes()
    status, out = run_import(tmp_path, "chat", [good, write_jsonl(tmp_path / "bad.jsonl", ["{"])])
    assert status == 2 and out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir()) == ["trace.jsonl", "trace.jsonl.stats.json"]


def test_segment_encoder_equals_the_tokenizer(tokenizer):
    prompts, completions = chat_prompts("preserve")
    encoder = SegmentEncoder(tokenizer)
    assert encoder.split is not None
    for text in prompts + completions + ["caf\u0065\u0301 <think>x</think>  \n\n<|im_end|><|im_start|>"]:
        assert encoder.encode(text) == ids(tokenizer, text)
        assert encoder.encode(text) == ids(tokenizer, text)  # from its memory


# ---- BrowseComp-Plus run files


def tongyi_record(qid="42", status="completed", last_output="B"):
    return {"metadata": {"model": "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B", "presence_penalty": 1.1},
            "query_id": qid, "tool_call_counts": {"search": 2}, "tool_call_counts_all": {"search": 2},
            "status": status, "retrieved_docids": [],
            "result": [{"type": "reasoning", "tool_name": None, "arguments": None, "output": "plan"},
                       {"type": "tool_call", "tool_name": "search", "arguments": "{\"query\": \"a\"}", "output": "A"},
                       {"type": "reasoning", "tool_name": None, "arguments": None, "output": "more"},
                       {"type": "tool_call", "tool_name": "search", "arguments": "{\"query\": \"b\"}",
                        "output": last_output},
                       {"type": "reasoning", "tool_name": None, "arguments": None, "output": "done"},
                       {"type": "output_text", "tool_name": None, "arguments": None, "output": "Exact Answer: x"}]}


def react_call(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


def test_tongyi_run_file_calls_equal_the_hand_rendering(tmp_path, tokenizer):
    from eval.traces.bcp_texts import REACT_SYSTEM

    path = tmp_path / "run_20250903T010203000Z.json"
    path.write_text(json.dumps(tongyi_record(), indent=2))
    queries = tmp_path / "queries.tsv"
    queries.write_text("42\tWhich river?\n7\tOther\n")
    status, out = run_import(tmp_path, "bcp-run", [path], "--queries", str(queries))
    assert status == 0
    calls = read_trace(out)
    assert len(calls) == 3 and {c.conversation for c in calls} == {"42"}
    head = f"{S}system\n{REACT_SYSTEM}2025-09-03{E}\n{S}user\nWhich river?{E}\n"
    first = f"{S}assistant\n<think>\nplan\n</think>\n\n{react_call('a')}{E}\n"
    answer_a = f"{S}user\n<tool_response>\nA\n</tool_response>{E}\n"
    second = f"{S}assistant\n<think>\nmore\n</think>\n\n{react_call('b')}{E}\n"
    answer_b = f"{S}user\n<tool_response>\nB\n</tool_response>{E}\n"
    gen = f"{S}assistant\n<think>\n"
    expected = [head + gen, head + first + answer_a + gen, head + first + answer_a + second + answer_b + gen]
    assert [c.prompt_ids for c in calls] == [ids(tokenizer, p) for p in expected]  # reasoning never stripped
    assert calls[2].completion_ids == ids(tokenizer, f"done\n</think>\n\n<answer>Exact Answer: x</answer>{E}")
    assert calls[0].meta["client"] == "tongyi" and calls[0].meta["question"] == "given"
    stats = json.loads(Path(str(out) + ".stats.json").read_text())
    assert stats["bcp_clients"] == ["tongyi"] and stats["question_text"] == ["given"]
    assert any("bcp_texts.py" in g for g in stats["guesses"])


def test_tongyi_context_limit_replaces_the_last_tool_response(tmp_path, tokenizer):
    from eval.traces.bcp_texts import REACT_FINAL

    record = tongyi_record(status="generate an answer as token limit reached", last_output="")
    status, out = run_import(tmp_path, "bcp-run", [write_jsonl(tmp_path / "runs.jsonl", [record])])
    assert status == 0
    last = read_trace(out)[-1]
    text = tokenizer.decode(last.prompt_ids)
    assert text.endswith(f"{S}user\n{REACT_FINAL}{E}\n{S}assistant\n<think>\n")
    # a plain user turn: the template strips the reasoning of the earlier replies
    assert "<think>\nplan" not in text and react_call("a") in text


def responses_record():
    return {"metadata": {"model": "openai/gpt-oss-20b", "reasoning": {"effort": "high"}}, "query_id": 5,
            "status": "completed",
            "result": [{"type": "reasoning", "output": [{"type": "summary_text", "text": "s1"}]},
                       {"type": "tool_call", "tool_name": "local_knowledge_base_retrieval",
                        "arguments": "{\"user_query\": \"u\"}", "output": "[]"},
                       {"type": "tool_call", "tool_name": "get_document", "arguments": "{\"docid\": \"9\"}",
                        "output": "{\"docid\": \"9\"}"},
                       {"type": "reasoning", "output": ["s2"]},
                       {"type": "output_text", "output": "Exact Answer: y"}]}


def test_responses_run_file_sends_tools_and_keeps_reasoning(tmp_path, tokenizer):
    from eval.traces import bcp_texts

    status, out = run_import(tmp_path, "bcp-run", [write_jsonl(tmp_path / "r.jsonl", [responses_record()])])
    assert status == 0
    calls = read_trace(out)
    assert len(calls) == 2  # one reply with two parallel calls, then the answer
    text = tokenizer.decode(calls[1].prompt_ids)
    question = bcp_runs.placeholder_question("5")
    assert bcp_texts.query_prompt(question, get_document=True) in text
    assert '"name": "local_knowledge_base_retrieval"' in text and '"name": "get_document"' in text
    assert "<think>\ns1\n</think>" in text and "<parameter=user_query>\nu\n</parameter>" in text
    assert text.count("<tool_response>") == 2
    assert calls[0].meta["client"] == "responses" and calls[0].meta["question"] == "placeholder"


def test_qwen_agent_turns_with_tool_calls_have_no_reasoning(tmp_path, tokenizer):
    record = {"metadata": {"model": "Qwen/Qwen3-32B", "max_output_tokens": 10000}, "query_id": "9",
              "result": [{"type": "tool_call", "tool_name": "search", "arguments": {"query": "z"}, "output": "[]"},
                         {"type": "reasoning", "output": ["final thought"]},
                         {"type": "output_text", "output": "Exact Answer: z"}]}
    status, out = run_import(tmp_path, "bcp-run", [write_jsonl(tmp_path / "q.jsonl", [record])])
    assert status == 0
    calls = read_trace(out)
    assert tokenizer.decode(calls[0].completion_ids).startswith("\n</think>\n\n<tool_call>")
    assert tokenizer.decode(calls[1].completion_ids).startswith("final thought\n</think>")


@pytest.mark.parametrize("record, message", [
    ({"query_id": "1", "result": [{"type": "tool_call", "tool_name": "search", "output": "x"}]},
     "cannot tell which BrowseComp-Plus client"),
    ({"query_id": "1", "metadata": {"reasoning": None}, "result": [{"type": "image"}]},
     "result item 0: unknown item type 'image'"),
    ({"query_id": "1", "metadata": {"reasoning": None}, "result": [
        {"type": "tool_call", "tool_name": "search", "arguments": "nope"}]}, "result item 0: arguments must be JSON"),
    ({"query_id": "1", "metadata": {"reasoning": None}, "result": []}, "no LM call to import"),
    ({"query_id": "1", "metadata": {"reasoning": None}, "result": "x"}, "result must be a list"),
])
def test_bad_run_records_name_file_and_line(tmp_path, capsys, record, message):
    status, out = run_import(tmp_path, "bcp-run", [write_jsonl(tmp_path / "r.jsonl", [responses_record(), record])])
    assert status == 2
    err = capsys.readouterr().err
    assert "r.jsonl:2" in err and message in err
    assert not out.parent.exists()


def test_a_query_missing_from_the_queries_file_is_refused(tmp_path, capsys):
    queries = write_jsonl(tmp_path / "q.jsonl", [{"query_id": "other", "query": "text"}])
    status, _ = run_import(tmp_path, "bcp-run", [write_jsonl(tmp_path / "r.jsonl", [tongyi_record()])],
                           "--queries", str(queries))
    assert status == 2 and "query_id 42 is not in the --queries file" in capsys.readouterr().err


def test_run_folders_and_queries_files(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "run_b.json").write_text(json.dumps(tongyi_record("2"), indent=2))
    (folder / "run_a.json").write_text(json.dumps(tongyi_record("1"), indent=2))
    (folder / "notes.txt").write_text("not a run")
    assert [p.name for p in bcp_runs.run_files([folder])] == ["run_a.json", "run_b.json"]
    tsv = tmp_path / "q.tsv"
    tsv.write_text("1\tOne?\n\n2\tTwo?\n")
    jsonl = write_jsonl(tmp_path / "q.jsonl", [{"query_id": 1, "query": "One?"}, {"id": "2", "text": "Two?"}])
    assert bcp_runs.read_queries(tsv) == bcp_runs.read_queries(jsonl) == {"1": "One?", "2": "Two?"}


def test_turns_group_reasoning_calls_and_answers():
    items = [{"type": "reasoning", "output": "r1"}, {"type": "tool_call", "tool_name": "a", "output": "o1"},
             {"type": "tool_call", "tool_name": "b", "output": "o2"}, {"type": "reasoning", "output": "r2"},
             {"type": "reasoning", "output": "r3"}, {"type": "output_text", "output": "ans"}]
    parallel = bcp_runs.turns_of(items, "w", one_call_per_turn=False)
    assert [(t.reasoning, [c[0] for c in t.calls], t.answer) for t in parallel] == [
        (["r1"], ["a", "b"], None), (["r2", "r3"], [], "ans")]
    react = bcp_runs.turns_of(items, "w", one_call_per_turn=True)
    assert [[c[0] for c in t.calls] for t in react] == [["a"], ["b"], []]


def test_the_placeholder_question_is_per_query_and_of_typical_length():
    one, again, other = (bcp_runs.placeholder_question(q) for q in ("1", "1", "2"))
    assert one == again != other
    assert len(one.split()) == bcp_runs.PLACEHOLDER_WORDS


def test_the_clients_texts_are_as_long_as_theirs(tokenizer):
    """bcp_texts.py: this project's words, within 3 Qwen3.6 tokens of the clients' own texts."""
    from eval.traces import bcp_texts as b

    def n(text):
        return len(ids(tokenizer, text))

    lengths = {"react_system": n(b.REACT_SYSTEM + "2025-08-20"), "react_final": n(b.REACT_FINAL),
               "query": n(b.query_prompt("Q", False)) - n("Q"),
               "query_get_document": n(b.query_prompt("Q", True)) - n("Q"),
               "search_description": n(b.search_description(5)),
               "get_document_description": n(b.GET_DOCUMENT_DESCRIPTION)}
    for key, measured in b.MEASURED.items():
        assert abs(lengths[key] - measured) <= 3, (key, lengths[key], measured)
