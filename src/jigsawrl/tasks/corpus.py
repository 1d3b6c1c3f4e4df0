"""A synthetic world for the search task, its document corpus, and a small BM25 index over it.

Why synthetic: the search task must be answerable only by retrieval, offline, and small enough for a
tiny character-level model, so the project generates its own "encyclopedia" deterministically from
a seed. The world has *lands* (a capital city and a fruit each) and *people* (a home land and a
job each); every entity has one short document (~25-30 characters)::

    "Zorv: capital Kelm, fruit fig"
    "Mira: home Zorv, job smith"

All generated names are distinct four-letter words that collide with no other word of the corpus,
so a question has exactly one answer and the entity's name retrieves its document.

BM25 (Okapi; Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond",
2009): ``score(q, d) = sum over distinct query terms t of idf(t) * tf(t,d) * (k1 + 1) /
(tf(t,d) + k1 * (1 - b + b * |d| / avgdl))`` with ``idf(t) = ln(1 + (N - df(t) + 0.5) /
(df(t) + 0.5))`` (the always-positive variant used by Lucene). It is implemented here (~40 lines,
an inverted index, no dependency) instead of using ``rank_bm25`` so that ``tasks/`` needs no extra
package and ranking ties are broken deterministically (lower document index first).
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass

FRUITS = ("fig", "plum", "pear", "lime", "date", "kiwi")
JOBS = ("smith", "baker", "miner", "guard", "scribe", "cook")
FIELD_WORDS = ("capital", "fruit", "home", "job")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric words (what BM25 indexes and queries are split into)."""
    return _TOKEN.findall(text.lower())


class BM25Index:
    """Okapi BM25 over a fixed list of documents (see module docstring for the formula).

    Args:
        docs: the documents; their positions are their ids.
        k1: term-frequency saturation (>= 0).
        b: length normalisation (0..1).
    """

    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        self.docs = list(docs)
        self.k1, self.b = k1, b
        self.doc_len = [len(tokenize(d)) for d in self.docs]
        self.avgdl = max(sum(self.doc_len) / len(self.docs), 1e-9)
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(self.docs):
            for term, tf in Counter(tokenize(doc)).items():
                self.postings.setdefault(term, []).append((i, tf))
        n = len(self.docs)
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
                    for t, p in self.postings.items()}

    def scores(self, query: str) -> list[float]:
        """The BM25 score of every document for ``query``."""
        out = [0.0] * len(self.docs)
        for term in set(tokenize(query)):
            for i, tf in self.postings.get(term, ()):
                norm = tf + self.k1 * (1 - self.b + self.b * self.doc_len[i] / self.avgdl)
                out[i] += self.idf[term] * tf * (self.k1 + 1) / norm
        return out

    def top(self, query: str, k: int) -> list[int]:
        """Ids of the ``k`` best documents with a positive score, best first, ties by id."""
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


@dataclass(frozen=True)
class Land:
    name: str
    capital: str
    fruit: str


@dataclass(frozen=True)
class Person:
    name: str
    home: str
    job: str


@dataclass(frozen=True)
class World:
    """The generated entities and one document per entity (lands first, then people)."""

    lands: tuple[Land, ...]
    people: tuple[Person, ...]

    @property
    def docs(self) -> list[str]:
        return [land_doc(x) for x in self.lands] + [person_doc(p) for p in self.people]


def land_doc(land: Land) -> str:
    return f"{land.name}: capital {land.capital}, fruit {land.fruit}"


def person_doc(person: Person) -> str:
    return f"{person.name}: home {person.home}, job {person.job}"


def _names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct capitalised 4-letter names (CVCV or CVCC) that are no corpus word."""
    reserved = set(FRUITS) | set(JOBS) | set(FIELD_WORDS)
    names: list[str] = []
    while len(names) < count:
        c1, v1, c2 = rng.choice(_CONSONANTS), rng.choice(_VOWELS), rng.choice(_CONSONANTS)
        last = rng.choice(_VOWELS if rng.random() < 0.5 else _CONSONANTS)
        word = c1 + v1 + c2 + last
        if word not in reserved and word.capitalize() not in names:
            names.append(word.capitalize())
    return names


def make_world(num_lands: int, num_people: int, seed: int) -> World:
    """A deterministic world of ``num_lands`` lands and ``num_people`` people.

    Raises:
        ValueError: fewer than one land or person, or more than 300 names in all.
    """
    if num_lands < 1 or num_people < 1 or 2 * num_lands + num_people > 300:
        raise ValueError("need 1 <= num_lands, 1 <= num_people, 2*num_lands + num_people <= 300")
    rng = random.Random(f"world|{seed}")
    names = _names(rng, 2 * num_lands + num_people)
    lands = tuple(Land(names[i], names[num_lands + i], rng.choice(FRUITS))
                  for i in range(num_lands))
    people = tuple(Person(names[2 * num_lands + i], rng.choice(lands).name, rng.choice(JOBS))
                   for i in range(num_people))
    return World(lands, people)
