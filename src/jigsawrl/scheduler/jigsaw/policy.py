"""``jigsaw``: the JigsawRL scheduler — sub-stage multiplexing, dynamic shares, tail migration,
look-ahead, history-based prediction — and ``greedy`` (the same with look-ahead depth 0).

How it decides (every decision point; DESIGN.md §2):

1. **Shared pool.** Every pipeline's train state and reference are resident on every device
   (FSDP over the pool), so any pipeline's sub-stage can run on any device. Each rollout engine
   gets an equal slice of the memory left (the prototype gave each engine ~20% of the device).
2. **Multiplexing.** A device hosts up to ``max_colocated`` rollout engines of different
   pipelines plus at most one compute-bound stage (log-prob / update): memory-bound decodes pair
   with each other and with compute-bound training. A rollout takes at most a fair share of the
   pool's engine slots, on the least-loaded devices. ``max_train_states`` (default 1: the
   prototype's memory plan) train states may be onloaded at once; with more than one, compute
   stages of different pipelines run side by side on disjoint devices, each leaving devices
   for the pipelines not computing (worth it where a stage gains little from more devices, as
   on the CPU Ray executor, which runs a stage in one worker process; the GPU simulation is
   slower with it, ``bench paper --quick``).
3. **Dynamic allocation.** The split of a device's compute between co-located sub-stages is chosen
   from the belief slowdown table over the discrete share levels, maximising the weighted progress
   rate ``Σ w / slowdown(stage, share)`` (``dynamic_shares=False``: an equal split).
4. **Long-tail migration.** When a rollout's unfinished requests shrink to a tail
   (≤ ``tail_requests``) spread over more ranks than needed, they are moved onto
   ``ceil(U / tail_batch)`` ranks (abort + re-prefill at the destination); ranks that drained are
   released at once. Freed devices run other pipelines' work: a compute-bound stage then runs on
   the free devices at full share when that beats sharing every device with the tail.
5. **Look-ahead.** Candidate actions — start a ready compute stage now (paired at the chosen
   split), defer it, or start another pipeline's stage first — are scored by forecasting the next
   ``depth`` events with the belief cost model (:mod:`.forecast`); ``depth=0`` is ``greedy``.
6. **Prediction.** Each pipeline's next rollout is predicted from its last few steps'
   observed lengths (:class:`~jigsawrl.graph.predict.HistoryPredictor`); the scheduler never
   sees sampled lengths.
7. **Fairness.** Pipelines carry ``latency_weight``; a pipeline whose current step runs later than
   its predicted solo time (or nears ``max_latency_ratio``) gains urgency, so none starves.

Simplifications (said here, as DESIGN.md asks): a training stage moved to a subset of devices
re-gathers its shards over NVLink at no modelled cost; reward (rule-based, on the CPU) and weight
sync (a transfer) hold no compute share.
"""

from __future__ import annotations

from jigsawrl.costmodel import SHARE_LEVELS
from jigsawrl.errors import ConfigError
from jigsawrl.graph.build import post_rollout_stages, rank_segments, split_ranks
from jigsawrl.graph.predict import HistoryPredictor
from jigsawrl.scheduler.base import (
    Action,
    Decision,
    PipelineView,
    PolicyBase,
    RunningTask,
    SetResident,
    SetShare,
    StartRollout,
    StartStage,
    View,
    register_policy,
    stage_sequence,
    task_id,
)
from jigsawrl.scheduler.forecast import FState, FWork, forecast
from jigsawrl.scheduler.jigsaw_parts import (
    MEM_HEADROOM,
    Board,
    Prediction,
    compute_split,
    level_floor,
    rollout_rate,
    slow_fn,
    with_share,
)
from jigsawrl.scheduler.jigsaw_tail import TailMigration
from jigsawrl.scheduler.verl import MICRO_BATCH_TOKENS, pipeline_resident_bytes
from jigsawrl.sim.rollout import RolloutInstance
from jigsawrl.stages import HOST_STAGES, MODEL_PASSES, Stage
from jigsawrl.workload.task_presets import TASKS


@register_policy("jigsaw")
class JigsawPolicy(TailMigration, PolicyBase):
    """JigsawRL: multiplexing, dynamic shares, tail migration, look-ahead (see module doc)."""

    wants_rank_progress = True

    def __init__(self, depth: int = 2, migration: bool = True, dynamic_shares: bool = True,
                 max_colocated: int = 1, tail_requests: int = 128, tail_batch: int = 64,
                 history_window: int = 3, min_rollout_fraction: float = 0.5,
                 max_train_states: int = 1, name: str = "jigsaw") -> None:
        if depth < 0 or max_colocated < 1 or tail_batch < 1 or max_train_states < 1:
            raise ConfigError("depth >= 0, max_colocated >= 1, tail_batch >= 1 and "
                              "max_train_states >= 1 are required", where="scheduler.params")
        self.max_train_states = max_train_states
        self.depth = depth
        self.migration = migration
        self.dynamic_shares = dynamic_shares
        self.max_colocated = max_colocated
        self.tail_requests = tail_requests
        self.tail_batch = tail_batch
        self.min_rollout_fraction = min_rollout_fraction
        self.name = name
        self._predictor = HistoryPredictor(history_window)
        self._pred: dict[tuple[str, int], Prediction] = {}
        self._kv_mem = 0.0
        self._placed = False
        self._resident: dict[str, float] = {}
        self._tight = False  # memory-tight plan: engines also use the activations' room
        self._state: dict[str, str] = {}  # pipeline -> host | loading | device | unloading
        self._last_compute: dict[str, tuple[int, ...]] = {}  # pipeline -> devices last used

    # ------------------------------------------------------------------ entry point
    def decide(self, view: View) -> Decision:
        actions: list[Action] = []
        if not self._placed:
            actions += self._place(view)
        board = self._board(view)
        actions += self._memory_moves(view, board)
        if self.migration:
            actions += self._migrate(view, board)
        starts = self._choose_starts(view, board)
        actions += self._share_actions(view, board, starts)
        return Decision(tuple(actions))

    # ------------------------------------------------------------------ placement
    def _place(self, view: View) -> list[Action]:
        """Size the engines' KV slices. Train states live in host memory and are onloaded only
        for a pipeline's training stages (the prototype's offload), so at most one pipeline's
        train state (plus its activations) is on the devices at a time."""
        n = len(view.devices)
        hbm = view.accelerator.hbm_bytes
        self._resident = {p.name: pipeline_resident_bytes(view.cost, p, n)
                          for p in view.pipelines}
        weights = max(view.cost.rollout_weight_bytes(p.model, p.spec.rollout_tp)
                      for p in view.pipelines)
        act = max(view.cost.activation_bytes(p.model, MICRO_BATCH_TOKENS, n)
                  for p in view.pipelines)
        longest = max(view.cost.kv_bytes(p.model, p.spec.max_response_tokens + 512,
                                         p.spec.rollout_tp) for p in view.pipelines)
        states = sorted(self._resident.values(), reverse=True)[:self.max_train_states]
        base = hbm - sum(states) - MEM_HEADROOM  # room for the train states onloaded at once
        self._kv_mem = (base - act) / self.max_colocated - weights
        if self._kv_mem < longest:
            # Memory-tight (large models): engines may use the activations' room too; a
            # training stage then starts only on devices whose engines have finished.
            self._kv_mem = base / self.max_colocated - weights
            self._tight = True
        if self._kv_mem < longest:
            raise ConfigError(
                f"jigsaw: one train state ({max(self._resident.values()) / 1e9:.0f} GB per "
                f"device on {n} devices) leaves too little memory for {self.max_colocated} "
                "co-located rollout engine(s)", where="scheduler.params",
                fix="use more devices, a smaller model, or a larger rollout_tp")
        self._placed = True
        return []

    def _memory_moves(self, view: View, b: Board) -> list[Action]:
        """Onload a pipeline's train state when its training stage is next (one at a time);
        offload it after its update. Memory is reserved from the onload's start and released
        when the offload has finished."""
        actions: list[Action] = []
        everything = tuple(range(len(view.devices)))
        for pv in view.pipelines:  # first settle finished moves, so onloads below see them
            state = self._state.get(pv.name, "host")
            moving = {t.stage for t in pv.running if t.stage in (Stage.ONLOAD, Stage.OFFLOAD)}
            if state == "loading" and Stage.ONLOAD not in moving:
                self._state[pv.name] = "device"
            if state == "unloading" and Stage.OFFLOAD not in moving:
                self._state[pv.name] = "host"
                actions.append(SetResident(pv.name, everything, 0.0))
                for d in everything:
                    b.mem_free[d] += self._resident[pv.name]
        for pv in view.pipelines:
            state = self._state.get(pv.name, "host")
            wants = any(stage in MODEL_PASSES for _, stage in pv.ready())
            keep = len(view.pipelines) <= self.max_train_states  # every state fits: stay
            if state == "device" and not wants and not keep and not any(
                    t.stage in MODEL_PASSES for t in pv.running):
                self._state[pv.name] = "unloading"
                actions.append(StartStage(pv.name, pv.steps_completed, Stage.OFFLOAD, everything,
                                          share=0.0))
            elif state == "host" and wants and not pv.finished and self._can_onload(view, b, pv):
                self._state[pv.name] = "loading"
                actions.append(SetResident(pv.name, everything, self._resident[pv.name]))
                actions.append(StartStage(pv.name, pv.steps_completed, Stage.ONLOAD, everything,
                                          share=0.0))
                for d in everything:
                    b.mem_free[d] -= self._resident[pv.name]
        return actions

    def _can_onload(self, view: View, b: Board, pv: PipelineView) -> bool:
        if sum(s != "host" for s in self._state.values()) >= self.max_train_states:
            return False  # max_train_states on the devices at a time (the memory plan above)
        n = len(view.devices)
        need = self._resident[pv.name] + view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS,
                                                                    n)
        return all(b.mem_free[d] >= need for d in range(n))

    # ------------------------------------------------------------------ board
    def _board(self, view: View) -> Board:
        b = Board([{} for _ in view.devices])
        b.mem_free = [d.mem_capacity_bytes - d.mem_used_bytes for d in view.devices]
        for pv in view.pipelines:
            for t in pv.running:
                self._add_running(b, t)
        return b

    def _add_running(self, b: Board, t: RunningTask) -> None:
        if t.stage in HOST_STAGES:
            return
        b.pipe[t.task_id], b.stage[t.task_id] = t.pipeline, t.stage
        if t.stage == Stage.ROLLOUT:
            b.kind[t.task_id] = "memory"
            live = [r for r, s in enumerate(t.rank_shares) if s > 0]
            b.ranks[t.task_id] = [t.rank_devices[r] for r in live]
            b.rank_idx[t.task_id] = live
            for r in live:
                for d in t.rank_devices[r]:
                    b.dev[d][t.task_id] = t.rank_shares[r]
        else:
            b.kind[t.task_id] = "compute"
            for d in t.devices:
                b.dev[d][t.task_id] = t.share

    # ------------------------------------------------------------------ starting work
    def _choose_starts(self, view: View, b: Board) -> list[Action]:
        ready = [(pv, step, stage) for pv in self._by_urgency(view) for step, stage in pv.ready()]
        starts: list[Action] = []
        for pv, step, stage in ready:
            if stage in HOST_STAGES:
                devs = () if stage == Stage.REWARD else tuple(range(len(view.devices)))
                starts.append(StartStage(pv.name, step, stage, devs, share=0.0))
            elif stage == Stage.ROLLOUT:
                start = self._rollout_start(view, b, pv, step)
                if start is not None:
                    starts.append(start)
        compute = [(pv, step, stage) for pv, step, stage in ready
                   if stage in MODEL_PASSES and self._state.get(pv.name) == "device"]
        choice = self._pick_compute(view, b, compute)
        if choice is not None:
            starts.append(choice)
        return starts

    def _rollout_start(self, view: View, b: Board, pv: PipelineView,
                       step: int) -> StartRollout | None:
        """Place a rollout on the least-loaded TP groups with a free engine slot and memory, at
        most a fair share of the pool's engine slots (``n × max_colocated / live pipelines``):
        a tail-bound rollout gains little from more devices, and the slots it leaves let the
        other pipelines' rollouts run beside it."""
        tp = pv.spec.rollout_tp
        need = self._kv_mem + view.cost.rollout_weight_bytes(pv.model, tp)
        per_node = view.accelerators_per_node
        groups = []
        for g in range(0, len(view.devices) - tp + 1, tp):
            group = tuple(range(g, g + tp))
            if g // per_node != (g + tp - 1) // per_node:
                continue
            if all(self._mem_slots(b, d) < self.max_colocated and b.mem_free[d] >= need
                   for d in group):
                groups.append(group)
        live = sum(1 for p in view.pipelines if not p.finished)
        cap = max(1, (len(view.devices) // tp) * self.max_colocated // max(1, live))
        if self._tight:  # nothing can share a device: give each rollout the whole pool
            cap = len(view.devices) // tp
        want = min(cap, len(view.devices) // tp)
        if not groups or len(groups) < self.min_rollout_fraction * want:
            return None
        groups.sort(key=lambda g: (max(self._mem_slots(b, d) for d in g), g))
        devs = sorted(d for g in groups[:want] for d in g)
        self._ensure_prediction(view, pv, step)
        tid = task_id(pv.name, step, Stage.ROLLOUT)
        b.kind[tid], b.pipe[tid], b.stage[tid] = "memory", pv.name, Stage.ROLLOUT
        b.ranks[tid] = [tuple(devs[i:i + tp]) for i in range(0, len(devs), tp)]
        b.rank_idx[tid] = list(range(len(b.ranks[tid])))
        for d in devs:
            b.dev[d][tid] = 0.0  # share assigned below
            b.mem_free[d] -= need
        return StartRollout(pv.name, step, tuple(devs), tp, share=1.0, kv_mem_bytes=self._kv_mem)

    @staticmethod
    def _mem_slots(b: Board, d: int) -> int:
        """Rollout engines on device ``d`` (a compute stage does not take an engine slot)."""
        return sum(1 for t in b.dev[d] if b.kind[t] == "memory")

    def _pick_compute(self, view: View, b: Board,
                      ready: list[tuple[PipelineView, int, str]]) -> StartStage | None:
        """Start at most one compute stage now (one per device at a time), chosen by look-ahead."""
        cands = [(pv, step, stage, self._compute_devices(view, b, pv))
                 for pv, step, stage in ready]
        cands = [c for c in cands if c[3]]
        if not cands:
            return None
        if self.depth > 0:
            options: list[tuple[PipelineView, int, str, tuple[int, ...]] | None] = list(cands)
            if any(b.kind[t] == "memory" for dev in b.dev for t in dev):
                options.append(None)  # waiting only helps if it spares a running decode
            scores = [self._score(view, b, opt, [c[0].name for c in cands]) for opt in options]
            best = options[min(range(len(options)), key=lambda i: scores[i])]
        else:
            best = cands[0]
        if best is None:
            return None
        pv, step, stage, devs = best
        self._last_compute[pv.name] = devs
        tid = task_id(pv.name, step, stage)
        b.kind[tid], b.pipe[tid], b.stage[tid] = "compute", pv.name, stage
        for d in devs:
            b.dev[d][tid] = 0.0
        mem = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, len(devs)) + (
            view.cost.train_state_bytes(pv.model, len(devs)) -
            view.cost.train_state_bytes(pv.model, len(view.devices)))
        return StartStage(pv.name, step, stage, devs, share=1.0, mem_bytes=mem)

    def _compute_devices(self, view: View, b: Board, pv: PipelineView) -> tuple[int, ...]:
        """All devices (shared with decodes) or only the free ones at full share: the faster."""
        n = len(view.devices)
        pool = tuple(d for d in range(n) if not b.has_compute(d))
        if len(pool) < n and self.max_train_states == 1:
            return ()  # one compute stage in the pool at a time (one train state resident)
        if not pool:
            return ()
        if self.max_train_states > 1:  # leave devices for the other pipelines' compute stages
            others = sum(1 for p in view.pipelines if not p.finished and p.name != pv.name
                         and not any(t.stage in MODEL_PASSES for t in p.running))
            k = max(1, len(pool) // (1 + min(others, self.max_train_states - 1)))
            last = self._last_compute.get(pv.name, ())  # stay where its state went last time
            pool = tuple(sorted(sorted(pool, key=lambda d: (b.count(d), d not in last, d))[:k]))
        free = tuple(d for d in pool if b.count(d) == 0)
        mem_sub = view.cost.train_state_bytes(pv.model, max(1, len(free))) - \
            view.cost.train_state_bytes(pv.model, n) + \
            view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, max(1, len(free)))
        free_ok = free and all(b.mem_free[d] >= mem_sub + MEM_HEADROOM for d in free)
        share = self._compute_share_beside(view, b, pv)
        rate_shared = 1.0 / view.cost.slowdown(Stage.ACTOR_UPDATE, share, model=pv.model)
        k = len(pool)
        act = view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS, k) + (
            view.cost.train_state_bytes(pv.model, k) - view.cost.train_state_bytes(pv.model, n))
        shared_ok = all(b.mem_free[d] >= act for d in pool)
        if free_ok and (len(free) / len(pool) >= rate_shared or not shared_ok):
            return free
        return pool if shared_ok else ()

    def _compute_share_beside(self, view: View, b: Board, pv: PipelineView) -> float:
        mems = max((sum(1 for t in b.dev[d] if b.kind[t] == "memory") for d in range(len(b.dev))),
                   default=0)
        if mems == 0:
            return 1.0
        return compute_split(view, pv, mems, self.dynamic_shares)[0]

    # ------------------------------------------------------------------ look-ahead
    def _score(self, view: View, b: Board, opt, names: list[str]) -> float:  # noqa: ANN001
        st = self._forecast_state(view, b)
        if opt is None:
            st.deferred = set(names)
        else:
            st.deferred = {n for n in names if n != opt[0].name}
        slow = slow_fn(view)
        return forecast(st, self.depth, slow)

    def _forecast_state(self, view: View, b: Board) -> FState:
        running: list[FWork] = []
        chains: dict[str, list[FWork]] = {}
        weights: dict[str, float] = {}
        for pv in view.pipelines:
            if pv.finished:
                continue
            weights[pv.name] = self._urgency(view, pv)
            step = pv.steps_completed
            pred = self._ensure_prediction(view, pv, step)
            done = pv.done.get(step, frozenset())
            run = {t.stage: t for t in pv.running if t.step == step}
            chain = []
            for stage in stage_sequence(pv.spec):
                if stage in done:
                    continue
                dur = pred.gen_s if stage == Stage.ROLLOUT else pred.stages_s.get(stage, 0.0)
                kind = "memory" if stage == Stage.ROLLOUT else ("compute" if stage in MODEL_PASSES else
                                                          "host")
                w = FWork(pv.name, stage, kind, dur, stage == Stage.WEIGHT_SYNC)
                if stage in run:
                    w.remaining = max(0.05 * dur, dur - (view.now_s - run[stage].start_s))
                    running.append(w)
                elif not any(x.pipeline == pv.name for x in running) and not chain and \
                        kind == "compute":
                    running.append(w)  # a ready compute stage: the option decides
                else:
                    chain.append(w)
            chains[pv.name] = chain
        frac = self._mem_frac(b)
        return FState(view.now_s, running, chains, weights, frac)

    @staticmethod
    def _mem_frac(b: Board) -> float:
        n = len(b.dev)
        held = sum(1 for d in range(n) if any(b.kind.get(t) == "memory" for t in b.dev[d]))
        return held / n if n else 1.0

    # ------------------------------------------------------------------ prediction, urgency
    def _ensure_prediction(self, view: View, pv: PipelineView, step: int) -> Prediction:
        key = (pv.name, step)
        if key not in self._pred:
            self._pred[key] = self._predict(view, pv, step)
        return self._pred[key]

    def _predict(self, view: View, pv: PipelineView, step: int) -> Prediction:
        n = len(view.devices)
        spec = pv.spec
        task = TASKS.get(spec.task)
        prior_p = int(task.prompt_mean) if task else 128
        prior_r = int(task.response_median * (1.3 if task and task.multi_turn else 1.0)) \
            if task else spec.max_response_tokens // 4
        n_ranks = max(1, n // spec.rollout_tp)
        reqs = self._predictor.predict(pv.name, step, spec.batch_size * spec.group_size,
                                       pv.history, prior_p, prior_r, spec.max_response_tokens,
                                       n_ranks)
        kv = view.cost.kv_budget_tokens(pv.model, spec.rollout_tp, max(self._kv_mem, 1.0))
        # The predictor deals lengths round-robin, so rank 0 holds the longest request and a
        # representative mix: its predicted timeline is the rollout's (cheap: one rank, not n).
        inst = RolloutInstance(f"{pv.name}/{step}/pred", pv.model, spec.rollout_tp, view.cost,
                               kv_budget_tokens=max(kv, 1))
        inst.add(split_ranks(reqs, n_ranks)[0])
        segs = rank_segments(inst)
        gen = segs[-1][2] if segs else 0.0
        tokens = sum(r.total_tokens for r in reqs)
        self._pred = {k: v for k, v in self._pred.items() if k[1] >= step - 1}
        stages = post_rollout_stages(view.cost, pv.model, n, tokens, len(reqs),
                                     use_ref=spec.use_ref, ppo_epochs=spec.train.ppo_epochs,
                                     rollout_tp=spec.rollout_tp)
        return Prediction(gen, stages)

    def _by_urgency(self, view: View) -> list[PipelineView]:
        live = [pv for pv in view.pipelines if not pv.finished]
        return sorted(live, key=lambda pv: -self._urgency(view, pv))

    def _urgency(self, view: View, pv: PipelineView) -> float:
        """Weight × lateness of the current step against its predicted solo time × the share
        of all remaining work that is this pipeline's (the longest job gates the makespan)."""
        step = pv.steps_completed
        starts = [t.start_s for t in pv.running if t.step == step and t.stage == Stage.ROLLOUT]
        pred = self._pred.get((pv.name, step))
        if pred is None or pred.step_s <= 0:
            return pv.spec.latency_weight
        left = {p.name: self._left_s(p) for p in view.pipelines if not p.finished}
        mean_left = sum(left.values()) / max(1, len(left))
        share = left.get(pv.name, 0.0) / mean_left if mean_left > 0 else 1.0
        ratio = (view.now_s - starts[0]) / pred.step_s if starts else 1.0
        bound = pv.spec.max_latency_ratio
        boost = 10.0 if bound is not None and ratio > 0.8 * bound else 1.0
        return pv.spec.latency_weight * max(1.0, ratio) * boost * max(0.5, share)

    def _left_s(self, pv: PipelineView) -> float:
        """Predicted remaining work of a pipeline: its remaining steps × predicted step time."""
        pred = self._pred.get((pv.name, pv.steps_completed))
        per = pred.step_s if pred is not None else 1.0
        return per * (pv.spec.steps - pv.steps_completed)

    # ------------------------------------------------------------------ shares
    def _share_actions(self, view: View, b: Board, starts: list[Action]) -> list[Action]:
        """Assign every device's split, then emit decreases, starts, increases (in that order,
        so the driver never sees a device over its compute)."""
        want = self._assign(view, b)
        running = {t.task_id: t for pv in view.pipelines for t in pv.running}
        down: list[Action] = []
        up: list[Action] = []
        starts = [with_share(a, want) for a in starts]
        started = {task_id(a.pipeline, a.step, Stage.ROLLOUT if isinstance(a, StartRollout)
                           else a.stage) for a in starts}
        for tid, shares in want.items():
            if tid in started or tid not in running:
                continue
            t = running[tid]
            if b.kind[tid] == "compute":
                new = min(shares.values())
                if abs(new - t.share) > 1e-9:
                    (down if new < t.share else up).append(SetShare(tid, new))
                continue
            for r in b.rank_idx[tid]:
                devs = t.rank_devices[r]
                new = min(shares[d] for d in devs)
                old = t.rank_shares[r]
                if abs(new - old) > 1e-9:
                    (down if new < old else up).append(SetShare(tid, new, rank=r))
        return down + starts + up

    def _assign(self, view: View, b: Board) -> dict[str, dict[int, float]]:
        """Per task, per device: its compute share."""
        want: dict[str, dict[int, float]] = {}
        compute_share: dict[str, float] = {}
        for tasks in b.dev:
            mems = [t for t in tasks if b.kind[t] == "memory"]
            comps = [t for t in tasks if b.kind[t] == "compute"]
            if comps and mems:
                pv = next(p for p in view.pipelines if p.name == b.pipe[comps[0]])
                c_share = compute_split(view, pv, len(mems), self.dynamic_shares)[0]
            elif comps:
                c_share = 1.0
            else:
                c_share = 0.0
            for t in comps:
                compute_share[t] = min(compute_share.get(t, 1.0), c_share)
        urgency = {pv.name: self._urgency(view, pv) for pv in view.pipelines}
        by_name = {pv.name: pv for pv in view.pipelines}
        for d, tasks in enumerate(b.dev):
            mems = [t for t in tasks if b.kind[t] == "memory"]
            c = max((compute_share[t] for t in tasks if t in compute_share), default=0.0)
            for t in tasks:
                if t in compute_share:
                    want.setdefault(t, {})[d] = compute_share[t]
            split = self._rollout_split(view, [by_name[b.pipe[t]] for t in mems],
                                        [urgency[b.pipe[t]] for t in mems], 1.0 - c)
            for t, share in zip(mems, split, strict=True):
                want.setdefault(t, {})[d] = share
        return want

    def _rollout_split(self, view: View, pvs: list[PipelineView], weights: list[float],
                       room: float) -> list[float]:
        """Shares of co-located rollouts: equal, or (dynamic, two of them) the levels maximising
        the urgency-weighted rate, where a rollout's rate blends decode (memory-bound) with
        prefill (compute-bound; a larger part for multi-turn tasks, which re-prefill each turn)."""
        even = level_floor(room / len(pvs)) if pvs else 0.0
        if not self.dynamic_shares or len(pvs) != 2:
            return [even] * len(pvs)
        best, arg = -1.0, [even, even]
        for s1 in SHARE_LEVELS:
            s2 = level_floor(room - s1)
            if s1 > room + 1e-9 or s2 < 0.2 - 1e-9:
                continue
            rate = sum(w * rollout_rate(view, pv, sh)
                       for pv, w, sh in zip(pvs, weights, (s1, s2), strict=True))
            if rate > best + 1e-12:
                best, arg = rate, [s1, s2]
        return arg


@register_policy("greedy")
def _greedy(**params) -> JigsawPolicy:  # noqa: ANN003
    """jigsaw without look-ahead (depth 0): the ablation of the look-ahead."""
    params.setdefault("name", "greedy")
    return JigsawPolicy(depth=0, **{k: v for k, v in params.items() if k != "depth"})
