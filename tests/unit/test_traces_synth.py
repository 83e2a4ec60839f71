"""Synthetic BCP-shaped CLM traces (``python -m eval.traces synth``): the generator is deterministic
per seed, the agent's nudges, edits and rollbacks occur, every line is a valid trace line, tokens
are the tiny template's, and the offline radix estimate follows its stated rules.

The generator runs on a shrunken budget and corpus (``SMALL_*``) so each run takes well under a
second; the default set's numbers are checked by running the CLI, not here."""

from __future__ import annotations

import dataclasses
import io
import json
import random

import numpy as np
import pytest

from eval.bcp.config import load_config
from eval.traces import corpus, standin, synth
from eval.traces.format import TraceCall, read_trace, write_trace
from eval.traces.standin import Memory, StandinParams

# The fast tests run on the tiny tokenizer with its word salad (eval/traces/corpus.py); the English
# text and Qwen3.6's tokenizer have their own tests below and in test_qwen_tokenizer.py.
SMALL_CONFIG = synth.SMALL_CONFIG
SMALL_CORPUS = dataclasses.replace(synth.SMALL_CORPUS, language="salad")
SMALL_PARAMS = dataclasses.replace(synth.SMALL_PARAMS, language="salad")


@pytest.fixture(scope="module")
def tokenizer():
    return synth.load_tokenizer("tiny")


def small_run(tokenizer, seed: int, with_messages: bool = False, render: str = "default") -> synth.Synthesis:
    return synth.synthesize(tokenizer, 3, seed, params=SMALL_PARAMS, corpus_params=SMALL_CORPUS,
                            config=synth.rendered_config(render, SMALL_CONFIG), with_messages=with_messages)


@pytest.fixture(scope="module")
def run0(tokenizer):
    return small_run(tokenizer, 0, with_messages=True)


def trace_bytes(calls) -> str:
    out = io.StringIO()
    write_trace(calls, out)
    return out.getvalue()


# ---- the generator


def test_same_seed_same_bytes_and_another_seed_differs(tokenizer):
    first, second = small_run(tokenizer, 0), small_run(tokenizer, 0)
    assert trace_bytes(first.calls) == trace_bytes(second.calls)
    assert trace_bytes(small_run(tokenizer, 1).calls) != trace_bytes(first.calls)


def test_nudges_edits_and_rollbacks_occur(run0):
    summary = synth.summarize(run0)
    assert summary["nudges"] > 0 and summary["nudged_calls"] > 0
    assert summary["edits_accepted"] > 0 and summary["kinds"].get("edit", 0) > 0
    assert summary["rollbacks"] > 0 and any(c.meta["rolled_back"] for c in run0.calls)
    assert any(c.meta["edited_from_turn"] is not None and not c.meta["rolled_back"] for c in run0.calls)
    assert summary["statuses"] == {"completed": 3} and summary["kinds"]["submit"] == 3
    # a replace edit (a shortened passage) was accepted somewhere
    assert any("[summary:" in json.dumps(c.messages) for c in run0.calls)


def test_every_line_parses_with_the_trace_format_in_turn_order(run0, tmp_path):
    path = tmp_path / "trace.jsonl"
    write_trace(run0.calls, path)
    calls = read_trace(path)  # checks every field and the turn order per conversation
    assert [c.conversation for c in calls][0] == "q0000"
    for qid, record in zip(("q0000", "q0001", "q0002"), run0.records):
        turns = [c.turn for c in calls if c.conversation == qid]
        assert turns == list(range(len(record["rids"])))
    assert all(c.cache_salt is None and c.kind in ("search", "get_document", "edit", "submit") for c in calls)
    assert all(set(c.meta) == {"nudged", "rolled_back", "edited_from_turn", "render"} for c in calls)
    assert {c.meta["render"] for c in calls} == {"default"} and synth.summarize(run0)["render"] == "default"


def test_messages_are_left_out_unless_asked(tokenizer):
    line = json.loads(trace_bytes(small_run(tokenizer, 2).calls[:1]))
    assert "messages" not in line and "chat_template_kwargs" not in line


def test_usage_matches_the_recorded_tokens(run0):
    total = sum(r["tokens"]["prompt"] for r in run0.records)
    assert total == sum(len(c.prompt_ids) for c in run0.calls)
    assert sum(r["tokens"]["completion"] for r in run0.records) == sum(len(c.completion_ids) for c in run0.calls)


def test_an_appended_turn_extends_the_previous_prompt_and_completion(tokenizer):
    """What the estimator assumes: after a plain tool result the next prompt starts with the
    previous prompt + completion, re-tokenized to the same ids (a roomy budget: no notices)."""
    roomy = load_config(overrides={**SMALL_CONFIG, "context_budget_tokens": 65536,
                                   "context_budget_reserve_tokens": 2048})
    run = synth.synthesize(tokenizer, 2, 0, params=SMALL_PARAMS, corpus_params=SMALL_CORPUS, config=roomy)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    previous, checked = {}, 0
    for call in run.calls:
        assert call.completion_ids[-1] == eos
        last = previous.get(call.conversation)
        if last is not None and not call.meta["nudged"] and call.meta["edited_from_turn"] is None:
            sequence = last.prompt_ids + last.completion_ids
            assert call.prompt_ids[:len(sequence)] == sequence
            checked += 1
        previous[call.conversation] = call
    assert checked == len(run.calls) - 2


def test_a_user_note_strips_earlier_reasoning(run0, tokenizer):
    """The template drops reasoning before the last real user turn: a nudged call no longer holds
    the previous call's reasoning."""
    previous, seen = {}, 0
    for call in run0.calls:
        last = previous.get(call.conversation)
        if last is not None and call.meta["nudged"] and call.meta["edited_from_turn"] is None:
            text = tokenizer.decode(last.completion_ids)
            reasoning = text.split("</think>")[0].strip()
            assert reasoning and reasoning not in tokenizer.decode(call.prompt_ids)
            seen += 1
        previous[call.conversation] = call
    assert seen > 0


def reasoning_after_a_note(run) -> list[tuple[str, list[int]]]:
    """(the previous call's reasoning, this prompt) for every call that follows a harness note
    (a user turn) with no edit or rollback in between: where the default rendering strips."""
    previous, pairs = {}, []
    for call in run.calls:
        last = previous.get(call.conversation)
        if last is not None and call.meta["nudged"] and call.meta["edited_from_turn"] is None \
                and not call.meta["rolled_back"]:
            pairs.append((last, call))
        previous[call.conversation] = call
    return pairs


def test_the_preserve_rendering_keeps_earlier_reasoning_and_only_grows(tokenizer, run0):
    """--render preserve (preserve_thinking=true): after a harness note the previous call's
    reasoning is still in the prompt, which starts with the previous prompt + completion; the
    default rendering of the same seed strips it and rewrites the middle of the prompt."""
    preserved = small_run(tokenizer, 0, render="preserve")
    assert {c.meta["render"] for c in preserved.calls} == {"preserve"}
    assert synth.summarize(preserved)["render"] == "preserve" and preserved.render == "preserve"
    for run, kept in ((preserved, True), (run0, False)):
        pairs = reasoning_after_a_note(run)
        assert len(pairs) >= 3
        for last, call in pairs:
            reasoning = tokenizer.decode(last.completion_ids).split("</think>")[0].strip()
            assert reasoning and (reasoning in tokenizer.decode(call.prompt_ids)) is kept
            sequence = last.prompt_ids + last.completion_ids
            assert (call.prompt_ids[:len(sequence)] == sequence) is kept


# ---- rendering


def test_prompt_ids_are_the_templates_tokenized_prompt(tokenizer):
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "", "reasoning_content": "why",
                 "tool_calls": [{"id": "", "type": "function",
                                 "function": {"name": "search", "arguments": json.dumps({"query": "a b"})}}]},
                {"role": "tool", "content": "[]"}]
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    renderer = standin.Renderer(tokenizer, {"enable_thinking": True, "preserve_thinking": False})
    text, ids = renderer.prompt(messages, tools)
    expected = tokenizer.apply_chat_template(standin.template_messages(messages), tools=tools, tokenize=True,
                                             return_dict=True, add_generation_prompt=True, enable_thinking=True,
                                             preserve_thinking=False)["input_ids"]
    assert ids == list(expected)
    assert "<parameter=query>\na b\n</parameter>" in text  # arguments rendered as a mapping, as SGLang does
    reply = {"role": "assistant", "content": "", "reasoning_content": "next",
             "tool_calls": [{"id": "", "type": "function",
                             "function": {"name": "submit", "arguments": json.dumps({"answer": "x"})}}]}
    completion = tokenizer.decode(renderer.completion(text, messages, tools, reply))
    assert completion == ("next\n</think>\n\n<tool_call>\n<function=submit>\n<parameter=answer>\nx\n"
                          "</parameter>\n</function>\n</tool_call><|im_end|>")


def test_corpus_text_reads_at_a_realistic_chars_per_token(tokenizer):
    text = corpus.salad(random.Random(0), 4000)
    assert 3.4 <= corpus.chars_per_token(tokenizer, text) <= 4.2


def test_corpus_and_questions_are_deterministic_and_findable():
    questions, docs = corpus.build(5, 2, SMALL_CORPUS)
    again, docs_again = corpus.build(5, 2, SMALL_CORPUS)
    assert questions == again and docs == docs_again
    task = f"Question: {questions[1].text}\n\nWhen you are done"
    assert set(standin.question_terms(task, "salad")) == set(questions[1].terms)
    assert all(any(t in docs[d].text for t in questions[1].terms) for d in questions[1].docids)


# ---- deciding


def context(*notes: str, groups: int = 3, ledger: bool = False) -> list[dict]:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Question: value osithtor\n\nx"}]
    if ledger:
        messages.append({"role": "user", "content": "[ROLLBACK LEDGER] went over"})
    for i in range(groups):
        args = json.dumps({"query": f"q{i}"})
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "", "type": "function", "function": {"name": "search", "arguments": args}}]})
        messages.append({"role": "tool", "content": json.dumps([{"docid": str(100 + i), "snippet": "value " * 50}])})
    messages += [{"role": "user", "content": n} for n in notes]
    return messages


def memory(steps_done: int = 0, planned: int = 10) -> Memory:
    return Memory(random.Random(0), planned, steps_done)


@pytest.mark.parametrize("notes, params, steps_done, ledger, expected", [
    pytest.param((), StandinParams(p_get_document=0.0), 0, False, "search", id="plain step searches"),
    pytest.param((), StandinParams(p_get_document=1.0), 0, False, "get_document", id="reads a seen document"),
    pytest.param((), StandinParams(), 10, False, "submit", id="submits after the planned steps"),
    pytest.param(("[SYSTEM NOTICE] Only 2 turn(s) remain.",), StandinParams(), 0, False, "submit", id="finalize"),
    pytest.param(("[CONTEXT WARNING] close to the limit",), StandinParams(p_ignore_urgent=0.0), 0, False, "edit",
                 id="urgent compacts"),
    pytest.param(("[CONTEXT WARNING] close",), StandinParams(p_ignore_urgent=1.0, p_get_document=0.0), 0, False,
                 "search", id="urgent ignored"),
    pytest.param(("[CONTEXT NOTICE] Your context has passed 75% of its budget",),
                 StandinParams(p_edit_on_nudge=(0, 0, 1.0)), 0, False, "edit", id="75 percent notice compacts"),
    pytest.param(("[CONTEXT NOTICE] Your context has passed 25% of its budget",),
                 StandinParams(p_edit_on_nudge=(0, 0, 1.0), p_get_document=0.0), 0, False, "search",
                 id="25 percent notice ignored"),
    pytest.param((), StandinParams(), 0, True, "edit", id="a new ledger compacts"),
])
def test_decide(notes, params, steps_done, ledger, expected):
    messages = context(*notes, ledger=ledger)
    view = standin.read_context(messages)
    action = standin.decide(messages, view, memory(steps_done), params, budget_chars=10_000)
    assert action.kind == expected


def test_read_context_finds_groups_notes_docids_and_the_ledger():
    view = standin.read_context(context("[CONTEXT NOTICE] passed 50% of", ledger=True))
    assert view.protect == 3 and view.ledger.startswith("[ROLLBACK LEDGER]")
    assert [(g.start, g.end) for g in view.groups] == [(3, 5), (5, 7), (7, 9)]
    assert view.visible_docids == ("100", "101", "102") and standin.note_ratio(view.note) == 0.5


@pytest.mark.parametrize("recent_first, free, expected", [
    pytest.param(1.0, 1, [6, 7], id="newest group first"),
    pytest.param(0.0, 1, [2, 3], id="oldest group first"),
    pytest.param(0.0, 10**9, [2, 3, 4, 5, 6, 7], id="as many groups as needed"),
])
def test_plan_edit_deletes_whole_groups(recent_first, free, expected):
    messages = context()
    view = standin.read_context(messages)
    params = StandinParams(p_edit_recent_first=recent_first, p_replace=0.0, keep_recent_groups=0)
    action = standin.plan_edit(messages, view, random.Random(0), params, free, mild=True)
    assert action.arguments == {"action": "delete", "turns": expected}


def test_a_replace_quotes_a_unique_passage_and_shrinks_it():
    messages = context()
    messages[3]["content"] = json.dumps({"docid": "1", "text": " ".join(f"w{i}" for i in range(200))})
    view = standin.read_context(messages)
    action = standin.replace_action(messages, list(view.groups), random.Random(0), StandinParams())
    assert action.arguments["action"] == "replace"
    assert messages[3]["content"].count(action.arguments["old"]) == 1
    assert len(action.arguments["new"]) < len(action.arguments["old"])


# ---- the radix estimate


def call(prompt, completion=(9,), salt=None, turn=0):
    return TraceCall("c", turn, list(prompt), list(completion), salt)


P = list(range(1, 11))  # a 10-token prompt


@pytest.mark.parametrize("calls, expected", [
    pytest.param([call(P)], [0], id="first call reuses nothing"),
    pytest.param([call(P, [50, 51, 52]), call(P + [50, 51, 52, 60])], [0, 12],
                 id="append: prompt + completion[:-1] is reused"),
    pytest.param([call(P), call(P)], [0, 8], id="identical prompt: one token is recomputed, last chunk end"),
    pytest.param([call(P), call(P[:7] + [99, 98, 97])], [0, 4], id="divergence inside a chunk resumes at its start"),
    pytest.param([call(P), call(P[:9] + [99])], [0, 8], id="divergence after the last chunk end"),
    pytest.param([call(P, salt="a"), call(P + [1], salt="b")], [0, 0], id="another salt shares nothing"),
    pytest.param([call(P, [50, 51]), call(P + [50] + list(range(20, 30))),
                  call(P + [50] + list(range(20, 26)) + [0])], [0, 11, 15],
                 id="chunk ends count from where the request resumed"),
    pytest.param([call(P, []), call(P + [5])], [0, 10], id="empty completion: the prompt end"),
    pytest.param([call(P[:3]), call(P + [5])], [0, 3], id="an earlier short prompt is a prefix"),
])
def test_radix_prefix_estimate(calls, expected):
    assert synth.radix_prefix_estimate(calls, chunk=4) == expected


@pytest.mark.parametrize("resume, prompt_len, sequence_len, chunk, expected", [
    pytest.param(0, 10, 12, 4, [4, 8, 10, 12], id="from zero"),
    pytest.param(6, 10, 10, 4, [10], id="one chunk, empty completion"),
    pytest.param(6, 20, 25, 4, [10, 14, 18, 20, 25], id="relative to the resume point"),
])
def test_checkpoints(resume, prompt_len, sequence_len, chunk, expected):
    assert synth.checkpoints(resume, prompt_len, sequence_len, chunk) == expected


def test_prefix_hashes_identify_prefixes():
    a = synth.prefix_hashes(np.array([3, 1, 4, 1, 5]))
    b = synth.prefix_hashes(np.array([3, 1, 4, 2, 5]))
    assert len(a) == 6 and list(a[:4]) == list(b[:4]) and a[4] != b[4]


def test_cli_dispatches_synth(tmp_path, monkeypatch, capsys):
    from eval.traces import __main__ as cli

    seen = {}
    monkeypatch.setattr(synth, "main", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(["synth", "--out", str(tmp_path / "t.jsonl"), "--questions", "2", "--seed", "3"]) == 0
    assert seen["questions"] == 2 and seen["seed"] == 3 and seen["with_messages"] is False
    assert seen["render"] == "default"


def test_synth_cli_records_the_rendering_in_the_trace_and_its_stats(tmp_path, capsys):
    from eval.traces import __main__ as cli

    out = tmp_path / "t.jsonl"
    assert cli.main(["synth", "--out", str(out), "--questions", "1", "--small", "--tokenizer", "tiny",
                     "--render", "preserve"]) == 0
    calls = read_trace(out)
    assert calls and {c.meta["render"] for c in calls} == {"preserve"}
    assert json.loads((tmp_path / "t.jsonl.stats.json").read_text())["render"] == "preserve"
    assert "render: preserve" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["synth", "--out", str(out), "--render", "keep"])


def test_english_questions_keep_their_topic_terms_findable():
    """English text: the invented terms are no English word, so the stand-in finds them again."""
    questions, docs = corpus.build(5, 2, synth.SMALL_CORPUS)
    task = f"Question: {questions[0].text}\n\nWhen you are done"
    assert set(standin.question_terms(task, "english")) == set(questions[0].terms)
    assert questions[0].text[:1].isupper() and "." in questions[0].text
    found = [any(t in docs[d].text for t in questions[0].terms) for d in questions[0].docids]
    assert sum(found) >= len(found) - 2  # a short document may draw none of them (0.2-2 % of words)


def test_english_prose_is_deterministic_and_draws_from_thousands_of_words():
    from eval.traces import english

    a, b = english.prose(random.Random(1), 3000), english.prose(random.Random(1), 3000)
    assert a == b and len(a.split()) == 3000
    words = {w.strip(".,").lower() for w in a.split()}
    assert len(words) > 800  # a 40-word vocabulary made every conversation look alike
    assert "the" in words and a.count("\n\n") >= 3
