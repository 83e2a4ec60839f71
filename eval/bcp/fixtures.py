"""A small self-made BrowseComp-Plus look-alike for offline tests (docs/eval.md §3.3).

``python -m eval.bcp.fixtures --out DIR [--queries 3] [--docs 40] [--seed 0]``

Writes, in the formats :mod:`eval.bcp.data` reads (§1.2), with the §1.3 encryption under a *fake*
password (:data:`FIXTURE_PASSWORD`, also written to ``canary.txt`` so the loader finds it):

* ``browsecomp_plus.jsonl``: one encrypted record per question (query_id in clear);
* ``corpus.jsonl``: plain ``{docid, text, url}`` rows;
* ``topics-qrels/{queries.tsv, qrel_evidence.txt, qrel_golds.txt}``.

Every question is a two-hop fact planted in two documents: the *bridge* document says who made
an invented artefact; the *gold* document says where that maker moved in a given year, and also
names the artefact. The question names the artefact (a made-up word found only in those two
documents) and the year, so BM25 ranks the gold document first. Evidence = {bridge, gold}; gold =
{gold} (gold documents are the evidence that contains the answer, §1.1). A hard negative per
question reuses the question's wording with another maker, town and year. The rest is filler.
Everything is a deterministic function of ``seed``. Nothing here is real data.
"""
# Spec: docs/eval.md

from __future__ import annotations

import json
import random
from pathlib import Path

from eval.bcp import data
from eval.bcp.crypto import PASSWORD_FILE, encrypt_record
from eval.bcp.data_types import Document, Query
from eval.bcp.qrels import write_qrels, write_queries_tsv

FIXTURE_PASSWORD = "bcp-fixture-password (fake, not the BrowseComp canary)"

_SYLLABLES = ("bra", "ven", "tor", "quil", "sam", "dre", "lo", "mar", "pek", "zun", "ith", "cor",
              "fal", "ner", "wick", "os", "tal", "bri", "mun", "dax", "el", "roth", "vim", "syl")
_KINDS = ("lens", "loom", "clock", "bridge", "engine", "compass", "organ", "kiln")
_JOBS = ("engineer", "clockmaker", "architect", "glassblower", "instrument maker", "surveyor")
_FILLER = (
    "The committee reviewed the annual report on regional trade and agriculture.",
    "Local newspapers described the weather that season as unusually mild.",
    "A new railway line connected the valley villages to the coast.",
    "The museum catalogue lists several donated paintings and letters.",
    "Historians disagree about the exact date of the harbour expansion.",
    "The school opened a small library with books in three languages.",
    "Farmers in the district grew barley, oats and a little flax.",
    "The council later renamed the main square after a benefactor.",
    "An exhibition of tools and machinery drew visitors from nearby towns.",
    "The river flooded twice in that decade, damaging the lower mills.",
)


class _Names:
    """Unique invented words from ``rng``."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, parts: int = 3) -> str:
        while True:
            w = "".join(self.rng.choice(_SYLLABLES) for _ in range(parts))
            if w not in self.used:
                self.used.add(w)
                return w

    def person(self) -> str:
        return f"{self.word(2).capitalize()} {self.word(3).capitalize()}"


def _filler(rng: random.Random, sentences: int) -> str:
    return " ".join(rng.choice(_FILLER) for _ in range(sentences))


def _question_docs(rng: random.Random, names: _Names, qid: str, docids: list[str]) -> tuple[Query, list[Document]]:
    """One planted two-hop question, its bridge and gold documents and a hard negative."""
    artefact = f"{names.word()} {rng.choice(_KINDS)}"
    maker, job, town, year = names.person(), rng.choice(_JOBS), names.word().capitalize(), rng.randint(1850, 1960)
    other, other_town = names.person(), names.word().capitalize()
    other_year = year + rng.choice((-7, -3, 4, 9))
    bridge, gold, negative = docids
    texts = {
        bridge: f"{maker} was a {job} best known for designing the {artefact}. {_filler(rng, 4)}",
        gold: (f"{_filler(rng, 2)} Records show that {maker}, who designed the {artefact}, "
               f"relocated in {year} to the town of {town}. {_filler(rng, 3)}"),
        negative: (f"{_filler(rng, 1)} The {job} {other} relocated in {other_year} to the town of "
                   f"{other_town}. {_filler(rng, 4)}"),
    }
    article = "An" if job[0] in "aeiou" else "A"
    question = (f"{article} {job} designed the {artefact}. In {year} this designer relocated to a town. "
                f"What is the name of that town?")
    query = Query(qid, question, town, evidence_docids=(bridge, gold), gold_docids=(gold,))
    return query, [Document(d, t, f"https://fixture.invalid/doc/{d}") for d, t in texts.items()]


def build(num_queries: int = 3, num_docs: int = 40, seed: int = 0) -> tuple[list[Query], list[Document], dict]:
    """(queries, corpus documents, {query_id: negative docids}) for the given seed."""
    if num_queries < 1 or num_docs < 3 * num_queries:
        raise ValueError(f"need num_queries >= 1 and num_docs >= 3 * num_queries, got {num_queries}, {num_docs}")
    rng = random.Random(seed)
    names = _Names(rng)
    docids = [str(10_000 + i) for i in rng.sample(range(90_000), num_docs)]
    queries, docs, negatives = [], [], {}
    for i in range(num_queries):
        query, qdocs = _question_docs(rng, names, str(i + 1), docids[3 * i: 3 * i + 3])
        queries.append(query)
        docs.extend(qdocs)
        negatives[query.query_id] = [qdocs[2].docid]
    for docid in docids[3 * num_queries:]:
        text = f"{names.person()} wrote about the {names.word()} estate. {_filler(rng, rng.randint(3, 8))}"
        docs.append(Document(docid, text, f"https://fixture.invalid/doc/{docid}"))
    return queries, docs, negatives


def write_fixture(out_dir: Path, *, num_queries: int = 3, num_docs: int = 40, seed: int = 0) -> Path:
    """Write the fixture dataset under ``out_dir`` (created) and return ``out_dir``."""
    out = Path(out_dir)
    (out / data.QRELS_DIR).mkdir(parents=True, exist_ok=True)
    queries, docs, negatives = build(num_queries, num_docs, seed)
    by_id = {d.docid: d for d in docs}

    def doc_list(docids):
        return [{"docid": d, "text": by_id[d].text, "url": by_id[d].url} for d in docids]

    with (out / f"{data.ENCRYPTED_STEM}.jsonl").open("w", encoding="utf-8") as f:
        for q in queries:
            record = {"query_id": q.query_id, "query": q.text, "answer": q.answer,
                      "evidence_docs": doc_list(q.evidence_docids), "gold_docs": doc_list(q.gold_docids),
                      "negative_docs": doc_list(negatives[q.query_id])}
            f.write(json.dumps(encrypt_record(record, FIXTURE_PASSWORD)) + "\n")
    with (out / f"{data.CORPUS_STEM}.jsonl").open("w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"docid": d.docid, "text": d.text, "url": d.url}) + "\n")
    (out / PASSWORD_FILE).write_text(FIXTURE_PASSWORD + "\n", encoding="utf-8")
    qdir = out / data.QRELS_DIR
    write_queries_tsv(qdir / data.QUERIES_TSV, queries)
    write_qrels(qdir / data.EVIDENCE_QRELS, {q.query_id: q.evidence_docids for q in queries})
    write_qrels(qdir / data.GOLD_QRELS, {q.query_id: q.gold_docids for q in queries})
    return out


def main(argv: list[str] | None = None) -> int:
    from eval.cli_types import Parser, int_at_least

    parser = Parser(prog="python -m eval.bcp.fixtures", description=(
        "Write a small self-made BrowseComp-Plus look-alike for offline tests, in the formats eval.bcp.data "
        "reads and encrypted under a fake password (written to canary.txt). Every question is a planted two-hop "
        "fact; everything is a deterministic function of the seed. Nothing here is real data."))
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.add_argument("--queries", type=int_at_least(1), default=3, metavar="N", help="questions")
    parser.add_argument("--docs", type=int_at_least(1), default=40, metavar="N", help="documents in the corpus")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated questions and documents")
    args = parser.parse_args(argv)
    print(write_fixture(args.out, num_queries=args.queries, num_docs=args.docs, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
