"""Search: multi-turn retrieval (Search-R1 style) over the project's synthetic corpus.

The model writes a query and stops at ``</search>``; the environment ranks the corpus of
:mod:`jigsawrl.tasks.corpus` with BM25 (``bm25s``; or densely, ``retriever: dense``) and inserts the top-k documents as ``<doc>d1|d2</doc>``;
multi-hop questions need a second search that uses what the first one returned::

    prompt  "Q: capital of home of Mira?\\n"
    demo    "<search>Mira home</search><doc>Mira: home Zorv, job smith</doc>"
            "<search>Zorv capital</search><doc>Zorv: capital Kelm, fruit fig</doc>A: Kelm"

(The demo is one line; it is split here for width.) The demo's queries are ``"<entity> <field>"``
and its inserted documents are exactly what the tool returns with the task's ``top_k``. Reward on
the final answer (exact match after normalising case and spaces, as Search-R1 does): the text
after the last ``A:`` that follows the last tool result; 1.0 if it matches, ``format_score`` (0.1)
for a non-empty wrong answer, 0.0 for none. A bad call (no complete tag, an over-long or empty
query) gets ``<doc>error</doc>`` and ``ok=False``; a query that matches nothing gets
``<doc>none</doc>``.

Caps (checked before any ranking, none a timeout): a query is at most ``MAX_QUERY_CHARS`` (48)
characters and ``MAX_QUERY_TERMS`` (8) words, so ranking touches at most 8 posting lists; an
answer is at most ``top_k`` (<= ``MAX_TOP_K`` = 5) documents of ~30 characters. A query of every
word of the corpus is refused by these caps. Finding the call is one backwards scan of the text.

The world (and hence the corpus) comes from ``corpus_seed`` and is shared by both splits; dataset
seeds only choose questions. Difficulty presets set the world's size, the share of two-hop
questions and ``top_k`` (each overridable). With ``top_k=1`` a two-hop demo is ~140 characters;
each extra document adds ~30 per search.
"""

from __future__ import annotations

import random
from typing import Any

from jigsawrl.tasks.base import (
    BaseTask,
    Example,
    ToolResult,
    first_line,
    last_tagged,
    register_task,
    resolve_preset,
    sample_examples,
    tool_guard,
)
from jigsawrl.tasks.corpus import World, make_index, make_world, tokenize

PRESETS: dict[str, dict[str, Any]] = {
    "easy": {"num_lands": 8, "num_people": 16, "two_hop_fraction": 0.0, "top_k": 1},
    "medium": {"num_lands": 12, "num_people": 24, "two_hop_fraction": 0.5, "top_k": 1},
    "hard": {"num_lands": 16, "num_people": 48, "two_hop_fraction": 0.5, "top_k": 2},
}
CALL_OPEN, CALL_CLOSE = "<search>", "</search>"
DOC_OPEN, DOC_CLOSE, DOC_SEP = "<doc>", "</doc>", "|"
ANSWER = "A:"
MAX_QUERY_CHARS = 48
MAX_QUERY_TERMS = 8
MAX_TOP_K = 5


def answer_of(solution_str: str) -> str | None:
    """The normalised text after the last ``A:`` that follows the last tool result, or None."""
    end = solution_str.rfind(DOC_CLOSE)
    tail = solution_str if end < 0 else solution_str[end + len(DOC_CLOSE):]
    pos = tail.rfind(ANSWER)
    if pos < 0:
        return None
    return normalize(first_line(tail[pos + len(ANSWER):]))


def normalize(text: str) -> str:
    """Lower case, single spaces, no surrounding spaces or final period."""
    return " ".join(text[:64].lower().split()).rstrip(".")


@register_task("search")
class SearchTask(BaseTask):
    """Retrieval-augmented question answering (see module docstring).

    Args:
        difficulty: preset name.
        num_lands, num_people: size of the world; override the preset.
        two_hop_fraction: share of two-hop questions; overrides the preset.
        top_k: documents returned per search (1..5); overrides the preset.
        corpus_seed: seed of the world (shared by every split and dataset seed).
        retriever: ``"bm25"`` (default, ``bm25s``) or ``"dense"`` (FAISS over WordLlama
            embeddings, the ``dense`` extra); see :mod:`jigsawrl.tasks.corpus`.
        test_fraction: share of the question space reserved for the test split.
        format_score, tool_latency_s, tool_latency_jitter: see :class:`BaseTask`.
    """

    multi_turn = True
    stop = (CALL_CLOSE,)
    error_text = f"{DOC_OPEN}error{DOC_CLOSE}"

    def __init__(self, difficulty: str = "easy", num_lands: int | None = None,
                 num_people: int | None = None, two_hop_fraction: float | None = None,
                 top_k: int | None = None, corpus_seed: int = 0, test_fraction: float = 0.2,
                 format_score: float = 0.1, tool_latency_s: float = 0.0,
                 tool_latency_jitter: float = 0.0, retriever: str = "bm25") -> None:
        super().__init__(tool_latency_s, tool_latency_jitter, format_score)
        p = resolve_preset(PRESETS, difficulty, num_lands=num_lands, num_people=num_people,
                           two_hop_fraction=two_hop_fraction, top_k=top_k)
        if not 1 <= p["top_k"] <= MAX_TOP_K:
            raise ValueError(f"top_k must be in 1..{MAX_TOP_K}, got {p['top_k']}")
        if not 0 <= p["two_hop_fraction"] <= 1:
            raise ValueError("two_hop_fraction must be in [0, 1]")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        self.world: World = make_world(p["num_lands"], p["num_people"], corpus_seed)
        self.index = make_index(self.world.docs, retriever)
        self._lands = {x.name: x for x in self.world.lands}
        self._demo_docs: dict[str, str] = {}  # query -> tool text; demo queries are finitely many
        self.top_k: int = p["top_k"]
        self.two_hop_fraction: float = p["two_hop_fraction"]
        self.test_fraction = test_fraction
        hops = 2 if self.two_hop_fraction > 0 else 1
        self.max_turns = hops + 2  # the searches, the answer, one spare search
        # one search, a second one for a two-hop question; ~31 characters per document found
        self.expected_tool_calls = 1.0 + self.two_hop_fraction
        self.expected_tool_result_tokens = 31 * self.top_k
        # a search turn is ~40 chars + ~31 per document; 40 chars of slack for the answer
        self.max_response_chars = hops * (44 + 32 * self.top_k) + 40

    # ------------------------------------------------------------------ data

    def make_dataset(self, n: int, seed: int, split: str = "train") -> list[Example]:
        """``n`` questions about this task's world, deterministic per ``(seed, split)``."""
        return sample_examples(self.name, self._make_one, n, seed, split, self.test_fraction)

    def _make_one(self, rng: random.Random) -> Example:
        lands = self._lands
        if rng.random() < self.two_hop_fraction:
            person = rng.choice(self.world.people)
            field = rng.choice(("capital", "fruit"))
            answer = getattr(lands[person.home], field)
            question = f"{field} of home of {person.name}"
            queries = [f"{person.name} home", f"{person.home} {field}"]
        elif rng.random() < 0.5:
            land = rng.choice(self.world.lands)
            field = rng.choice(("capital", "fruit"))
            answer, question = getattr(land, field), f"{field} of {land.name}"
            queries = [f"{land.name} {field}"]
        else:
            person = rng.choice(self.world.people)
            field = rng.choice(("home", "job"))
            answer, question = getattr(person, field), f"{field} of {person.name}"
            queries = [f"{person.name} {field}"]
        for q in queries:
            if q not in self._demo_docs:
                self._demo_docs[q] = self._retrieve(q)
        demo = "".join(f"{CALL_OPEN}{q}{CALL_CLOSE}{self._demo_docs[q]}" for q in queries)
        return Example(f"Q: {question}?\n", answer, self.name,
                       {"hops": len(queries), "queries": queries}, f"{demo}{ANSWER} {answer}")

    def _retrieve(self, query: str) -> str:
        hits = self.index.top(query, self.top_k)
        body = DOC_SEP.join(self.index.docs[i] for i in hits) if hits else "none"
        return f"{DOC_OPEN}{body}{DOC_CLOSE}"

    # ------------------------------------------------------------------ tool and reward

    @tool_guard
    def call_tool(self, call_text: str, state: dict) -> ToolResult:
        """Search the corpus with the last ``<search>...</search>`` of ``call_text``; never raises.

        ``state`` (one dict per trajectory) counts ``calls`` and ``errors``.
        """
        state["calls"] = state.get("calls", 0) + 1
        query = last_tagged(call_text, CALL_OPEN, CALL_CLOSE, MAX_QUERY_CHARS)
        terms = tokenize(query) if query is not None else []
        if not 1 <= len(terms) <= MAX_QUERY_TERMS:
            state["errors"] = state.get("errors", 0) + 1
            return self.error(call_text, "no complete <search>query</search> within bounds")
        return ToolResult(self._retrieve(query), ok=True, latency_s=self.latency_for(call_text))

    def compute_score(self, data_source: str, solution_str: str, ground_truth: str,
                      extra_info: dict | None = None) -> dict:
        """1.0 for an exact-match answer, ``format_score`` for a wrong one, 0.0 for none.
        Returns ``{"score", "acc", "reason", "calls"}``."""
        calls = float(solution_str.count(CALL_CLOSE))
        answer = answer_of(solution_str)
        if not answer:
            score, reason = 0.0, "no 'A: <answer>' after the last tool result"
        elif answer != normalize(str(ground_truth)):
            score, reason = self.format_score, "wrong answer"
        else:
            score, reason = 1.0, "ok"
        return {"score": score, "acc": float(score == 1.0), "reason": reason, "calls": calls}
