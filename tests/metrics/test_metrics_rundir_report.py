"""Run folders (write / load / errors) and the rich tables built from summaries."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from jigsawrl.errors import InputError, JigsawError
from jigsawrl.metrics import (
    compare_table,
    load_run,
    load_summary,
    run_info_of,
    summarize,
    summary_table,
    write_run,
)


def _render(table) -> str:
    console = Console(record=True, width=220, force_terminal=False)
    console.print(table)
    return console.export_text()


def test_write_then_load_round_trip(tmp_path, events, info):
    summary = summarize(events, info)
    run = tmp_path / "runs" / "r1"
    write_run(run, events=events, summary=summary, info=info, config_yaml="seed: 7\n")
    for name in ("config.yaml", "events.jsonl", "trace.json", "summary.json", "timeline.png"):
        assert (run / name).stat().st_size > 0, name
    loaded_summary, loaded_events = load_run(run)
    assert loaded_summary == json.loads(json.dumps(summary))
    assert loaded_events == events
    assert run_info_of(loaded_summary) == info
    assert (run / "config.yaml").read_text() == "seed: 7\n"


def test_write_run_without_timeline(tmp_path, events, info):
    write_run(
        tmp_path,
        events=events,
        summary=summarize(events, info),
        info=info,
        config_yaml="",
        timeline=False,
    )
    assert not (tmp_path / "timeline.png").exists()
    assert load_summary(tmp_path)["name"] == "hand"


def test_load_missing_folder(tmp_path):
    with pytest.raises(InputError) as err:
        load_run(tmp_path / "nope")
    assert err.value.where == str(tmp_path / "nope") and err.value.fix


def test_load_folder_without_summary(tmp_path):
    with pytest.raises(InputError, match="did not finish"):
        load_run(tmp_path)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"name": "x"}'])
def test_load_corrupt_summary(tmp_path, text):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(InputError) as err:
        load_run(tmp_path)
    assert err.value.where == str(tmp_path / "summary.json") and err.value.fix


def test_load_corrupt_events_line(tmp_path, events, info):
    write_run(
        tmp_path,
        events=events,
        summary=summarize(events, info),
        info=info,
        config_yaml="",
        timeline=False,
    )
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    lines[2] = '{"type": "span", "pipeline": "A"}'
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        load_run(tmp_path)
    assert err.value.where == f"{tmp_path / 'events.jsonl'}:3"
    (tmp_path / "events.jsonl").unlink()
    with pytest.raises(InputError, match="events file not found"):
        load_run(tmp_path)


def test_summary_table_renders(events, info):
    text = _render(summary_table(summarize(events, info)))
    for needle in ("hand", "jigsaw", "A", "B", "total", "out of memory", "MFU 30.0%", "busy 75.0%"):
        assert needle in text, needle


def test_compare_table_ratios_and_nulls(events, info):
    fast = summarize(events, info)
    slow = dict(fast, throughput_tokens_per_s=25.0, mfu=None)
    text = _render(compare_table({"verl": slow, "jigsaw": fast}, baseline="verl"))
    assert "verl" in text and "jigsaw" in text
    assert "2.00×" in text and "1.00×" in text and "–" in text
    assert "2.00×" in _render(compare_table({"verl": slow, "jigsaw": fast}))  # first is baseline
    with pytest.raises(JigsawError, match="baseline"):
        compare_table({"verl": slow}, baseline="streamrl")


def test_compare_table_marks_a_missed_latency_bound(events, info):
    """A policy whose run put a pipeline above its ``max_latency_ratio`` gets a "!" on its
    latency column and the pipeline named in the caption."""
    ok = dict(summarize(events, info), mean_latency_vs_solo=1.1, latency_bounds_missed=[])
    over = dict(ok, mean_latency_vs_solo=2.5, latency_bounds_missed=["A"])
    text = _render(compare_table({"jigsaw": ok, "muxserve": over}))
    assert "2.50×!" in text and "1.10×!" not in text
    assert "above its max_latency_ratio" in text and "muxserve: A" in text
