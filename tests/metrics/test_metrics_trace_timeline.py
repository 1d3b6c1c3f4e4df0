"""Chrome trace structure, and the timeline PNG (including its speed on many spans)."""

from __future__ import annotations

import json
import random
import time

from jigsawrl.events import Span, StepFinished
from jigsawrl.metrics import RunInfo, plot_timeline, write_trace
from jigsawrl.metrics.timeline import _stack
from jigsawrl.stages import ALL_SPAN_STAGES as ALL_STAGES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_trace_structure(tmp_path, events, info):
    path = tmp_path / "trace.json"
    write_trace(path, events, info)
    data = json.loads(path.read_text())
    evs = data["traceEvents"]
    for e in evs:
        assert {"ph", "pid", "name"} <= e.keys()
        if e["ph"] != "M":
            assert "ts" in e
    spans = [e for e in evs if e["ph"] == "X" and e.get("cat") != "step"]
    # one complete event per (span, device): 5 one-device spans + one two-device span
    assert len(spans) == 7
    for e in spans:
        assert {"ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert e["pid"] in (0, 1)
        assert {"pipeline", "step", "rank", "share"} <= e["args"].keys()
    update = [e for e in spans if e["name"] == "actor_update"]
    assert sorted(e["pid"] for e in update) == [0, 1]
    assert update[0]["ts"] == 6e6 and update[0]["dur"] == 4e6  # microseconds
    names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    assert "device 0 (toy)" in names and "pipelines" in names
    instants = [e for e in evs if e["ph"] == "i"]
    assert {e["name"] for e in instants} >= {"step 0 done", "failed: out of memory"}
    assert any(e["ph"] == "C" for e in evs)  # finished-token counters


def test_trace_separates_overlapping_spans_of_one_pipeline(tmp_path, info):
    evs = [
        Span("A", 1, "decode_small", 0, (0,), 0.0, 5.0, 0.5),
        Span("A", 0, "actor_update", 0, (0,), 1.0, 3.0, 0.5),  # async: overlaps its own rollout
        Span("A", 1, "decode_small", 0, (0,), 5.0, 6.0, 0.5),
    ]
    path = tmp_path / "t.json"
    write_trace(path, evs, info)
    xs = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    tids = {(e["name"], e["ts"]): e["tid"] for e in xs}
    assert tids[("decode_small", 0.0)] != tids[("actor_update", 1e6)]
    assert tids[("decode_small", 0.0)] == tids[("decode_small", 5e6)]


def test_stack_places_colocated_spans_side_by_side():
    # two half-share spans at once stack; a later one reuses the freed bottom
    offs = _stack([0.0, 0.0, 2.0], [2.0, 4.0, 3.0], [0.5, 0.5, 0.5])
    assert sorted(offs[:2]) == [0.0, 0.5]
    assert offs[2] == offs[0]


def test_timeline_png_small_run(tmp_path, events, info):
    path = tmp_path / "timeline.png"
    plot_timeline(path, events, info)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_timeline_and_trace_of_empty_run(tmp_path, info):
    plot_timeline(tmp_path / "t.png", [], info)
    write_trace(tmp_path / "t.json", [], info)
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_timeline_limits_span_count(tmp_path, events, info):
    path = tmp_path / "timeline.png"
    plot_timeline(path, events, info, max_spans=2)
    assert path.stat().st_size > 0


def test_timeline_20k_spans_is_fast(tmp_path):
    rng = random.Random(0)
    info = RunInfo("big", "jigsaw", 0, 8, "toy", 1e12, 1.0, ("a", "b", "c"))
    evs: list = []
    for i in range(20_000):
        start, dev = rng.uniform(0, 1000), rng.randrange(8)
        devs = (dev,) if rng.random() < 0.8 else (dev, (dev + 1) % 8)
        evs.append(
            Span(
                rng.choice("abc"),
                i // 1000,
                rng.choice(ALL_STAGES),
                0,
                devs,
                start,
                start + rng.uniform(0.01, 5.0),
                rng.choice([0.25, 0.5, 1.0]),
            )
        )
    evs += [StepFinished(p, k, 50.0 * k, 50.0 * k + 45) for p in "abc" for k in range(20)]
    path = tmp_path / "timeline.png"
    t = time.perf_counter()
    plot_timeline(path, evs, info)
    elapsed = time.perf_counter() - t
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
    assert elapsed < 60.0, elapsed  # a guard against pathological plotting, not a speed test
