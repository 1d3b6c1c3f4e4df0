"""A synthetic world for the search task, its document corpus, and a small BM25 index over it.

Why synthetic: the search task must be answerable only by retrieval, offline, and small enough for a
tiny character-level model, so the project generates its own "encyclopedia" deterministically from
a seed. The world has *lands* (a capital city and a fruit each) and *people* (a home land and a
job each); every entity has one short document (~25-30 characters)::

    "Zorv: capital Kelm, fruit fig"
    "Mira: home Zorv, job smith"

All generated names are distinct four-letter words that collide with no other word of the corpus,
so a question has exactly one answer and the entity's name retrieves its document.

Retrieval is BM25 (Okapi; Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and
Beyond", 2009) from the maintained ``bm25s`` library (Lù, 2024; numpy only, in the ``engine``
extra), in its Lucene variant: ``score(q, d) = sum over distinct query terms t of idf(t) *
tf(t,d) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))`` with ``idf(t) = ln(1 + (N - df(t) + 0.5) /
(df(t) + 0.5))`` (always positive; Lucene drops the classic ``(k1 + 1)`` factor, which does not
change a ranking). :class:`BM25Index` wraps it so that the task sees one small interface and the
ranking stays deterministic: query terms are de-duplicated and ties are broken by the lower
document index (the library's own top-k selection does not promise an order among ties). Scores
are float64. Without ``bm25s`` this module still imports; building an index raises a
:class:`~jigsawrl.errors.ConfigError` naming the extra to install.

Dense retrieval, as Search-R1 does it (E5 embeddings over a FAISS index), is the opt-in
:class:`DenseIndex` (task parameter ``retriever: dense``, the ``dense`` extra): exact inner-product
search (``faiss.IndexFlatIP``) over unit-length WordLlama embeddings (``wordllama``'s
``l2_supercat`` model: 32,000 Llama-2-vocabulary token vectors of 256 dimensions, average-pooled;
no torch). Its weights and tokenizer ship inside the ``wordllama`` wheel and are loaded from the
installed package, never from the hub (:func:`wordllama_model`). It is a static-embedding model,
not E5: on the ``hard`` world it ranks the right document first for ~90% of the demo queries
where BM25 ranks it first for all (the invented names are rare sub-words), so BM25 stays the
default. Checked before adopting it (wordllama 0.4.0.post1, faiss-cpu 1.15.1): both install
beside torch 2.13.0 without touching it (``pip check`` clean; wordllama needs numpy, safetensors,
tokenizers, toml, pydantic, requests); the weights file is the wheel's own (its sha256 is the one
in the wheel's RECORD) and holds one float16 256-d vector per token of the packaged 32,000-token
Llama-2 tokenizer, as the package says; the model loads and embeds with the network refused
(``tests/tasks/test_corpus.py`` checks all three). ``sentence-transformers``, ``fastembed`` and
``model2vec`` were not taken: their documented loaders fetch the model from the hub (or a CDN)
at first use; none ships one inside its wheel.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from typing import Any

from jigsawrl.errors import ConfigError

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
    """BM25 (Lucene variant, ``bm25s``) over a fixed list of documents; see the module docstring.

    Args:
        docs: the documents; their positions are their ids.
        k1: term-frequency saturation (>= 0).
        b: length normalisation (0..1).

    Raises:
        ValueError: no documents.
        ConfigError: ``bm25s`` is not installed (it comes with the ``engine`` extra).
    """

    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75) -> None:
        if not docs:
            raise ValueError("BM25Index needs at least one document")
        bm25s = _bm25s()
        self.docs = list(docs)
        self.k1, self.b = k1, b
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="lucene", dtype="float64")
        # empty documents index as the library's empty token, so positions stay ids
        self._bm25.index([tokenize(d) or [""] for d in self.docs], show_progress=False)

    def scores(self, query: str) -> list[float]:
        """The BM25 score of every document for ``query`` (distinct terms, case-folded)."""
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self._bm25.vocab_dict]
        if not terms:
            return [0.0] * len(self.docs)
        return [float(s) for s in self._bm25.get_scores(terms)]

    def top(self, query: str, k: int) -> list[int]:
        """Ids of the ``k`` best documents with a positive score, best first, ties by id."""
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


def _bm25s() -> Any:
    """The ``bm25s`` module, or a ConfigError that says how to install it."""
    try:
        import bm25s
        # its index build logs a DEBUG line per call through its own handler: keep it quiet
        logging.getLogger("bm25s").setLevel(logging.WARNING)
    except ImportError:
        raise ConfigError("the search task ranks documents with bm25s, which is not installed",
                          where="task: search",
                          fix="pip install -e '.[engine]' (or pip install bm25s; it needs only "
                              "numpy and leaves torch alone)") from None
    return bm25s


class DenseIndex:
    """Exact cosine-similarity search (FAISS) over WordLlama embeddings; the module docstring.

    Scores are rounded to 6 decimals before ranking, so that float32 sums that differ in their
    last bits between CPUs (BLAS kernels) give the same order; ties go to the lower id.

    Raises:
        ValueError: no documents.
        ConfigError: ``faiss-cpu`` or ``wordllama`` is not installed (the ``dense`` extra).
    """

    def __init__(self, docs: list[str]) -> None:
        if not docs:
            raise ValueError("DenseIndex needs at least one document")
        faiss, self._model = _dense_modules()
        self.docs = list(docs)
        vectors = self._embed(self.docs)
        self._index = faiss.IndexFlatIP(vectors.shape[1])
        self._index.add(vectors)

    def _embed(self, texts: list[str]) -> Any:
        import numpy as np

        return np.ascontiguousarray(self._model.embed(texts, norm=True), dtype=np.float32)

    def scores(self, query: str) -> list[float]:
        """The cosine similarity of every document to ``query`` (0 for an empty query)."""
        if not tokenize(query):
            return [0.0] * len(self.docs)
        sims, ids = self._index.search(self._embed([query]), len(self.docs))
        out = [0.0] * len(self.docs)
        for i, s in zip(ids[0], sims[0], strict=True):
            out[int(i)] = round(float(s), 6)
        return out

    def top(self, query: str, k: int) -> list[int]:
        """Ids of the ``k`` most similar documents with a positive score, ties by id."""
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


RETRIEVERS = ("bm25", "dense")


def make_index(docs: list[str], retriever: str = "bm25") -> BM25Index | DenseIndex:
    """The search index a task asks for by name (:data:`RETRIEVERS`).

    Raises:
        ValueError: an unknown retriever.
        ConfigError: its library is not installed.
    """
    if retriever == "bm25":
        return BM25Index(docs)
    if retriever == "dense":
        return DenseIndex(docs)
    raise ValueError(f"retriever must be one of {', '.join(RETRIEVERS)}, got {retriever!r}")


def wordllama_model() -> Any:
    """WordLlama's ``l2_supercat`` 256-dimensional model, from the files inside the installed
    ``wordllama`` wheel. ``WordLlama.load()`` alone looks for the tokenizer in a folder the
    wheel does not have (``tokenizer/``; it ships ``tokenizers/``) and then downloads it from the
    hub; pointing its cache at the package folder finds both files there, with no network."""
    from pathlib import Path

    import wordllama

    model = wordllama.WordLlama.load(config="l2_supercat", dim=256,
                                     cache_dir=Path(wordllama.__file__).parent)
    rows, dim = model.embedding.shape
    if (rows, dim) != (model.tokenizer.get_vocab_size(), 256):
        raise ConfigError(f"wordllama's packaged model is {rows}x{dim}, not one 256-dimensional "
                          f"vector per token of its {model.tokenizer.get_vocab_size()}-token "
                          "vocabulary", where="retriever: dense",
                          fix="pip install 'wordllama==0.4.0.post1' (the version checked)")
    return model


def _dense_modules() -> tuple[Any, Any]:
    """``faiss`` and the WordLlama model, or a ConfigError naming the extra to install."""
    try:
        import faiss
        import wordllama  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"dense retrieval needs faiss-cpu and wordllama ({exc})",
                          where="task: search, retriever: dense",
                          fix="pip install -e '.[dense]' (neither pulls torch), or use "
                              "retriever: bm25") from None
    return faiss, wordllama_model()


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
