"""eval.bcp.retrieval: BM25 ranking on the fixture, scores by hand, index persistence, snippets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval.bcp import fixtures
from eval.bcp.data import Document, load_dataset
from eval.bcp.retrieval import Searcher, truncate_tokens


def _corpus(*texts: str) -> dict[str, Document]:
    return {str(i): Document(str(i), t) for i, t in enumerate(texts)}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gold_document_ranks_first_on_the_fixture(tmp_path, seed):
    ds = load_dataset(fixtures.write_fixture(tmp_path / "fx", num_queries=6, num_docs=50, seed=seed))
    searcher = Searcher(ds.corpus)
    for q in ds.queries:
        hits = searcher.search(q.text, 5)
        assert hits[0].docid == q.gold_docids[0], (q.text, hits)
        assert set(q.evidence_docids) <= {h.docid for h in hits}
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_scores_equal_lucene_bm25_by_hand():
    corpus = _corpus("apple banana apple", "banana cherry", "cherry cherry cherry date", "the of and")
    k1, b = 0.9, 0.4
    # Terms after analysis: stop words ("the", "of", "and") are dropped, so doc 3 has length 0.
    docs = [["apple", "banana", "apple"], ["banana", "cherry"], ["cherry"] * 3 + ["date"], []]
    avgdl = sum(map(len, docs)) / len(docs)

    def bm25(query_terms, doc):
        total = 0.0
        for t in query_terms:
            df = sum(t in d for d in docs)
            tf = doc.count(t)
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            total += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        return total

    hits = Searcher(corpus, k1=k1, b=b).search("Banana and CHERRY", 10)
    expected = sorted(((str(i), bm25(["banana", "cherry"], d)) for i, d in enumerate(docs)),
                      key=lambda x: -x[1])
    expected = [(d, s) for d, s in expected if s > 0]
    assert [h.docid for h in hits] == [d for d, _ in expected]
    assert [h.score for h in hits] == pytest.approx([s for _, s in expected], rel=1e-5)


@pytest.mark.parametrize("query, expected", [
    ("apple", ["0"]),                         # only documents sharing a term are hits
    ("the of and", []),                       # all stop words
    ("zzz unknown", []),                      # no known term
    ("same", ["1", "2", "3"]),                # equal scores keep corpus order
], ids=["one-match", "stopwords", "unknown", "ties"])
def test_hits_and_ties(query, expected):
    searcher = Searcher(_corpus("apple pie", "same text", "same text", "same text", "other words"))
    assert [h.docid for h in searcher.search(query, 10)] == expected


def test_k_limits_and_validation():
    searcher = Searcher(_corpus("a word", "word b", "word c"))
    assert len(searcher.search("word", 2)) == 2
    assert len(searcher.search("word", 100)) == 3
    with pytest.raises(ValueError):
        searcher.search("word", 0)


def test_index_saved_and_reloaded_without_rebuild(tmp_path, monkeypatch):
    ds = load_dataset(fixtures.write_fixture(tmp_path / "fx", num_queries=3, num_docs=40))
    index_dir = tmp_path / "index"
    first = Searcher(ds.corpus, index_dir)
    assert first.built and (index_dir / "bcp_index.json").is_file()

    def no_build(self):
        raise AssertionError("index rebuilt although the corpus did not change")

    monkeypatch.setattr(Searcher, "_build", no_build)
    again = Searcher(ds.corpus, index_dir)
    assert not again.built
    for q in ds.queries:
        assert again.search(q.text, 5) == first.search(q.text, 5)
    monkeypatch.undo()

    changed = dict(ds.corpus)
    docid = next(iter(changed))
    changed[docid] = Document(docid, changed[docid].text + " plus a new sentence")
    assert Searcher(changed, index_dir).built
    assert Searcher(changed, index_dir, k1=1.2).built  # parameters are part of the fingerprint
    assert not Searcher(changed, index_dir, k1=1.2).built


def test_index_dir_that_is_not_an_index_is_left_alone(tmp_path):
    (tmp_path / "keep.txt").write_text("user data")
    with pytest.raises(ValueError, match="not empty"):
        Searcher(_corpus("a b c"), tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "user data"


class CharTokenizer:
    """One token per character; decode(encode(t)) == t."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


class HFLikeTokenizer(CharTokenizer):
    """Records the keywords a transformers tokenizer would get; adds a special token like BOS."""

    def __init__(self):
        self.seen = []

    def encode(self, text, add_special_tokens=True):
        self.seen.append(("encode", add_special_tokens))
        return ([1] if add_special_tokens else []) + super().encode(text)

    def decode(self, ids, skip_special_tokens=False):
        self.seen.append(("decode", skip_special_tokens))
        return super().decode([i for i in ids if not (skip_special_tokens and i == 1)])


@pytest.mark.parametrize("text, n, expected", [
    ("one two  three\nfour", 2, "one two"),
    ("one two  three\nfour", 3, "one two  three"),
    ("one two", 2, "one two"),
    ("  lead  spaces here", 1, "  lead"),
    ("short", 512, "short"),
    ("whole text stays", -1, "whole text stays"),
], ids=["two", "three-keeps-spacing", "exact", "leading", "shorter", "disabled"])
def test_whitespace_fallback(text, n, expected):
    assert truncate_tokens(text, n) == expected


def test_tokenizer_snippets_have_exact_length():
    assert truncate_tokens("abcdefgh", 3, CharTokenizer()) == "abc"
    hf = HFLikeTokenizer()
    assert truncate_tokens("abcdefgh", 3, hf) == "abc"
    assert hf.seen == [("encode", False), ("decode", True)]
    with pytest.raises(ValueError):
        truncate_tokens("abc", 0)


def test_real_tokenizers_object(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = "alpha beta gamma delta epsilon".split()
    tok = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(words + ["[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    text = "alpha beta gamma delta epsilon"
    assert truncate_tokens(text, 3, tok) == "alpha beta gamma"


def test_searcher_hits_carry_snippets_and_get_document_the_whole_text(tmp_path):
    ds = load_dataset(fixtures.write_fixture(tmp_path / "fx"))
    searcher = Searcher(ds.corpus, snippet_max_tokens=7, tokenizer=CharTokenizer(), tokenizer_name="chars")
    for hit in searcher.search(ds.queries[0].text, 5):
        full = ds.corpus[hit.docid].text
        assert len(full) > 7 and hit.text == full[:7]
        assert searcher.get_document(hit.docid).text == full
    assert searcher.get_document("no-such-doc") is None
    assert searcher.describe()["snippet_tokenizer"] == "chars"
    assert Searcher(ds.corpus).describe()["snippet_tokenizer"] == "whitespace"
