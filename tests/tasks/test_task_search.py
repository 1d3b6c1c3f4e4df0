"""The synthetic world and the search tool (the retrieval indexes: test_corpus.py)."""

from __future__ import annotations

import pytest

from jigsawrl.tasks import get_task
from jigsawrl.tasks.corpus import make_world


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
