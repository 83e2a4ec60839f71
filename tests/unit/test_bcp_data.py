"""eval.bcp.data (and its parts crypto, rows, qrels): the §1.3 decryption, loading and validation;
eval.bcp.fixtures loads back."""
# Spec: docs/eval.md

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from eval.bcp import crypto, data, fixtures
from eval.bcp.crypto import decrypt_record, decrypt_string, encrypt_record, encrypt_string
from eval.bcp.data import DataError, load_dataset

PASSWORD = "unit-test password"


def test_encrypt_matches_the_published_scheme_computed_by_hand():
    # Independent of the module: XOR with sha256(password) repeated, then base64.
    plain = "Which town? " * 5  # 60 bytes > one 32-byte digest, so the key repeats
    key = hashlib.sha256(PASSWORD.encode()).digest()
    expected = base64.b64encode(bytes(b ^ key[i % 32] for i, b in enumerate(plain.encode()))).decode()
    assert encrypt_string(plain, PASSWORD) == expected
    assert decrypt_string(expected, PASSWORD) == plain


@pytest.mark.parametrize("plain", ["", "a", "x" * 32, "x" * 33, "Grüße, 東京 — ünïcode", "line\nbreak\ttab"])
def test_string_round_trip(plain):
    assert decrypt_string(encrypt_string(plain, PASSWORD), PASSWORD) == plain


def test_record_round_trip_keeps_query_id_in_clear():
    record = {"query_id": "42", "query": "q?", "answer": "A", "evidence_docs": [{"docid": "7", "text": "t"}],
              "n": 3, "flag": None}
    enc = encrypt_record(record, PASSWORD)
    assert enc["query_id"] == "42"
    assert enc["query"] != "q?" and enc["evidence_docs"][0]["docid"] != "7"
    assert enc["n"] == 3 and enc["flag"] is None
    assert decrypt_record(enc, PASSWORD) == record


def test_wrong_password_and_plaintext_are_clear_errors():
    enc = encrypt_string("a reasonably long answer string", PASSWORD)
    with pytest.raises(DataError, match="wrong password"):
        decrypt_string(enc, "another password")
    with pytest.raises(DataError, match="already decrypted"):
        decrypt_string("plain text, not base64!", PASSWORD)


@pytest.fixture
def fixture_dir(tmp_path: Path) -> Path:
    return fixtures.write_fixture(tmp_path / "bcp", num_queries=4, num_docs=30, seed=3)


def test_fixture_loads_with_labels_from_qrels(fixture_dir):
    ds = load_dataset(fixture_dir)
    queries, docs, _ = fixtures.build(4, 30, 3)
    assert ds.queries == queries
    assert set(ds.corpus) == {d.docid for d in docs} and len(ds.corpus) == 30
    for q in ds.queries:
        assert len(q.evidence_docids) == 2 and q.gold_docids == q.evidence_docids[1:]
        assert q.answer in ds.corpus[q.gold_docids[0]].text
        assert q.answer not in q.text
    # The query file on disk is really encrypted: no answer appears in it.
    raw = (fixture_dir / "browsecomp_plus.jsonl").read_text()
    assert all(q.answer not in raw for q in ds.queries)


def test_fixture_is_deterministic(tmp_path):
    a = fixtures.write_fixture(tmp_path / "a", seed=5)
    b = fixtures.write_fixture(tmp_path / "b", seed=5)
    c = fixtures.write_fixture(tmp_path / "c", seed=6)
    assert (a / "corpus.jsonl").read_text() == (b / "corpus.jsonl").read_text()
    assert (a / "corpus.jsonl").read_text() != (c / "corpus.jsonl").read_text()


def test_labels_from_records_when_qrels_absent(fixture_dir):
    expected = load_dataset(fixture_dir).queries
    for name in ("qrel_evidence.txt", "qrel_golds.txt", "queries.tsv"):
        (fixture_dir / "topics-qrels" / name).unlink()
    assert load_dataset(fixture_dir).queries == expected


def test_decrypted_jsonl_needs_no_password(fixture_dir, monkeypatch):
    expected = load_dataset(fixture_dir).queries
    rows = [json.loads(line) for line in (fixture_dir / "browsecomp_plus.jsonl").read_text().splitlines()]
    (fixture_dir / "browsecomp_plus.jsonl").unlink()
    (fixture_dir / "canary.txt").unlink()
    with (fixture_dir / data.DECRYPTED_NAME).open("w") as f:
        for r in rows:
            f.write(json.dumps(decrypt_record(r, fixtures.FIXTURE_PASSWORD)) + "\n")
    monkeypatch.delenv(crypto.PASSWORD_ENV, raising=False)
    assert load_dataset(fixture_dir).queries == expected


def test_password_sources(fixture_dir, monkeypatch):
    (fixture_dir / "canary.txt").unlink()
    monkeypatch.delenv(crypto.PASSWORD_ENV, raising=False)
    with pytest.raises(DataError, match="encrypted"):
        load_dataset(fixture_dir)
    assert load_dataset(fixture_dir, password=fixtures.FIXTURE_PASSWORD).queries
    monkeypatch.setenv(crypto.PASSWORD_ENV, fixtures.FIXTURE_PASSWORD)
    assert load_dataset(fixture_dir).queries
    with pytest.raises(DataError, match="wrong password"):
        load_dataset(fixture_dir, password="not it")


def test_parquet_records_and_corpus(fixture_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    expected = load_dataset(fixture_dir)
    for stem in ("browsecomp_plus", "corpus"):
        rows = [json.loads(x) for x in (fixture_dir / f"{stem}.jsonl").read_text().splitlines()]
        (fixture_dir / stem).mkdir()
        pq.write_table(pa.Table.from_pylist(rows), fixture_dir / stem / "test-00000-of-00001.parquet")
        (fixture_dir / f"{stem}.jsonl").unlink()
    got = load_dataset(fixture_dir)
    assert got.queries == expected.queries and got.corpus == expected.corpus


def _edit_jsonl(path: Path, edit) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows = edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _drop_answer(rows):
    del rows[1]["answer"]
    return rows


def _dup_query(rows):
    return rows + [rows[0]]


def _dup_doc(rows):
    return rows + [rows[3]]


def _doc_without_text(rows):
    del rows[2]["text"]
    return rows


ERRORS = [
    pytest.param("browsecomp_plus.jsonl", _drop_answer, r"missing field\(s\) answer", id="missing-answer"),
    pytest.param("browsecomp_plus.jsonl", _dup_query, "duplicate query_id '1'", id="duplicate-query"),
    pytest.param("corpus.jsonl", _dup_doc, "duplicate docid", id="duplicate-docid"),
    pytest.param("corpus.jsonl", _doc_without_text, r"missing field\(s\) text", id="doc-without-text"),
]


@pytest.mark.parametrize("name, edit, message", ERRORS)
def test_validation_errors(fixture_dir, name, edit, message):
    _edit_jsonl(fixture_dir / name, edit)
    with pytest.raises(DataError, match=message):
        load_dataset(fixture_dir)


@pytest.mark.parametrize("line, message", [
    ("1 Q0 99999999 1", "not in the corpus"),
    ("77 Q0 {doc} 1", r"unknown query id\(s\) \['77'\]"),
    ("1 Q0 {doc}", "expected 'qid Q0 docid rel'"),
    ("1 Q0 {doc} yes", "not an integer"),
    ("{dup}", "duplicate qrel"),
], ids=["unknown-docid", "unknown-query", "three-fields", "bad-relevance", "duplicate-line"])
def test_qrels_errors(fixture_dir, line, message):
    qrels = fixture_dir / "topics-qrels" / "qrel_evidence.txt"
    first = qrels.read_text().splitlines()[0]
    some_doc = next(iter(load_dataset(fixture_dir).corpus))
    qrels.write_text(qrels.read_text() + line.format(doc=some_doc, dup=first) + "\n")
    with pytest.raises(DataError, match=message):
        load_dataset(fixture_dir)


def test_zero_relevance_lines_are_not_labels(fixture_dir):
    qrels = fixture_dir / "topics-qrels" / "qrel_golds.txt"
    extra = next(d for d in load_dataset(fixture_dir).corpus)
    qrels.write_text(qrels.read_text() + f"2 Q0 {extra} 0\n")
    assert extra not in load_dataset(fixture_dir).query("2").gold_docids


def test_missing_corpus_and_tsv_with_unknown_id(fixture_dir):
    tsv = fixture_dir / "topics-qrels" / "queries.tsv"
    tsv.write_text(tsv.read_text() + "999\tan extra question\n")
    with pytest.raises(DataError, match="queries.tsv: unknown query id"):
        load_dataset(fixture_dir)
    (fixture_dir / "corpus.jsonl").unlink()
    with pytest.raises(DataError, match="no corpus"):
        load_dataset(fixture_dir)


def test_subset_is_stable_and_seeded(fixture_dir):
    qs = load_dataset(fixture_dir).queries
    a = data.subset(qs, 2, seed=0)
    assert set(a) == set(data.subset(list(reversed(qs)), 2, seed=0))  # independent of input order
    assert len(a) == 2 and set(a) <= set(qs)
    assert [q.query_id for q in a] == [q.query_id for q in qs if q in a]  # original order kept
    seeds = {tuple(q.query_id for q in data.subset(qs, 2, seed=s)) for s in range(8)}
    assert len(seeds) > 1


def test_fixture_cli(tmp_path, capsys):
    assert fixtures.main(["--out", str(tmp_path / "cli"), "--queries", "2", "--docs", "10"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert len(load_dataset(tmp_path / "cli").queries) == 2
    with pytest.raises(ValueError):
        fixtures.build(num_queries=4, num_docs=11)
