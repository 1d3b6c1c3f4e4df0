"""Sample-level batches in the simulator: StreamRL's streaming into training, AReaL's first-B."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from test_streamrl import check_run, make_cfg, run  # noqa: E402

from jigsawrl.events import STREAMED_RANK, SampleFinished, Span, StepFinished  # noqa: E402
from jigsawrl.scheduler.areal import ArealPolicy  # noqa: E402
from jigsawrl.scheduler.base import PipelineView  # noqa: E402
from jigsawrl.scheduler.streamrl import StreamRLPolicy  # noqa: E402
from jigsawrl.sim.batching import Finished, FirstBatches, GroupTracker, group_key  # noqa: E402
from jigsawrl.stages import Stage  # noqa: E402
from jigsawrl.workload.requests import RequestTruth, TurnTruth  # noqa: E402


def req(sid: str, n: int = 10) -> RequestTruth:
    return RequestTruth(sid, 5, (TurnTruth(n),))


# ---------------------------------------------------------------------------- units

def test_a_group_completes_with_its_last_response() -> None:
    reqs = [req(f"p/0/{p}/{g}") for p in range(2) for g in range(3)]
    tr = GroupTracker(reqs)
    assert group_key("p/0/1/2") == "p/0/1"
    assert tr.add(Finished(reqs[0], 1.0, 0)) is None
    assert tr.add(Finished(reqs[3], 1.0, 0)) is None
    assert tr.add(Finished(reqs[1], 2.0, 0)) is None
    group = tr.add(Finished(reqs[2], 3.0, 0))
    assert group is not None and {f.truth.sample_id for f in group} == {"p/0/0/0", "p/0/0/1",
                                                                       "p/0/0/2"}


def test_first_batches_take_groups_in_finish_order_across_steps() -> None:
    fb = FirstBatches(batch_size=2)
    reqs = {s: [req(f"p/{s}/{p}/0") for p in range(2)] for s in (0, 1)}
    fb.groups.expect(reqs[0] + reqs[1])
    fb.add(Finished(reqs[1][0], 1.0, 1))  # a step-1 prompt finishes first
    fb.add(Finished(reqs[0][1], 2.0, 0))
    assert fb.full()
    batch = fb.take()
    assert [f.truth.sample_id for f in batch] == ["p/0/1/0", "p/1/0/0"]
    assert not fb.full()


# ---------------------------------------------------------------------------- streaming

class NoStreaming(StreamRLPolicy):
    """StreamRL with training after the whole batch (the ablation of its streaming)."""

    def stream_devices(self, pv: PipelineView) -> tuple[int, ...]:
        return ()


def _spans(events: list) -> list[Span]:
    return [e for e in events if isinstance(e, Span)]


def test_streaming_moves_passes_into_the_rollout_and_shortens_steps() -> None:
    cfg = make_cfg("sync", tasks=("aime-tool", "gsm8k"), batch=8)
    streamed_ev = run(cfg, StreamRLPolicy("split", 0))
    plain_ev = run(cfg, NoStreaming("split", 0))
    spans = check_run(cfg, streamed_ev)
    check_run(cfg, plain_ev)
    streamed = [s for s in spans if s.rank == STREAMED_RANK]
    assert streamed and {s.stage for s in streamed} <= {Stage.OLD_LOGPROB, Stage.REF_LOGPROB,
                                                       Stage.ACTOR_UPDATE}
    assert not [s for s in _spans(plain_ev) if s.rank == STREAMED_RANK]
    # every sequence still goes through every pass once (streamed or after the rollout): the
    # tokens of a step's old log-prob spans cover its batch (an abandoned pass adds a little)
    batch_tokens = Counter()
    for e in streamed_ev:
        if isinstance(e, SampleFinished):
            batch_tokens[(e.pipeline, e.step)] += e.prompt_tokens + e.response_tokens
    lp = Counter()
    for s in spans:
        if s.stage == Stage.OLD_LOGPROB:
            lp[(s.pipeline, s.step)] += s.tokens
    assert all(lp[k] >= v - 1 for k, v in batch_tokens.items())
    # the final passes are shorter, so the steps end sooner
    def step_time(events: list) -> float:
        return sum(e.end_s - e.start_s for e in events if isinstance(e, StepFinished))

    assert step_time(streamed_ev) < step_time(plain_ev)


def test_streaming_yields_to_stages_on_its_devices() -> None:
    """A streamed pass never runs beside an explicit stage on the same device (async: the
    training of step k runs on the pool while step k+1's rollout streams into it)."""
    cfg = make_cfg("async", tasks=("aime-tool", "gsm8k"), batch=8)
    spans = check_run(cfg, run(cfg, StreamRLPolicy("split", 0)))
    work = defaultdict(list)
    for s in spans:
        if s.stage in (Stage.OLD_LOGPROB, Stage.REF_LOGPROB, Stage.ACTOR_UPDATE,
                       Stage.WEIGHT_SYNC) and s.rank != STREAMED_RANK:
            for d in s.devices:
                work[d].append(s)
    streamed = [s for s in spans if s.rank == STREAMED_RANK]
    assert streamed
    for s in streamed:
        for d in s.devices:
            assert not any(w.start_s < s.end_s - 1e-9 and s.start_s < w.end_s - 1e-9
                           for w in work[d]), (s, d)


# ---------------------------------------------------------------------------- first-B

def test_areal_trains_on_the_first_groups_to_finish() -> None:
    """Each step trains exactly one batch of whole groups; some groups of a step's rollout are
    trained in a later step (a long tail slips into the next batch), and no sample twice."""
    cfg = make_cfg("async", tasks=("aime-tool", "gsm8k"), batch=8)
    events = run(cfg, ArealPolicy("split", 0))
    check_run(cfg, events)  # every step B × G samples, each sample exactly once
    samples = [e for e in events if isinstance(e, SampleFinished)]
    per_step = Counter((e.pipeline, e.step) for e in samples)
    assert set(per_step.values()) == {8 * 4}
    groups = defaultdict(set)
    for e in samples:
        groups[(e.pipeline, e.step)].add(group_key(e.sample_id))
    assert all(len(g) == 8 for g in groups.values())  # whole groups only
    carried = [e for e in samples if int(e.sample_id.split("/")[1]) != e.step]
    assert carried  # batches mix steps' prompts (an older or a newer rollout's)


def test_sync_areal_keeps_whole_step_batches() -> None:
    cfg = make_cfg("sync", tasks=("aime-tool", "gsm8k"), batch=8)
    events = run(cfg, ArealPolicy("split", 0))
    check_run(cfg, events)
    assert all(int(e.sample_id.split("/")[1]) == e.step
               for e in events if isinstance(e, SampleFinished))
