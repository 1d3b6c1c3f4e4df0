"""The one stage vocabulary (``jigsawrl.stages``): names are written once, and stay strings on disk.

- No module but ``stages.py`` spells a stage name as a string literal (they use ``Stage.X`` and the
  sets), except the few places listed in :data:`NOT_STAGES`, where the same word means something
  else (a metric key of another library, a config section).
- A ``Stage`` is the plain string in JSON, so events, summaries and traces read as before.
"""

from __future__ import annotations

import ast
import json
from dataclasses import asdict
from pathlib import Path

from jigsawrl.events import Span
from jigsawrl.stages import (
    ALL_SPAN_STAGES,
    DEVICE_STAGES,
    HOST_STAGES,
    MODEL_PASSES,
    POST_ROLLOUT,
    ROLLOUT_BANDS,
    Stage,
    decode_band,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "jigsawrl"
NAMES = {s.value for s in Stage}
# (module path under src/jigsawrl, literal): the word is not a stage name there.
NOT_STAGES: dict[tuple[str, str], str] = {
    ("bench/trl.py", "reward"): "TRL's log-history key",
    ("engine/pipeline.py", "reward"): "verl's timing key timing_s/reward (stages.VERL_TIMING)",
}


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_stage_names_are_spelled_only_in_stages_py() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "stages.py":
            continue
        for line, value in _string_literals(path):
            if value in NAMES and (rel, value) not in NOT_STAGES:
                bad.append(f"{rel}:{line}: {value!r}")
    assert not bad, "use jigsawrl.stages.Stage instead of these strings:\n  " + "\n  ".join(bad)


def test_a_stage_is_its_plain_string_on_disk() -> None:
    span = Span("p", 0, Stage.ACTOR_UPDATE, 0, (0,), 0.0, 1.0)
    assert json.loads(json.dumps(asdict(span)))["stage"] == "actor_update"
    assert {"actor_update": 1}[Stage.ACTOR_UPDATE] == 1
    assert f"{Stage.DECODE_SMALL}" == "decode_small"


def test_the_sets_partition_the_span_stages() -> None:
    assert set(ROLLOUT_BANDS) | set(POST_ROLLOUT) | {Stage.OFFLOAD, Stage.ONLOAD, Stage.MIGRATE} \
        == set(ALL_SPAN_STAGES)
    assert not set(ROLLOUT_BANDS) & set(POST_ROLLOUT)
    assert set(POST_ROLLOUT) >= MODEL_PASSES
    assert not MODEL_PASSES & HOST_STAGES
    assert Stage.TOOL_WAIT not in DEVICE_STAGES and len(DEVICE_STAGES) == len(ALL_SPAN_STAGES) - 1


def test_decode_bands_by_tokens_per_iteration() -> None:
    assert decode_band(2048) is Stage.DECODE_LARGE
    assert decode_band(1024) is Stage.DECODE_LARGE
    assert decode_band(1023) is Stage.DECODE_MEDIUM
    assert decode_band(128) is Stage.DECODE_MEDIUM
    assert decode_band(127) is Stage.DECODE_SMALL
    assert decode_band(0) is Stage.DECODE_SMALL
