"""``jigsaw``: the JigsawRL scheduler — sub-stage multiplexing, dynamic shares, tail migration,
look-ahead, history-based prediction — and ``greedy`` (the same with look-ahead depth 0).

How it decides (every decision point; DESIGN.md §2):

1. **Shared pool.** Every pipeline's train state and reference are resident on every device
   (FSDP over the pool), so any pipeline's sub-stage can run on any device. Each rollout engine
   gets an equal slice of the memory left (the prototype gave each engine ~20% of the device).
2. **Multiplexing.** A device hosts up to ``max_colocated`` rollout engines of different
   pipelines plus at most one compute-bound stage (log-prob / update): memory-bound decodes pair
   with each other and with compute-bound training. A rollout takes the width the planner
   gives it (widths by critical path, training pooled: :mod:`.planner`), on the least-loaded
   devices. ``max_train_states`` (default 1: the prototype's memory plan) train states may be
   onloaded at once, the slot going to the most urgent pipeline; with more than one, compute
   stages of different pipelines run side by side on disjoint devices, each leaving devices
   for the pipelines not computing (worth it where a stage gains little from more devices, as
   on the CPU Ray executor, which runs a stage in one worker process; the GPU simulation is
   slower with it, ``bench paper --quick``). Where a verl placement is predicted no worse
   (memory-tight groups, one pipeline alone), that placement runs instead (:mod:`.fallback`).
   **Rollout TP** (``tp_search``, :mod:`.tp_search`): at the first decision the configured
   rollout TPs and their scales (×2, ×4, ×½) are each planned so, and the run keeps the ones
   predicted soonest (where the executor forms TP groups of any width).
   **Co-located rollouts** (``colocate``): at the same decision each TP candidate is planned
   again with two rollout engines per device (each rollout's rate beside another's replayed on
   the simulator's rollout runtime, :mod:`.corun`), and two engines run where that is
   forecast 1% sooner than the best with one, or no more than 1% later with the pipelines'
   finishes summed 10% sooner — on a sync group without latency bounds (the paper's AIME-tool
   and GSM8K twins: +11% / +7% tokens/s, its Search-R1 twins +2-5%; its GSM8K + MATH and
   hetero pairs: ±0.7% tokens/s at shorter steps; simulated).
3. **Dynamic allocation.** The split of a device's compute between co-located sub-stages is chosen
   from the belief slowdown table over the discrete share levels, maximising the weighted progress
   rate ``Σ w / slowdown(stage, share)`` (``dynamic_shares=False``: an equal split).
4. **Long-tail migration.** When a rollout's unfinished requests shrink to a tail
   (≤ ``tail_requests``) spread over more ranks than needed, they are moved onto
   ``ceil(U / tail_batch)`` ranks (abort + re-prefill at the destination); ranks that drained are
   released at once. Freed devices run other pipelines' work: a compute-bound stage then runs on
   the free devices at full share when that beats sharing every device with the tail.
   **Faster tails** (``tail_tp``, :mod:`.regroup`): while no stage waits for devices, a small
   tail is instead re-formed on one TP group spanning its ranks' devices (drained ranks are held
   for it meanwhile) when the belief cost model says the tail ends sooner after the re-prefill
   and the new engine's wake-up; the width planner's forecast replays it. It also acts on the
   rollouts of a verl placement jigsaw falls back to (a verl slice keeps all its ranks, and no
   one else waits for them). Only where the executor can (``View.can_regroup``: the simulator
   on GPU-style pools; a Ray executor built with ``regroup=True``, off by default on CPU
   workers, docs/RAY.md).
   **In-tail log-probs** (``tail_logprobs``, off by default): a sync rollout's finished groups
   get their old/reference log-probs on its drained devices that nothing else uses, while the
   tail still runs (``sim/stream.py``'s tail mode; ``engine/tail_logprobs.py`` computes them
   exactly on the engine); the post-rollout passes then cover only the rest. Jigsaw's own plan
   only (not a verl placement it falls back to); the Ray executor runs them too
   (``executors/raycluster/tail.py``: calls on the drained ranks' idle workers). Measured worth it where ranks drain and idle (at the configured TPs), not
   where the TP search or migration already fills those devices (docs/BENCHMARKS.md).
   **Spreads** (``spread``, :mod:`.spread`): a running rollout grows new ranks on whole TP
   groups that nothing else wants (every ready stage started) when the belief cost model says
   it then ends sooner after the re-prefill of the requests it moves and the new engines'
   wake-up — the rollout that started narrow beside other work and runs on after that work
   finished (a rollout's width was fixed at its start before). Only where the executor can
   (``View.can_spread``: the simulator and the Ray executor both do).
5. **Look-ahead.** Candidate actions — start a ready compute stage now (paired at the chosen
   split), defer it, or start another pipeline's stage first — are scored by forecasting the next
   ``depth`` events with the belief cost model (:mod:`.forecast`); ``depth=0`` is ``greedy``.
6. **Prediction.** Each pipeline's next rollout is predicted from its last few steps'
   observed lengths (:class:`~jigsawrl.graph.predict.HistoryPredictor`); the scheduler never
   sees sampled lengths.
7. **Fairness.** Pipelines carry ``latency_weight``; a pipeline whose current step runs later than
   its predicted solo time (or nears ``max_latency_ratio``) gains urgency, so none starves.
   A pipeline's ``max_latency_ratio`` also ranks every plan (rollout TPs, widths, the verl
   fallback) by how far its predicted step latencies exceed the bounds, before the makespan
   (:mod:`.latency`).

Simplifications (said here, as DESIGN.md asks): a training stage moved to a subset of devices
re-gathers its shards over NVLink at no modelled cost; reward (rule-based, on the CPU) and weight
sync (a transfer) hold no compute share.

Layout (one seam per module; :class:`JigsawPolicy` only orchestrates them, and a decision runs
through them in this order, predictions being asked for throughout):

- :mod:`.params` — :class:`JigsawParams`, the validated ``scheduler.params``;
- :mod:`.tp_search` — the rollout TPs, searched by prediction at the first decision;
- :mod:`.fallback` — the verl placements run instead when predicted no worse (no losses);
- :mod:`.latency` — the pipelines' latency bounds as the plans are scored against them;
- :mod:`.planner`, :mod:`.widths`, :mod:`.plan_forecast` — rollout widths by critical path;
- :mod:`.residency` — the memory plan (engine KV slices) and the train states' onload/offload;
- :mod:`.board` — the decision's board: who holds which device, at what share, memory free;
- :mod:`.tail` — long-tail migration (4), and :mod:`.regroup`, the tail's wider TP group;
- :mod:`.spread` — a running rollout growing onto idle devices (4);
- :mod:`.placement` — rollout widths and devices, the devices of a compute stage (1, 2);
- :mod:`.lookahead` and :mod:`.forecast` — scoring the candidate compute starts (5);
- :mod:`.shares` — the compute split of every device and the share actions (3);
- :mod:`.prediction` — predicted step times from history, and urgency (6, 7);
- :mod:`.policy` — the policy itself, and ``greedy``.
"""

from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.policy import JigsawPolicy

__all__ = ["JigsawParams", "JigsawPolicy"]
