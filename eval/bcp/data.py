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
``negative_docs``), each a list of ``{docid, text[, url]}`` (§1.2).

Decryption (§1.3): every string of a record except those under the ``query_id`` key is
base64-encoded ciphertext; plaintext = ciphertext XOR keystream, keystream = SHA-256(password)
repeated to the ciphertext's length; UTF-8. The password is the BrowseComp canary string (the
``DEFAULT_CANARY`` of BCP's ``scripts_build_index/decrypt_dataset.py``). It is never written in this
repository: pass ``password=``, set ``$BCP_CANARY``, or (fixtures, fake password) put it in
``DIR/canary.txt``; that is also the lookup order.

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

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

PASSWORD_ENV = "BCP_CANARY"
SKIP_KEYS = frozenset({"query_id"})
DECRYPTED_NAME = "browsecomp_plus_decrypted.jsonl"
ENCRYPTED_STEM = "browsecomp_plus"
CORPUS_STEM = "corpus"
QRELS_DIR = "topics-qrels"
EVIDENCE_QRELS = "qrel_evidence.txt"
GOLD_QRELS = "qrel_golds.txt"
QUERIES_TSV = "queries.tsv"
PASSWORD_FILE = "canary.txt"


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


# --- §1.3: the keystream XOR -----------------------------------------------------------------


def _keystream(password: str, length: int) -> np.ndarray:
    digest = np.frombuffer(hashlib.sha256(password.encode("utf-8")).digest(), dtype=np.uint8)
    return np.resize(digest, length)


def _xor(data: bytes, password: str) -> bytes:
    buf = np.frombuffer(data, dtype=np.uint8)
    return (buf ^ _keystream(password, len(buf))).tobytes()


def encrypt_string(plaintext: str, password: str) -> str:
    """base64(UTF-8(plaintext) XOR SHA-256(password) repeated); the inverse of decrypt_string."""
    return base64.b64encode(_xor(plaintext.encode("utf-8"), password)).decode("ascii")


def decrypt_string(ciphertext: str, password: str) -> str:
    """§1.3: base64-decode, XOR with the repeated SHA-256 digest of the password, UTF-8 decode."""
    try:
        raw = base64.b64decode(ciphertext, validate=True)
    except (ValueError, TypeError) as exc:
        raise DataError(f"not base64 ciphertext ({exc}); is the file already decrypted?") from None
    try:
        return _xor(raw, password).decode("utf-8")
    except UnicodeDecodeError:
        raise DataError("ciphertext does not decrypt to UTF-8: wrong password?") from None


def _walk(value: Any, fn, skip: frozenset[str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: (v if k in skip else _walk(v, fn, skip)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, fn, skip) for v in value]
    return value


def encrypt_record(record: dict, password: str, skip: Iterable[str] = SKIP_KEYS) -> dict:
    """Encrypt every string in ``record`` (recursively) except values under a ``skip`` key."""
    return _walk(record, lambda s: encrypt_string(s, password), frozenset(skip))


def decrypt_record(record: dict, password: str, skip: Iterable[str] = SKIP_KEYS) -> dict:
    """Decrypt every string in ``record`` (recursively) except values under a ``skip`` key (§1.3)."""
    return _walk(record, lambda s: decrypt_string(s, password), frozenset(skip))


# --- readers -----------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def _read_parquet(paths: list[Path], columns: list[str] | None) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    for path in paths:
        table = pq.read_table(path, columns=columns)
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}:row {i}", row


def _rows(base: Path, stem: str, columns: list[str] | None) -> tuple[str, Iterator[tuple[str, dict]]] | None:
    """Rows of ``base/stem.jsonl``, ``base/stem.parquet`` or ``base/stem/*.parquet`` (first found)."""
    jsonl = base / f"{stem}.jsonl"
    if jsonl.is_file():
        return str(jsonl), ((f"{jsonl}:{n}", r) for n, r in _read_jsonl(jsonl))
    parquet = base / f"{stem}.parquet"
    if parquet.is_file():
        return str(parquet), _read_parquet([parquet], columns)
    shards = sorted((base / stem).glob("*.parquet")) if (base / stem).is_dir() else []
    if shards:
        return str(base / stem), _read_parquet(shards, columns)
    return None


def _require(row: dict, keys: Iterable[str], where: str) -> None:
    missing = [k for k in keys if k not in row or row[k] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")


def resolve_password(base: Path, password: str | None) -> str:
    if password:
        return password
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    file = base / PASSWORD_FILE
    if file.is_file():
        return file.read_text(encoding="utf-8").strip()
    raise DataError(
        f"{base}: the query records are encrypted; pass password=..., set ${PASSWORD_ENV}, or "
        f"write {PASSWORD_FILE} (the password is DEFAULT_CANARY of BCP's decrypt_dataset.py)"
    )


def _docids(row: dict, key: str, where: str) -> tuple[str, ...]:
    docs = row.get(key) or []
    if not isinstance(docs, list):
        raise DataError(f"{where}: {key} must be a list of {{docid, text}}")
    out = []
    for d in docs:
        if not isinstance(d, dict) or d.get("docid") is None:
            raise DataError(f"{where}: an entry of {key} has no docid")
        out.append(str(d["docid"]))
    return tuple(out)


def load_corpus(base: Path) -> dict[str, Document]:
    found = _rows(base, CORPUS_STEM, None)
    if found is None:
        raise DataError(f"{base}: no corpus ({CORPUS_STEM}.jsonl, {CORPUS_STEM}.parquet or {CORPUS_STEM}/*.parquet)")
    corpus: dict[str, Document] = {}
    for where, row in found[1]:
        _require(row, ("docid", "text"), where)
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
        return str(plain), [(f"{plain}:{n}", r) for n, r in _read_jsonl(plain)]
    found = _rows(base, ENCRYPTED_STEM, wanted)
    if found is None:
        raise DataError(f"{base}: no query records ({DECRYPTED_NAME}, {ENCRYPTED_STEM}.jsonl or .parquet)")
    key = resolve_password(base, password)
    rows = []
    for where, row in found[1]:
        _require(row, ("query_id", "query", "answer"), where)
        # Project before decrypting: only docids of the labelled docs are needed, not their texts.
        slim = {k: row[k] for k in ("query_id", "query", "answer")}
        for k in ("evidence_docs", "gold_docs"):
            if isinstance(row.get(k), list):
                slim[k] = [{"docid": d.get("docid")} for d in row[k] if isinstance(d, dict)]
        try:
            rows.append((where, decrypt_record(slim, key)))
        except DataError as exc:
            raise DataError(f"{where}: {exc}") from None
    return found[0], rows


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


def _check_labels(name: str, labels: dict[str, list[str]], qids: set[str], corpus: dict) -> None:
    unknown_q = sorted(set(labels) - qids)
    if unknown_q:
        raise DataError(f"{name}: unknown query id(s) {unknown_q[:5]}")
    unknown_d = sorted({d for ds in labels.values() for d in ds if d not in corpus})
    if unknown_d:
        raise DataError(f"{name}: {len(unknown_d)} docid(s) not in the corpus, e.g. {unknown_d[:5]}")


def load_dataset(path: Path, *, password: str | None = None) -> Dataset:
    """Load and validate queries, answers, evidence/gold docids and the corpus under ``path``."""
    base = Path(path)
    if not base.is_dir():
        raise DataError(f"{base}: not a directory")
    corpus = load_corpus(base)
    source, rows = _query_rows(base, password)
    qrels_dir = base / QRELS_DIR
    qrels = {
        kind: read_qrels(qrels_dir / name) if (qrels_dir / name).is_file() else None
        for kind, name in (("evidence", EVIDENCE_QRELS), ("gold", GOLD_QRELS))
    }
    queries: list[Query] = []
    seen: set[str] = set()
    for where, row in rows:
        _require(row, ("query_id", "query", "answer"), where)
        qid = str(row["query_id"])
        if qid in seen:
            raise DataError(f"{where}: duplicate query_id {qid!r}")
        seen.add(qid)
        evidence = qrels["evidence"].get(qid, []) if qrels["evidence"] is not None else _docids(row, "evidence_docs", where)
        gold = qrels["gold"].get(qid, []) if qrels["gold"] is not None else _docids(row, "gold_docs", where)
        labels = {"evidence_docs": evidence, "gold_docs": gold}
        for key, docids in labels.items():
            missing = [d for d in docids if d not in corpus]
            if missing:
                raise DataError(f"{where}: {key} docid(s) not in the corpus: {missing[:5]}")
        queries.append(Query(qid, str(row["query"]), str(row["answer"]), tuple(evidence), tuple(gold)))
    if not queries:
        raise DataError(f"{source}: no queries")
    for kind, name in (("evidence", EVIDENCE_QRELS), ("gold", GOLD_QRELS)):
        if qrels[kind] is not None:
            _check_labels(str(qrels_dir / name), qrels[kind], seen, corpus)
    if (qrels_dir / QUERIES_TSV).is_file():
        unknown = sorted(set(read_queries_tsv(qrels_dir / QUERIES_TSV)) - seen)
        if unknown:
            raise DataError(f"{qrels_dir / QUERIES_TSV}: unknown query id(s) {unknown[:5]}")
    return Dataset(queries=queries, corpus=corpus, source={"queries": source})


def subset(queries: list[Query], n: int, seed: int = 0) -> list[Query]:
    """A stable seeded subset (§5.2): the ``n`` queries with the smallest sha256(seed:query_id)."""
    def rank(q: Query) -> str:
        return hashlib.sha256(f"{seed}:{q.query_id}".encode()).hexdigest()

    chosen = {q.query_id for q in sorted(queries, key=rank)[:n]}
    return [q for q in queries if q.query_id in chosen]
