"""The dataset's ``topics-qrels/`` files (docs/eval.md §1.2): TREC qrels ``qid Q0 docid rel`` and
``queries.tsv`` (``query_id<TAB>query``), read with their checks and written for the fixtures."""
# Spec: docs/eval.md

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from eval.bcp.data_types import DataError, Query


def read_qrels(path: Path) -> dict[str, list[str]]:
    """TREC qrels ``qid Q0 docid rel`` -> {qid: [docid, ...]} for rel > 0, in file order."""
    out: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 4:
            raise DataError(f"{path}:{lineno}: expected 'qid Q0 docid rel', got {line!r}")
        qid, _, docid, rel = parts
        try:
            relevant = int(rel) > 0
        except ValueError:
            raise DataError(f"{path}:{lineno}: relevance {rel!r} is not an integer") from None
        if (qid, docid) in seen:
            raise DataError(f"{path}:{lineno}: duplicate qrel ({qid}, {docid})")
        seen.add((qid, docid))
        if relevant:
            out.setdefault(qid, []).append(docid)
    return out


def read_queries_tsv(path: Path) -> dict[str, str]:
    """``query_id<TAB>query`` lines -> {query_id: query}; a repeated id is a DataError."""
    out: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise DataError(f"{path}:{lineno}: expected 'query_id<TAB>query'")
        qid, text = line.split("\t", 1)
        if qid in out:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        out[qid] = text
    return out


def write_qrels(path: Path, labels: dict[str, Iterable[str]]) -> None:
    lines = [f"{qid} Q0 {docid} 1" for qid, docids in labels.items() for docid in docids]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_queries_tsv(path: Path, queries: Iterable[Query]) -> None:
    lines = [f"{q.query_id}\t{q.text.replace(chr(9), ' ')}" for q in queries]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_labels(name: str, labels: dict[str, list[str]], qids: set[str], corpus: dict) -> None:
    """Every query id of ``labels`` is a known query and every docid is in the corpus."""
    unknown_q = sorted(set(labels) - qids)
    if unknown_q:
        raise DataError(f"{name}: unknown query id(s) {unknown_q[:5]}")
    unknown_d = sorted({d for ds in labels.values() for d in ds if d not in corpus})
    if unknown_d:
        raise DataError(f"{name}: {len(unknown_d)} docid(s) not in the corpus, e.g. {unknown_d[:5]}")
