"""The search task's retrieval: BM25 from ``bm25s`` and the opt-in dense index (FAISS over
WordLlama), behind one interface, deterministic top-k on the synthetic world."""

from __future__ import annotations

import base64
import builtins
import hashlib
import importlib.metadata
import math
import socket
from pathlib import Path
from typing import Any

import pytest

from jigsawrl.errors import ConfigError
from jigsawrl.tasks import get_task
from jigsawrl.tasks.corpus import BM25Index, make_index, make_world

pytest.importorskip("bm25s")


def lucene(tf: int, dl: float, avgdl: float, df: int, n: int, k1: float = 1.2,
           b: float = 0.75) -> float:
    """One term's Lucene BM25 score, by hand (the module docstring's formula)."""
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * dl / avgdl))


def test_bm25_matches_the_lucene_formula_by_hand() -> None:
    index = BM25Index(["a b c", "a a", "d"], k1=1.2, b=0.75)
    assert index.scores("a") == pytest.approx(
        [lucene(1, 3, 2.0, 2, 3), lucene(2, 2, 2.0, 2, 3), 0.0], rel=1e-12)
    assert index.scores("a a A") == index.scores("a")  # distinct query terms, case-folded
    assert index.top("a", 5) == [1, 0] and index.top("zzz", 5) == []
    assert index.scores("") == [0.0, 0.0, 0.0]
    assert BM25Index(["x", "x"]).top("x", 2) == [0, 1]  # ties: lower id first
    with pytest.raises(ValueError):
        BM25Index([])


def test_bm25_top_k_on_the_synthetic_world_is_right_and_deterministic() -> None:
    """Every demo query's entity document ranks first; a new index ranks the same; the top-k
    are in score order, ties by id, and each shares a word with the query."""
    task = get_task("search", difficulty="hard")
    docs = task.world.docs
    again = BM25Index(list(docs))
    for ex in task.make_dataset(60, seed=0):
        for query in ex.extra_info["queries"]:
            entity, field = query.split()
            top = task.index.top(query, 5)
            assert docs[top[0]].startswith(f"{entity}:")
            assert top == again.top(query, 5)
            scores = task.index.scores(query)
            assert top == sorted(top, key=lambda i: (-scores[i], i))
            assert all({entity.lower(), field} & set(docs[i].lower().replace(",", " ")
                                                     .replace(":", " ").split()) for i in top)


def test_missing_bm25s_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_bm25s(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "bm25s":
            raise ImportError("No module named 'bm25s'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bm25s)
    with pytest.raises(ConfigError, match=r"bm25s.*\n.*\[engine\]"):
        get_task("search")


def test_unknown_retriever_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="retriever must be one of bm25, dense"):
        get_task("search", retriever="splade")


# ---------------------------------------------------------------------------- dense (opt-in)

@pytest.fixture(scope="module")
def offline() -> Any:
    """No network for the module's tests: the dense model must load from the wheel alone."""
    mp = pytest.MonkeyPatch()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OSError("network disabled in this test")

    mp.setattr(socket.socket, "connect", refuse)
    mp.setattr(socket, "create_connection", refuse)
    yield
    mp.undo()


def test_wordllama_weights_are_the_packaged_ones() -> None:
    """The weights file is the wheel's (its RECORD hash), one float16 256-d vector per token."""
    wordllama = pytest.importorskip("wordllama")
    from safetensors import safe_open

    path = Path(wordllama.__file__).parent / "weights" / "l2_supercat_256.safetensors"
    record = importlib.metadata.distribution("wordllama").read_text("RECORD") or ""
    line = next(x for x in record.splitlines() if x.startswith("wordllama/weights/l2_supercat"))
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=")
    assert line.split(",")[1] == f"sha256={digest.decode()}"
    with safe_open(str(path), "np") as f:
        weights = f.get_tensor("embedding.weight")
    assert weights.shape == (32000, 256) and weights.dtype.name == "float16"


def test_dense_top_k_offline_and_deterministic(offline: Any) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("wordllama")
    task = get_task("search", difficulty="hard", retriever="dense")
    docs = task.world.docs
    again = make_index(list(docs), "dense")
    hits = total = 0
    for ex in task.make_dataset(60, seed=0):
        for query in ex.extra_info["queries"]:
            top = task.index.top(query, 3)
            assert top == again.top(query, 3) and len(top) == 3
            hits += docs[top[0]].startswith(query.split()[0] + ":")
            total += 1
    assert hits / total >= 0.8  # ~0.9 measured: a static-embedding model, not BM25's 1.0
    assert task.index.scores("") == [0.0] * len(docs)


def test_dense_world_demo_uses_its_own_retrieval(offline: Any) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("wordllama")
    task = get_task("search", difficulty="easy", retriever="dense")
    ex = task.make_dataset(1, seed=0)[0]
    query = ex.extra_info["queries"][0]
    assert task.call_tool(f"<search>{query}</search>", {}).text in ex.demo
    assert make_world(8, 16, seed=0) == task.world
