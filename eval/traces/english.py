"""Text that behaves like English for the synthetic corpus, questions, answers and reasoning.

Why: the cache policies see only token ids, but how many tokens a document costs, how long the
shared system prompt is, and how much two *different* conversations have in common all depend on
the text. SCR matches a prompt to a session by content (``docs/scr.md`` §4.3), so text drawn from
a 40-word vocabulary made every conversation look alike (one generated set used 238 distinct
token ids in 109k tokens) and sessions merged.

Words are drawn independently by their frequency in English (``wordfreq`` 3.1.1, Apache-2.0:
its ``top_n_list("en")`` and ``word_frequency``, the "large" list built from Wikipedia,
subtitles, news, books, web text and more), from the ``VOCABULARY`` most frequent alphabetic
words, into sentences of 6-28 words (capitalised, a comma now and then, a full stop) and
paragraphs of 2-7 sentences. That reproduces English's unigram statistics (so characters per
token, and the share of common words two unrelated texts share, are those of English text) but
not its syntax; the invented topic terms of each question (``corpus.py``) are added on top.

``prose`` is a deterministic function of the ``random.Random`` it is given.
"""

from __future__ import annotations

import functools
import itertools
import random

VOCABULARY = 30_000  # most frequent English words drawn from; chosen: beyond it words are rarer than 1e-6
COMMA_RATE = 0.07  # chosen: commas per word in running English prose are roughly 0.05-0.08
SENTENCE_WORDS = (6, 28)  # chosen: English sentences average ~15-20 words with a wide spread
PARAGRAPH_SENTENCES = (2, 7)


@functools.cache
def vocabulary() -> tuple[tuple[str, ...], tuple[float, ...]]:
    """(words, cumulative weights) of the ``VOCABULARY`` most frequent alphabetic English words."""
    import wordfreq

    words = tuple(w for w in wordfreq.top_n_list("en", VOCABULARY + 2_000) if w.isalpha() and w.isascii())[:VOCABULARY]
    weights = [wordfreq.word_frequency(w, "en") for w in words]
    return words, tuple(itertools.accumulate(weights))


def common_words(n: int = 200) -> frozenset[str]:
    """The ``n`` most frequent words (the stand-in's idea of a word that names no topic)."""
    return frozenset(vocabulary()[0][:n])


def draw(rng: random.Random, k: int) -> list[str]:
    words, cumulative = vocabulary()
    return rng.choices(words, cum_weights=cumulative, k=k)


def sprinkle(rng: random.Random, drawn: list[str], extra: tuple[str, ...], density: float,
             plant: tuple[str, ...]) -> list[str]:
    """``drawn`` with each word replaced by one of ``extra`` with probability ``density``, and each
    of ``plant`` put in at least once (at random places); changed in place and returned. The
    salad of ``corpus.py`` uses it too."""
    if extra and density > 0:
        for i in range(len(drawn)):
            if rng.random() < density:
                drawn[i] = rng.choice(extra)
    for i, word in zip(rng.sample(range(len(drawn)), min(len(plant), len(drawn))), plant):
        drawn[i] = word
    return drawn


def prose(rng: random.Random, num_words: int, extra: tuple[str, ...] = (), density: float = 0.0,
          plant: tuple[str, ...] = ()) -> str:
    """``num_words`` words as sentences and paragraphs; each word is one of ``extra`` with
    probability ``density``, and each of ``plant`` occurs at least once."""
    drawn = sprinkle(rng, draw(rng, num_words), extra, density, plant)
    paragraphs, sentences, i = [], [], 0
    budget = rng.randint(*PARAGRAPH_SENTENCES)
    while i < num_words:
        n = min(rng.randint(*SENTENCE_WORDS), num_words - i)
        words = [w + "," if j < n - 1 and rng.random() < COMMA_RATE else w for j, w in enumerate(drawn[i:i + n])]
        words[0] = words[0][:1].upper() + words[0][1:]
        sentences.append(" ".join(words) + ".")
        i += n
        if len(sentences) == budget:
            paragraphs.append(" ".join(sentences))
            sentences, budget = [], rng.randint(*PARAGRAPH_SENTENCES)
    if sentences:
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)
