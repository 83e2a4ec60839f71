"""BM25 search over the BCP corpus with bm25s, and token-length snippets (docs/eval.md §1.4, §1.5, §3.4).

The benchmark's BM25 is Pyserini's ``LuceneSearcher`` (Java 21, not available here, §3.1); this is
the offline stand-in recommended in §3.4, shaped like BCP's ``BaseSearcher``:

* ``Searcher.search(query, k)`` -> up to ``k`` :class:`Hit` (docid, score, text), best first;
  ``Searcher.get_document(docid)`` -> the full :class:`~eval.bcp.data.Document` or None.
* Scoring: bm25s ``method="lucene"`` with Pyserini's defaults k1=0.9, b=0.4. Analyzer: lowercase,
  ``\\w+`` tokens (Lucene's StandardTokenizer keeps one-character tokens too), Lucene's default
  33-word English stop set, and no stemming unless a ``stemmer`` callable is given. Lucene's
  analyzer also Porter-stems, so rankings are close to, not equal to, the official index [U].
* Only documents sharing a term with the query are hits (as in Lucene); equal scores keep corpus
  order (Lucene breaks ties by index order).
* ``Hit.text`` is already the *snippet* the search tool shows: the first ``snippet_max_tokens``
  tokens of the document (BCP: 512 under the Qwen3-0.6B tokenizer, decoded back to text; -1
  disables truncation, §1.5). Text no longer than the limit is returned unchanged.
  ``tokenizer`` is any object with ``encode``/``decode`` (a transformers tokenizer, whose
  ``encode(text, add_special_tokens=False)`` / ``decode(ids, skip_special_tokens=True)`` are used
  when they take those keywords, or a ``tokenizers.Tokenizer``). Without one, the fallback counts
  whitespace-separated words and cuts the original text after the N-th word (spacing kept). That
  is NOT the benchmark's count: ``Searcher.describe()`` records which (``snippet_unit``:
  ``tokens:<tokenizer name>`` or ``words``) for the run manifest; ``eval/bcp/snippets.py`` picks
  the tokenizer.

Index persistence: with ``index_dir`` the bm25s index is saved there with ``bcp_index.json``
holding a fingerprint of (analyzer and scoring parameters, every docid and text in corpus order).
A later ``Searcher`` on the same corpus loads it (``built`` is False); any change rebuilds it.
"""
# Spec: docs/eval.md

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import bm25s
import numpy as np

from eval.bcp.data import Document
from eval.bcp.snippets import snippet_unit

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET (the default stop set of Pyserini's analyzer).
LUCENE_STOPWORDS = (
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these",
    "they", "this", "to", "was", "will", "with",
)
META_FILE = "bcp_index.json"
DEFAULT_SNIPPET_TOKENS = 512
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Hit:
    docid: str
    score: float
    text: str


@dataclass(frozen=True)
class BM25Params:
    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    token_pattern: str = r"\w+"
    stopwords: tuple[str, ...] = LUCENE_STOPWORDS
    stemmer: str = ""  # name of the stemmer callable, part of the fingerprint


def _encode(tokenizer: Any, text: str) -> list[int]:
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return list(getattr(ids, "ids", ids))


def _decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=True)
    except TypeError:
        return tokenizer.decode(ids)


def truncate_tokens(text: str, max_tokens: int, tokenizer: Any = None) -> str:
    """The first ``max_tokens`` tokens of ``text`` (§1.5); negative = no truncation.

    With ``tokenizer``: decode(encode(text)[:max_tokens]) when the text is longer than that.
    Without: the text up to the end of its ``max_tokens``-th whitespace-separated word.
    """
    if max_tokens < 0:
        return text
    if max_tokens == 0:
        raise ValueError("snippet length 0; use a positive length or -1 for whole documents")
    if tokenizer is None:
        words = list(_WORD.finditer(text))
        return text if len(words) <= max_tokens else text[: words[max_tokens - 1].end()]
    ids = _encode(tokenizer, text)
    return text if len(ids) <= max_tokens else _decode(tokenizer, ids[:max_tokens])


def index_dir_problem(index_dir: Path) -> str | None:
    """Why ``index_dir`` cannot hold this class's index, or None. An absent or empty directory is
    fine (the index is built there); only a directory this class wrote is ever replaced, never a
    user's folder."""
    index_dir = Path(index_dir)
    if index_dir.exists() and not index_dir.is_dir():
        return f"{index_dir} is not a directory; choose an index directory"
    if index_dir.is_dir() and any(index_dir.iterdir()) and not (index_dir / META_FILE).is_file():
        return f"{index_dir} is not empty and holds no {META_FILE}; choose an index directory"
    return None


def corpus_fingerprint(corpus: Mapping[str, Document], params: BM25Params) -> str:
    h = hashlib.sha256(json.dumps(params.__dict__, sort_keys=True).encode())
    for docid, doc in corpus.items():
        for part in (docid, doc.text):
            raw = part.encode("utf-8")
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
    return h.hexdigest()


class Searcher:
    """BM25 over ``corpus``; see the module docstring for the analyzer, ties and snippets."""

    def __init__(
        self,
        corpus: Mapping[str, Document],
        index_dir: Path | None = None,
        *,
        k1: float = 0.9,
        b: float = 0.4,
        method: str = "lucene",
        stemmer: Callable[[str], str] | None = None,
        snippet_max_tokens: int = DEFAULT_SNIPPET_TOKENS,
        tokenizer: Any = None,
        tokenizer_name: str = "",
    ):
        if not corpus:
            raise ValueError("empty corpus")
        self.corpus = corpus
        self.params = BM25Params(k1=k1, b=b, method=method,
                                 stemmer=getattr(stemmer, "__qualname__", repr(stemmer)) if stemmer else "")
        self._stemmer = stemmer
        self._pattern = re.compile(self.params.token_pattern)
        self._stop = frozenset(self.params.stopwords)
        self.snippet_max_tokens = snippet_max_tokens
        self.tokenizer = tokenizer
        self.tokenizer_name = tokenizer_name or (type(tokenizer).__name__ if tokenizer else "whitespace")
        self.docids = list(corpus)
        self.fingerprint = corpus_fingerprint(corpus, self.params)
        self.built = False
        self._bm25 = self._load(Path(index_dir)) if index_dir is not None else None
        if self._bm25 is None:
            self._bm25 = self._build()
            self.built = True
            if index_dir is not None:
                self._save(Path(index_dir))

    def analyze(self, text: str) -> list[str]:
        """Index/query terms: lowercase ``\\w+`` tokens minus stop words, stemmed if configured."""
        terms = [t for t in self._pattern.findall(text.lower()) if t not in self._stop]
        return [self._stemmer(t) for t in terms] if self._stemmer else terms

    def _build(self) -> bm25s.BM25:
        bm25 = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        bm25.index([self.analyze(self.corpus[d].text) for d in self.docids], show_progress=False)
        return bm25

    def _save(self, index_dir: Path) -> None:
        problem = index_dir_problem(index_dir)
        if problem:
            raise ValueError(problem)
        tmp = index_dir.with_name(index_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self._bm25.save(str(tmp), show_progress=False)
        meta = {"fingerprint": self.fingerprint, "params": self.params.__dict__, "docids": self.docids}
        (tmp / META_FILE).write_text(json.dumps(meta), encoding="utf-8")
        shutil.rmtree(index_dir, ignore_errors=True)
        tmp.rename(index_dir)

    def _load(self, index_dir: Path) -> bm25s.BM25 | None:
        meta_path = index_dir / META_FILE
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("fingerprint") != self.fingerprint or meta.get("docids") != self.docids:
            return None
        return bm25s.BM25.load(str(index_dir), load_vocab=True, show_progress=False)

    def search(self, query: str, k: int) -> list[Hit]:
        """Top ``k`` documents sharing a term with ``query``, by BM25 score then corpus order."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        ids = self._bm25.get_tokens_ids(self.analyze(query))
        if not ids:
            return []
        scores = np.asarray(self._bm25.get_scores_from_ids(ids))
        matched = np.flatnonzero(scores > 0)
        ranked = matched[np.lexsort((matched, -scores[matched]))][:k]
        return [Hit(self.docids[i], float(scores[i]), self.snippet(self.corpus[self.docids[i]].text))
                for i in ranked]

    def get_document(self, docid: str) -> Document | None:
        return self.corpus.get(docid)

    def snippet(self, text: str) -> str:
        return truncate_tokens(text, self.snippet_max_tokens, self.tokenizer)

    def describe(self) -> dict:
        """What a run manifest should record about retrieval (§3.4 recommendation)."""
        return {"backend": "bm25s", "bm25s_version": bm25s.__version__, **self.params.__dict__,
                "stopwords": "lucene-english-33", "num_docs": len(self.docids),
                "fingerprint": self.fingerprint, "snippet_max_tokens": self.snippet_max_tokens,
                "snippet_tokenizer": self.tokenizer_name, "snippet_unit": self.snippet_unit}

    @property
    def snippet_unit(self) -> str:
        """``tokens:<tokenizer name>`` when snippets are cut by a tokenizer, else ``words``."""
        return snippet_unit(self.tokenizer_name if self.tokenizer is not None else None)
