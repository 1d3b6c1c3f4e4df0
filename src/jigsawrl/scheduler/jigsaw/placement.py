"""Where the ``jigsaw`` policy starts work: rollout widths and devices, and the devices of a model
pass (DESIGN.md §2.7).

- A rollout takes the least-loaded TP groups (within one node) that have a free engine slot and
  its memory, as many as the planner's width for it (:mod:`.planner`: widths by critical path,
  training pooled). It waits for its whole width while a model pass holds devices (the pass
  ends in seconds, a narrow rollout runs narrow to its end); otherwise it does not start on
  less than ``min_rollout_fraction`` of its width. A second rollout of an async pipeline (its
  next step, within the staleness bound) takes free devices the same way: async rollouts fill
  the pool where the plan leaves room (reserving the others' planned widths for them was
  measured slower on ``configs/two-async.yaml``, 725-761 s against 646 s at depth 0), after
  the other pipelines' current rollouts of the same decision (the policy's order).
- A model pass runs on all devices (sharing them with decodes at the chosen split) or only on the
  free ones at full share, whichever the belief cost model says is faster and memory allows.
  With one train state at a time, one pass runs in the pool at a time; with more, each pass
  leaves devices for the pipelines not computing and stays where its state went last time.

Simplification (said here, as DESIGN.md asks): a pass moved to a subset of devices re-gathers its
shards over NVLink at no modelled cost; only the extra bytes of its larger shards are reserved.
"""

from __future__ import annotations

from jigsawrl.scheduler.base import PipelineView, StartRollout, StartStage, View, task_id
from jigsawrl.scheduler.jigsaw.board import COMPUTE, MEM_HEADROOM, Board
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.jigsaw.planner import WidthPlanner
from jigsawrl.scheduler.jigsaw.prediction import StepPredictions
from jigsawrl.scheduler.jigsaw.residency import Residency
from jigsawrl.scheduler.jigsaw.shares import compute_split
from jigsawrl.scheduler.verl import MICRO_BATCH_TOKENS
from jigsawrl.sim.residency import serial_devices
from jigsawrl.stages import MODEL_PASSES, Stage


class Placement:
    """Chooses devices for rollouts and model passes, and claims them on the board."""

    def __init__(self, params: JigsawParams, residency: Residency,
                 predictions: StepPredictions, planner: WidthPlanner) -> None:
        self.params = params
        self.residency = residency
        self.predictions = predictions
        self.planner = planner
        self._last_compute: dict[str, tuple[int, ...]] = {}  # pipeline -> devices last used

    # ------------------------------------------------------------------ rollouts
    def rollout_start(self, view: View, b: Board, pv: PipelineView,
                      step: int) -> StartRollout | None:
        """Start ``pv``'s rollout of ``step`` on the least-loaded free TP groups, up to its
        planned width (module docstring); None when it should wait."""
        tp = pv.spec.rollout_tp
        kv_mem = self.residency.kv_mem
        need = kv_mem + view.cost.rollout_weight_bytes(pv.model, tp)
        width = self.planner.width(view, pv)
        if width is None:
            return None  # its replan runs in the background first
        groups = self._free_groups(view, b, tp, need)
        want = max(1, width // tp)
        wait_pass = b.any_compute() and not self.residency.tight
        if not groups or len(groups) < want and (
                wait_pass or len(groups) < self.params.min_rollout_fraction * want):
            return None
        if serial_devices(view.cost):
            # one call at a time per device: a rank waits for the pass on its devices to end
            busy = self._pass_left(view, b)
            groups.sort(key=lambda g: (max(busy[d] for d in g), max(b.mem_slots(d) for d in g),
                                       g))
        else:
            groups.sort(key=lambda g: (max(b.mem_slots(d) for d in g), g))
        devs = sorted(d for g in groups[:want] for d in g)
        self.predictions.ensure(view, pv, step)
        self.planner.started(view, pv, step, len(devs))
        b.claim_rollout(task_id(pv.name, step, Stage.ROLLOUT), pv.name, devs, tp, need)
        return StartRollout(pv.name, step, tuple(devs), tp, share=1.0, kv_mem_bytes=kv_mem,
                            tail_logprobs=self.params.tail_logprobs and pv.spec.mode == "sync")

    def _pass_left(self, view: View, b: Board) -> list[float]:
        """Per device, the predicted seconds until the model passes on it end (0: none).

        Where a device runs one call at a time (the Ray executor's CPU workers: the belief's
        ``serial_slice_s`` > 0), a rollout placed beside a pass decodes only once the pass ends,
        so its ranks go where passes end soonest; on the demo's replay a countdown rollout put
        beside search's 4.4 s update instead of calculator's 1.4 s one waited the 4.4 s
        (docs/BENCHMARKS.md, "Shared prompts, consistent urgencies, serial placement")."""
        left = [0.0] * len(view.devices)
        for pv in view.pipelines:
            for t in pv.running:
                if b.kind.get(t.task_id) != COMPUTE:
                    continue
                pred = self.predictions.get(pv.name, t.step)
                dur = pred.stages_s.get(t.stage, 0.0) if pred is not None else 0.0
                rest = max(0.0, dur - (view.now_s - t.start_s))
                for d in t.devices:
                    left[d] = max(left[d], rest)
        return left

    def _free_groups(self, view: View, b: Board, tp: int, need: float) -> list[tuple[int, ...]]:
        """TP groups within one node whose devices have an engine slot and ``need`` bytes."""
        per_node = view.accelerators_per_node
        groups = []
        for g in range(0, len(view.devices) - tp + 1, tp):
            group = tuple(range(g, g + tp))
            if g // per_node != (g + tp - 1) // per_node:
                continue
            if all(b.mem_slots(d) < self.params.max_colocated and b.mem_free[d] >= need
                   for d in group):
                groups.append(group)
        return groups

    # ------------------------------------------------------------------ model passes
    def compute_devices(self, view: View, b: Board, pv: PipelineView) -> tuple[int, ...]:
        """All devices (shared with decodes) or only the free ones at full share: the faster;
        ``()`` when the pass cannot start now."""
        n = len(view.devices)
        pool = self._compute_pool(view, b, pv)
        if not pool:
            return ()
        free = tuple(d for d in pool if b.count(d) == 0)
        mem_sub = view.cost.train_state_bytes(pv.model, max(1, len(free))) - \
            view.cost.train_state_bytes(pv.model, n) + \
            view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, max(1, len(free)))
        free_ok = free and all(b.mem_free[d] >= mem_sub + MEM_HEADROOM for d in free)
        share = self._share_beside(view, b, pv)
        rate_shared = 1.0 / view.cost.slowdown(Stage.ACTOR_UPDATE, share, model=pv.model)
        k = len(pool)
        act = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, k) + (
            view.cost.train_state_bytes(pv.model, k) - view.cost.train_state_bytes(pv.model, n))
        shared_ok = all(b.mem_free[d] >= act for d in pool)
        if free_ok and (len(free) / len(pool) >= rate_shared or not shared_ok):
            return free
        return pool if shared_ok else ()

    def _compute_pool(self, view: View, b: Board, pv: PipelineView) -> tuple[int, ...]:
        """The devices a pass of ``pv`` may use: those no other pass holds, all of them with one
        train state at a time, else a fair part of them."""
        n = len(view.devices)
        most = self.params.max_train_states
        if most == 1 and b.any_compute():
            return ()  # one compute stage in the pool at a time (one train state resident)
        pool = tuple(d for d in range(n) if not b.has_compute(d))
        if len(pool) < n and most == 1:
            return ()  # one compute stage in the pool at a time (one train state resident)
        if not pool or most == 1:
            return pool
        # leave devices for the other pipelines' compute stages
        others = sum(1 for p in view.pipelines if not p.finished and p.name != pv.name
                     and not any(t.stage in MODEL_PASSES for t in p.running))
        k = max(1, len(pool) // (1 + min(others, most - 1)))
        last = self._last_compute.get(pv.name, ())  # stay where its state went last time
        return tuple(sorted(sorted(pool, key=lambda d: (b.count(d), d not in last, d))[:k]))

    def _share_beside(self, view: View, b: Board, pv: PipelineView) -> float:
        """The compute share ``pv``'s pass would get beside the busiest device's decodes."""
        mems = b.max_mem_slots()
        if mems == 0:
            return 1.0
        return compute_split(view, pv, mems, self.params.dynamic_shares)[0]

    def start_compute(self, view: View, b: Board, pv: PipelineView, step: int, stage: str,
                      devs: tuple[int, ...]) -> StartStage:
        """Start a pass on ``devs`` (its share is set with the others'): its activations and the
        larger shard of its train state on fewer devices are reserved."""
        self._last_compute[pv.name] = devs
        b.claim_compute(task_id(pv.name, step, stage), pv.name, stage, devs)
        mem = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(devs)) + (
            view.cost.train_state_bytes(pv.model, len(devs)) -
            view.cost.train_state_bytes(pv.model, len(view.devices)))
        return StartStage(pv.name, step, stage, devs, share=1.0, mem_bytes=mem)
