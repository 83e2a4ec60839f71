"""Load BrowseComp-Plus from local files in its published formats (docs/eval.md §1.2, §1.3).

Directory layout read by :func:`load_dataset` (names chosen here; the contents are the published
formats)::

    DIR/
      browsecomp_plus_decrypted.jsonl   plain query records (what decrypt_dataset.py writes)  | exactly
      browsecomp_plus.jsonl             encrypted query records (the HF dataset as JSONL)     | one of
      browsecomp_plus.parquet or        encrypted query records (the HF parquet shards)       | these
        browsecomp_plus/*.parquet
      corpus.jsonl | corpus.parquet | corpus/*.parquet     plain corpus rows: docid, text[, url]
      topics-qrels/qrel_evidence.txt    optional TREC qrels ``qid Q0 docid rel`` (§1.2)
      topics-qrels/qrel_golds.txt       optional, same format
      topics-qrels/queries.tsv          optional ``query_id<TAB>query``; its ids are checked
      canary.txt                        optional password file (written by the fixtures only)

A query record has ``query_id``, ``query``, ``answer`` and ``evidence_docs`` / ``gold_docs`` (and
``negative_docs``), each a list of ``{docid, text[, url]}`` (§1.2). Encrypted records are
decrypted as ``eval/bcp/crypto.py`` describes (§1.3; the password is never in this repository).

The parts: ``data_types.py`` (Query, Document, Dataset, DataError; importable from here too),
``crypto.py`` (§1.3), ``rows.py`` (JSONL/parquet rows and field checks), ``qrels.py`` (the
``topics-qrels/`` files); this module puts them together.

Interpretations:

* qrels, when present, are authoritative for evidence/gold docids (the evaluator reads them,
  §1.9); otherwise the docids of the records' ``evidence_docs`` / ``gold_docs`` are used. Only
  the docids are decrypted when loading, never the (large) document texts of the records.
* Errors (:class:`DataError`) name the file and the offending id or line: missing fields,
  duplicate query ids, duplicate corpus docids, duplicate qrels lines, qrels naming an unknown
  query or a docid absent from the corpus, a record that is not base64 or does not decrypt to
  UTF-8 (wrong password, or an already decrypted file under the encrypted name).
* The corpus is plain text as published (``Tevatron/browsecomp-plus-corpus``); it is not encrypted.
"""
# Spec: docs/eval.md

from __future__ import annotations

import hashlib
from pathlib import Path

from eval.bcp.crypto import decrypt_record, resolve_password
from eval.bcp.data_types import DataError, Dataset, Document, Query
from eval.bcp.qrels import check_labels, read_qrels, read_queries_tsv
from eval.bcp.rows import docids, read_jsonl, require, rows

__all__ = ["DataError", "Dataset", "Document", "Query", "load_corpus", "load_dataset", "subset"]

DECRYPTED_NAME = "browsecomp_plus_decrypted.jsonl"
ENCRYPTED_STEM = "browsecomp_plus"
CORPUS_STEM = "corpus"
QRELS_DIR = "topics-qrels"
EVIDENCE_QRELS = "qrel_evidence.txt"
GOLD_QRELS = "qrel_golds.txt"
QUERIES_TSV = "queries.tsv"
LABELS = (("evidence", "evidence_docs", EVIDENCE_QRELS), ("gold", "gold_docs", GOLD_QRELS))


def load_corpus(base: Path) -> dict[str, Document]:
    found = rows(base, CORPUS_STEM, None)
    if found is None:
        raise DataError(f"{base}: no corpus ({CORPUS_STEM}.jsonl, {CORPUS_STEM}.parquet or {CORPUS_STEM}/*.parquet)")
    corpus: dict[str, Document] = {}
    for where, row in found[1]:
        require(row, ("docid", "text"), where)
        docid = str(row["docid"])
        if docid in corpus:
            raise DataError(f"{where}: duplicate docid {docid!r}")
        corpus[docid] = Document(docid=docid, text=str(row["text"]), url=str(row.get("url") or ""))
    if not corpus:
        raise DataError(f"{found[0]}: the corpus is empty")
    return corpus


def _query_rows(base: Path, password: str | None) -> tuple[str, list[tuple[str, dict]]]:
    """(source, [(where, plain record with only the fields we use)])."""
    plain = base / DECRYPTED_NAME
    wanted = ["query_id", "query", "answer", "evidence_docs", "gold_docs"]
    if plain.is_file():
        return str(plain), [(f"{plain}:{n}", r) for n, r in read_jsonl(plain)]
    found = rows(base, ENCRYPTED_STEM, wanted)
    if found is None:
        raise DataError(f"{base}: no query records ({DECRYPTED_NAME}, {ENCRYPTED_STEM}.jsonl or .parquet)")
    key = resolve_password(base, password)
    out = []
    for where, row in found[1]:
        require(row, ("query_id", "query", "answer"), where)
        # Project before decrypting: only docids of the labelled docs are needed, not their texts.
        slim = {k: row[k] for k in ("query_id", "query", "answer")}
        for k in ("evidence_docs", "gold_docs"):
            if isinstance(row.get(k), list):
                slim[k] = [{"docid": d.get("docid")} for d in row[k] if isinstance(d, dict)]
        try:
            out.append((where, decrypt_record(slim, key)))
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
    return found[0], out


def _query(qid: str, row: dict, where: str, qrels: dict, corpus: dict[str, Document]) -> Query:
    """One query record as a Query; its labels from the qrels when present (§1.9), else the record's."""
    labels = {key: qrels[kind].get(qid, []) if qrels[kind] is not None else docids(row, key, where)
              for kind, key, _ in LABELS}
    for key, found in labels.items():
        missing = [d for d in found if d not in corpus]
        if missing:
            raise DataError(f"{where}: {key} docid(s) not in the corpus: {missing[:5]}")
    return Query(qid, str(row["query"]), str(row["answer"]), tuple(labels["evidence_docs"]),
                 tuple(labels["gold_docs"]))


def _check_topic_files(qrels_dir: Path, qrels: dict, qids: set[str], corpus: dict[str, Document]) -> None:
    """The qrels and queries.tsv name only known queries (and the qrels only known docids)."""
    for kind, _, name in LABELS:
        if qrels[kind] is not None:
            check_labels(str(qrels_dir / name), qrels[kind], qids, corpus)
    if (qrels_dir / QUERIES_TSV).is_file():
        unknown = sorted(set(read_queries_tsv(qrels_dir / QUERIES_TSV)) - qids)
        if unknown:
            raise DataError(f"{qrels_dir / QUERIES_TSV}: unknown query id(s) {unknown[:5]}")


def load_dataset(path: Path, *, password: str | None = None) -> Dataset:
    """Load and validate queries, answers, evidence/gold docids and the corpus under ``path``."""
    base = Path(path)
    if not base.is_dir():
        raise DataError(f"{base}: not a directory")
    corpus = load_corpus(base)
    source, records = _query_rows(base, password)
    qrels_dir = base / QRELS_DIR
    qrels = {kind: read_qrels(qrels_dir / name) if (qrels_dir / name).is_file() else None
             for kind, _, name in LABELS}
    queries: list[Query] = []
    seen: set[str] = set()
    for where, row in records:
        require(row, ("query_id", "query", "answer"), where)
        qid = str(row["query_id"])
        if qid in seen:
            raise DataError(f"{where}: duplicate query_id {qid!r}")
        seen.add(qid)
        queries.append(_query(qid, row, where, qrels, corpus))
    if not queries:
        raise DataError(f"{source}: no queries")
    _check_topic_files(qrels_dir, qrels, seen, corpus)
    return Dataset(queries=queries, corpus=corpus, source={"queries": source})


def subset(queries: list[Query], n: int, seed: int = 0) -> list[Query]:
    """A stable seeded subset (§5.2): the ``n`` queries with the smallest sha256(seed:query_id)."""
    def rank(q: Query) -> str:
        return hashlib.sha256(f"{seed}:{q.query_id}".encode()).hexdigest()

    chosen = {q.query_id for q in sorted(queries, key=rank)[:n]}
    return [q for q in queries if q.query_id in chosen]
