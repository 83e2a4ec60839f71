"""eval.bcp.tools: output format, schemas, error strings and the call record."""

from __future__ import annotations

import json

import pytest

from eval.bcp import fixtures
from eval.bcp.data import load_dataset
from eval.bcp.retrieval import Searcher
from eval.bcp.tools import ToolBox, normalize_tool_name


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return load_dataset(fixtures.write_fixture(tmp_path_factory.mktemp("fx"), num_queries=3, num_docs=40))


@pytest.fixture
def box(dataset):
    return ToolBox(Searcher(dataset.corpus, snippet_max_tokens=6), k=3)


def test_search_output_format(box, dataset):
    q = dataset.queries[0]
    out = box.call("search", {"query": q.text})
    rows = json.loads(out)
    assert out == json.dumps(rows, indent=2, ensure_ascii=False)
    assert len(rows) == 3
    assert all(list(r) == ["docid", "score", "snippet"] for r in rows)
    assert rows[0]["docid"] == q.gold_docids[0]
    assert all(isinstance(r["score"], float) for r in rows)
    # Snippets are the first 6 whitespace words of the document.
    for r in rows:
        assert r["snippet"].split() == dataset.corpus[r["docid"]].text.split()[:6]


def test_get_document_output_format(box, dataset):
    doc = next(iter(dataset.corpus.values()))
    out = box.call("get_document", json.dumps({"docid": doc.docid}))
    assert json.loads(out) == {"docid": doc.docid, "text": doc.text}
    assert list(json.loads(out)) == ["docid", "text"]


@pytest.mark.parametrize("name, arguments, message", [
    ("browse", {"query": "x"}, "unknown tool 'browse'"),
    ("search", "{not json", "not valid JSON"),
    ("search", "[1, 2]", "must be a JSON object"),
    ("search", {}, "missing argument(s): query"),
    ("search", {"query": "  "}, "non-empty string"),
    ("search", {"query": 3}, "non-empty string"),
    ("search", {"query": "x", "k": 10}, "unexpected argument(s): k"),
    ("get_document", {"docid": "nope"}, "document 'nope' not found"),
    ("get_document", {"doc": "1"}, "missing argument(s): docid"),
    ("get_document", {"docid": ["1"]}, "docid must be a string"),
], ids=["unknown-tool", "bad-json", "not-object", "no-query", "blank-query", "int-query", "k-not-exposed",
        "unknown-docid", "wrong-key", "list-docid"])
def test_errors_are_strings_not_exceptions(box, name, arguments, message):
    out = box.call(name, arguments)
    assert json.loads(out) == {"error": json.loads(out)["error"]}
    assert message in json.loads(out)["error"]
    assert box.calls[-1].error is not None and box.calls[-1].output == out
    assert box.retrieved_docids == []


def test_expose_k(dataset):
    box = ToolBox(Searcher(dataset.corpus), k=2, expose_k=True, max_k=4)
    props = box.schemas()[0]["function"]["parameters"]["properties"]
    assert set(props) == {"query", "k"}
    assert len(json.loads(box.call("search", {"query": dataset.queries[0].text}))) == 2
    assert len(json.loads(box.call("search", {"query": dataset.queries[0].text, "k": 4}))) == 4
    assert "error" in json.loads(box.call("search", {"query": "x", "k": 5}))
    assert "error" in json.loads(box.call("search", {"query": "x", "k": True}))


def test_schemas(dataset):
    searcher = Searcher(dataset.corpus)
    schemas = ToolBox(searcher, k=5).schemas()
    assert [s["function"]["name"] for s in schemas] == ["search", "get_document"]
    for s in schemas:
        assert s["type"] == "function"
        params = s["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) == set(params["properties"])
    assert "top-5 hits with docid, score, and snippet" in schemas[0]["function"]["description"]
    only_search = ToolBox(searcher, get_document=False)
    assert [s["function"]["name"] for s in only_search.schemas()] == ["search"]
    assert "unknown tool" in only_search.call("get_document", {"docid": "1"})


def test_call_record_and_retrieved_docids(box, dataset):
    q1, q2 = dataset.queries[:2]
    first = [r["docid"] for r in json.loads(box.call("search", {"query": q1.text}))]
    box.call("get_document", {"docid": q2.gold_docids[0]})  # not a search: not "retrieved"
    second = [r["docid"] for r in json.loads(box.call("search", '{"query": "%s"}' % q1.text))]
    third = [r["docid"] for r in json.loads(box.call("search", {"query": q2.text}))]
    box.call("search", {})
    assert first == second
    expected = list(dict.fromkeys(first + third))
    assert box.retrieved_docids == expected
    assert box.tool_call_counts == {"search": 4, "get_document": 1}
    assert box.search_calls == 4
    assert [c.docids for c in box.calls] == [tuple(first), (), tuple(second), tuple(third), ()]
    item = box.calls[0].result_item()
    assert item["type"] == "tool_call" and item["tool_name"] == "search"
    assert json.loads(item["arguments"]) == {"query": q1.text} and item["output"] == box.calls[0].output
    box.reset()
    assert box.calls == [] and box.retrieved_docids == [] and box.tool_call_counts == {}


@pytest.mark.parametrize("name, expected", [
    ("local_knowledge_base_retrieval", "search"), ("search", "search"), ("get_document", "get_document"),
])
def test_normalize_tool_name(name, expected):
    assert normalize_tool_name(name) == expected
