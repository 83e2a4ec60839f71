"""The BrowseComp-Plus dataset as :func:`eval.bcp.data.load_dataset` returns it (docs/eval.md §1.2),
and the error every reader of it raises."""
# Spec: docs/eval.md

from __future__ import annotations

from dataclasses import dataclass, field


class DataError(ValueError):
    """The dataset on disk is missing, malformed or inconsistent; the message says where."""


@dataclass(frozen=True)
class Query:
    query_id: str
    text: str
    answer: str
    evidence_docids: tuple[str, ...]
    gold_docids: tuple[str, ...]


@dataclass(frozen=True)
class Document:
    docid: str
    text: str
    url: str = ""


@dataclass
class Dataset:
    queries: list[Query]
    corpus: dict[str, Document]
    source: dict[str, str] = field(default_factory=dict)

    def query(self, query_id: str) -> Query:
        for q in self.queries:
            if q.query_id == query_id:
                return q
        raise KeyError(query_id)
