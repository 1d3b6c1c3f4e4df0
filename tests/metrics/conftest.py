"""Shared hand-built runs for the metrics tests (known answers worked out in the docstrings)."""

from __future__ import annotations

import pytest

from jigsawrl.events import Event, PipelineFailed, SampleFinished, Span, StepFinished
from jigsawrl.metrics import RunInfo


@pytest.fixture
def info() -> RunInfo:
    """Two devices at 1 TFLOP/s peak, $3.60 per device-hour (= $0.001 per device-second); a
    makespan floor of 5 s and a bound of 6 s."""
    return RunInfo(
        name="hand",
        policy="jigsaw",
        seed=7,
        num_devices=2,
        accelerator="toy",
        peak_flops_per_device=1e12,
        price_per_device_hour_usd=3.6,
        pipelines=("A", "B"),
        solo_step_latency_s={"A": 4.0},
        lower_bound_s=5.0,
        bound_s=6.0,
    )


@pytest.fixture
def events() -> list[Event]:
    """Two pipelines on two devices over [0, 10] s.

    dev0: A prefill [0,2] share 1; A decode_large and B decode_small both [2,6] share 0.5;
          B actor_update [6,10] on devices (0, 1)  -> busy 10 s, share-seconds 10.
    dev1: A tool_wait [0,4] (not busy); A reward [5,7] share 0.25; B actor_update [6,10]
          -> busy = union [5,10] = 5 s; share-seconds 0.25 + 1 (capped) + 3 = 4.25.
    FLOPs 1 + 0.5 + 0.5 + 4 = 6 TFLOP. Tokens: A 2 samples x 100, B 1 sample x 300.
    """
    return [
        Span("A", 0, "prefill", 0, (0,), 0.0, 2.0, 1.0, 1e12, 100),
        Span("A", 0, "decode_large", 0, (0,), 2.0, 6.0, 0.5, 0.5e12, 50),
        Span("B", 0, "decode_small", 0, (0,), 2.0, 6.0, 0.5, 0.5e12, 50),
        Span("A", 0, "tool_wait", 1, (1,), 0.0, 4.0, 1.0),
        Span("A", 0, "reward", 0, (1,), 5.0, 7.0, 0.25),
        Span("B", 0, "actor_update", 0, (0, 1), 6.0, 10.0, 1.0, 4e12, 300),
        SampleFinished("A", 0, "A/0/0", 6.0, 10, 90),
        SampleFinished("A", 0, "A/0/1", 6.0, 20, 80),
        SampleFinished("B", 0, "B/0/0", 6.0, 100, 200),
        StepFinished("A", 0, 0.0, 8.0),
        StepFinished("B", 0, 0.0, 10.0, {"gen": 4.0}),
        PipelineFailed("B", 1, 9.0, "out of memory"),
    ]
