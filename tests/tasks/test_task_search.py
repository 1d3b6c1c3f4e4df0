"""The synthetic world, the BM25 index and the search tool."""

from __future__ import annotations

import math

import pytest

from jigsawrl.tasks import get_task
from jigsawrl.tasks.corpus import BM25Index, make_world, tokenize


def test_bm25_matches_the_formula_by_hand() -> None:
    docs = ["a b c", "a a", "d"]
    index = BM25Index(docs, k1=1.2, b=0.75)
    avgdl = 2.0
    idf_a = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    s0 = idf_a * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 3 / avgdl))
    s1 = idf_a * 2 * 2.2 / (2 + 1.2 * (0.25 + 0.75 * 2 / avgdl))
    assert index.scores("a") == pytest.approx([s0, s1, 0.0])
    assert index.scores("a a A") == index.scores("a")  # distinct query terms, case-folded
    assert index.top("a", 5) == [1, 0] and index.top("zzz", 5) == []
    assert BM25Index(["x", "x"]).top("x", 2) == [0, 1]  # ties: lower id first


def test_bm25_agrees_with_rank_bm25_on_the_corpus() -> None:
    rank_bm25 = pytest.importorskip("rank_bm25")
    task = get_task("search", difficulty="hard")
    docs = task.world.docs
    ref = rank_bm25.BM25Okapi([tokenize(d) for d in docs])
    for ex in task.make_dataset(40, seed=0):
        for query in ex.extra_info["queries"]:
            theirs = ref.get_scores(tokenize(query))
            assert max(range(len(docs)), key=lambda i: theirs[i]) == task.index.top(query, 1)[0]


def test_world_is_deterministic_and_unambiguous() -> None:
    world = make_world(12, 24, seed=3)
    assert world == make_world(12, 24, seed=3) and world != make_world(12, 24, seed=4)
    names = [x.name for x in world.lands] + [x.capital for x in world.lands]
    names += [p.name for p in world.people]
    assert len(set(names)) == len(names) and all(len(n) == 4 for n in names)
    assert {p.home for p in world.people} <= {x.name for x in world.lands}
    assert all(25 <= len(d) <= 40 for d in world.docs)
    with pytest.raises(ValueError):
        make_world(0, 3, seed=0)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_demo_answer_is_in_the_retrieved_documents(top_k: int) -> None:
    task = get_task("search", difficulty="medium", top_k=top_k)
    for ex in task.make_dataset(60, seed=1):
        docs = ex.demo.split("<doc>")[-1].split("</doc>")[0].split("|")
        assert len(docs) == top_k
        assert f" {ex.ground_truth}" in docs[0]  # the right document is ranked first
        assert ex.demo.count("<search>") == ex.extra_info["hops"]
        assert len(ex.demo) <= task.max_response_chars


def test_two_hop_questions_exist_and_fit() -> None:
    task = get_task("search", difficulty="medium")
    data = task.make_dataset(100, seed=0)
    two = [e for e in data if e.extra_info["hops"] == 2]
    assert two and max(len(e.demo) for e in two) <= 160
    assert all("of home of" in e.prompt for e in two)


def test_search_tool_results() -> None:
    task = get_task("search", top_k=2)
    land = task.world.lands[0]
    result = task.call_tool(f"<search>{land.name} capital</search>", {})
    assert result.ok and result.text.startswith(f"<doc>{land.name}: capital {land.capital}")
    assert result.text.count("|") == 1
    assert task.call_tool("<search>qqqq</search>", {}).text == "<doc>none</doc>"
    bad = task.call_tool("<search> ,. </search>", {})
    assert bad.ok is False and bad.text == "<doc>error</doc>"
