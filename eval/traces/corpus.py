"""A synthetic BrowseComp-Plus-like corpus and question set for the scripted stand-in (``synth.py``).

Why it exists: recording real traces needs the real model on a GPU; the cache policies only care
about token sequences, so a corpus with BrowseComp-Plus-like *lengths* is enough to make agent
traces of a realistic shape.

What is realistic here and what is not:

* **Document lengths** follow BCP: about 5,179 words per document on average (``docs/eval.md``
  §1.1 [R]); we draw word counts from a lognormal with that mean (the spread, ``DOC_WORDS_SIGMA``,
  is our choice: web pages range from stubs to very long pages). The search tool shows the first
  512 tokens of a hit and ``get_document`` the whole text, cut by the agent at
  ``observation_max_chars`` (§1.5, §2.2); both come from the project's own tools.
* **Text** (``CorpusParams.language``): ``english`` (the default) draws words by their frequency
  in English (``english.py``), read with Qwen3.6's own tokenizer (``eval/qwen_tokenizer.py``), so
  characters per token, document lengths in tokens and the overlap between different
  conversations are English's. ``salad`` is the old word salad from a 40-word vocabulary picked
  so that the tiny model's 480-token tokenizer reads it at about 3.7 characters per token (ordinary
  English reads at about 1.8 with it); it stays for the fast tests on the tiny tokenizer, and
  makes every conversation look alike (a reason SCR's sessions merged in earlier runs).
  ``chars_per_token`` measures either.
* **Relevance**: every question owns a few invented topic terms; its documents mention them at
  varying densities, so BM25 (the project's ``Searcher``) ranks a question's own documents first
  for queries built from those terms.

Everything is a deterministic function of the seed (``random.Random`` with string seeds hashes them
with SHA-512, independent of ``PYTHONHASHSEED``).
"""
# Spec: docs/eval.md

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from eval.bcp.data import Document
from eval.traces import english
from eval.traces.english import sprinkle

# Words and weights. Function words get English-like weights (they are most of running text);
# the content words are English words the tiny BPE reads in one or two tokens.
WORDS: tuple[tuple[str, int], ...] = (
    ("the", 60), ("and", 30), ("for", 20), ("not", 14), ("value", 14), ("line", 14), ("self", 10),
    ("else", 10), ("returns", 4), ("default", 4), ("station", 4), ("section", 4), ("values", 3),
    ("string", 3), ("object", 3), ("nation", 3), ("linear", 2), ("inline", 2), ("format", 3),
    ("encode", 2), ("define", 2), ("decode", 2), ("action", 3), ("thing", 3), ("these", 5),
    ("there", 5), ("state", 4), ("never", 3), ("lines", 2), ("field", 3), ("enter", 2), ("class", 3),
    ("being", 3), ("together", 1), ("selection", 1), ("relation", 1), ("function", 1), ("citation", 1),
    ("interval", 1), ("baseline", 1),
)
# A paragraph's first word has no leading space; these read as one token without it.
PARAGRAPH_STARTS = ("value", "self", "line", "class", "string", "else")
SYLLABLES = ("bra", "ven", "tor", "quil", "sam", "dre", "lo", "mar", "pek", "zun", "ith", "cor",
             "fal", "ner", "wick", "os", "tal", "bri", "mun", "dax", "el", "roth", "vim", "syl")

DOC_WORDS_MEAN = 5179       # docs/eval.md §1.1 [R]: average BCP document length in words
DOC_WORDS_SIGMA = 0.8       # chosen: lognormal spread of document lengths
DOC_WORDS_MIN = 150         # chosen: no empty stubs
TOPIC_TERMS = 4             # chosen: invented terms per question (what its queries search for)
LANGUAGES = ("english", "salad")


@dataclass(frozen=True)
class CorpusParams:
    """Sizes of the synthetic corpus (sources in the module docstring and on each constant)."""

    # chosen: BCP has ~6.1 evidence + ~76 negatives per query (§1.1 [R]); 30 keeps indexing fast
    docs_per_question: int = 30
    doc_words_mean: int = DOC_WORDS_MEAN
    doc_words_sigma: float = DOC_WORDS_SIGMA
    question_words: tuple[int, int] = (60, 120)  # chosen: a BrowseComp question is one paragraph of constraints
    topic_density: tuple[float, float] = (0.002, 0.02)  # chosen: topic terms per word in a question's documents
    language: str = "english"  # "english" (english.py) or "salad" (the tiny tokenizer's 40 words)

    def __post_init__(self):
        if self.language not in LANGUAGES:
            raise ValueError(f"language {self.language!r}: one of {', '.join(LANGUAGES)}")


@dataclass(frozen=True)
class SynthQuestion:
    qid: str                    # "q0003": the trace's conversation id
    text: str
    terms: tuple[str, ...]      # the invented topic terms its queries use
    docids: tuple[str, ...]     # its own documents


def rng_for(seed: int, name: str) -> random.Random:
    """An independent, reproducible stream per (seed, purpose)."""
    return random.Random(f"{seed}:{name}")


def salad(rng: random.Random, num_words: int, extra: tuple[str, ...] = (), density: float = 0.0,
          plant: tuple[str, ...] = ()) -> str:
    """``num_words`` words in sentences of 8-20 words and paragraphs of 3-7 sentences; each word is
    one of ``extra`` with probability ``density``, and each of ``plant`` occurs at least once."""
    words, weights = zip(*WORDS)
    drawn = sprinkle(rng, rng.choices(words, weights=weights, k=num_words), extra, density, plant)
    out, i, sentences = [rng.choice(PARAGRAPH_STARTS) + " "], 0, 0
    while i < num_words:
        n = rng.randint(8, 20)
        out.append(" ".join(drawn[i:i + n]) + ".")
        i += n
        sentences += 1
        out.append(f"\n\n{rng.choice(PARAGRAPH_STARTS)} " if sentences % rng.randint(3, 7) == 0 else " ")
    return "".join(out).strip()


def prose(rng: random.Random, num_words: int, extra: tuple[str, ...] = (), density: float = 0.0,
          plant: tuple[str, ...] = (), language: str = "english") -> str:
    """``num_words`` words of ``language`` (``english.prose`` or ``salad``), same arguments."""
    if language == "english":
        return english.prose(rng, num_words, extra, density, plant)
    return salad(rng, num_words, extra, density, plant)


def common_words(language: str = "english") -> list[str]:
    """Ordinary words of ``language``, in a fixed order (query filler, the stand-in's notion of a
    word that names no topic)."""
    if language == "english":
        return sorted(english.common_words())
    return [w for w, _ in WORDS]


def known_words(language: str = "english") -> frozenset[str]:
    """Every word ``prose`` may draw for ``language`` (an invented topic term is none of them)."""
    if language == "english":
        return frozenset(english.vocabulary()[0])
    return frozenset(w for w, _ in WORDS)


def invented_word(rng: random.Random, used: set[str]) -> str:
    while True:
        word = "".join(rng.choice(SYLLABLES) for _ in range(3))
        if word not in used:
            used.add(word)
            return word


def doc_words(rng: random.Random, params: CorpusParams) -> int:
    """A lognormal word count with mean ``doc_words_mean``: mu = ln(mean) - sigma^2 / 2."""
    mu = math.log(params.doc_words_mean) - params.doc_words_sigma ** 2 / 2
    return max(DOC_WORDS_MIN, int(rng.lognormvariate(mu, params.doc_words_sigma)))


def build(seed: int, num_questions: int, params: CorpusParams = CorpusParams()
          ) -> tuple[list[SynthQuestion], dict[str, Document]]:
    """The questions and the shared corpus (one namespace, like BCP's 100K documents)."""
    rng = rng_for(seed, "corpus")
    used: set[str] = set()
    questions, corpus = [], {}
    docid_pool = rng.sample(range(10_000, 100_000), num_questions * params.docs_per_question)
    used |= set(known_words(params.language))  # an invented term is never an ordinary word
    for q in range(num_questions):
        terms = tuple(invented_word(rng, used) for _ in range(TOPIC_TERMS))
        docids = tuple(str(d) for d in docid_pool[q * params.docs_per_question:(q + 1) * params.docs_per_question])
        for docid in docids:
            density = rng.uniform(*params.topic_density)
            corpus[docid] = Document(docid, prose(rng, doc_words(rng, params), terms, density,
                                                  language=params.language),
                                     f"https://synthetic.invalid/{docid}")
        text = prose(rng, rng.randint(*params.question_words), terms, 0.05, plant=terms, language=params.language)
        questions.append(SynthQuestion(f"q{q:04d}", text, terms, docids))
    return questions, corpus


def chars_per_token(tokenizer, text: str) -> float:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return len(text) / max(1, len(ids))
