"""The ``jigsaw`` policy's memory: the plan sized at the first decision, and the train states'
moves between host memory and the devices.

The plan (:meth:`Residency.place`): every rollout engine gets an equal slice of the memory that
``max_train_states`` train states (plus a micro-batch's activations and :data:`MEM_HEADROOM`)
leave; when that is too little for the longest response (large models), the engines may use the
activations' room too — the *tight* plan, in which a training stage starts only on devices whose
engines have finished. Train states live in host memory and are onloaded only for a pipeline's
training stages (the prototype's offload): at most ``max_train_states`` of them are on the devices
at a time, each sharded over the whole pool. Memory is reserved from an onload's start and
released when the offload has finished.
"""

from __future__ import annotations

from collections.abc import Sequence

from jigsawrl.errors import ConfigError
from jigsawrl.scheduler.base import Action, PipelineView, SetResident, StartStage, View
from jigsawrl.scheduler.jigsaw.board import MEM_HEADROOM, Board
from jigsawrl.scheduler.jigsaw.params import JigsawParams
from jigsawrl.scheduler.verl import MICRO_BATCH_TOKENS, pipeline_resident_bytes
from jigsawrl.stages import MODEL_PASSES, Stage

# Where a pipeline's train state is.
HOST, LOADING, DEVICE, UNLOADING = "host", "loading", "device", "unloading"


class Residency:
    """The memory plan and the train states' places (module docstring)."""

    def __init__(self, params: JigsawParams) -> None:
        self.params = params
        self.placed = False
        self.kv_mem = 0.0  # per device, the KV memory of one rollout engine
        self.tight = False  # memory-tight plan: engines also use the activations' room
        self.resident: dict[str, float] = {}  # pipeline -> train state + reference, per device
        self._state: dict[str, str] = {}  # pipeline -> host | loading | device | unloading
        self._all: tuple[int, ...] = ()

    def _everything(self, view: View) -> tuple[int, ...]:
        """Every device of the pool (a train state is sharded over all of them)."""
        n = len(view.devices)
        if len(self._all) != n:
            self._all = tuple(range(n))
        return self._all

    def on_device(self, pipeline: str) -> bool:
        """Is the pipeline's train state onloaded (so its model passes may start)?"""
        return self._state.get(pipeline) == DEVICE

    def place(self, view: View) -> None:
        """Size the engines' KV slices (module docstring).

        Raises:
            ConfigError: not even the tight plan leaves one response's KV per engine.
        """
        n = len(view.devices)
        hbm = view.accelerator.hbm_bytes
        colocated = self.params.max_colocated
        self.resident = {p.name: pipeline_resident_bytes(view.cost, p, n)
                         for p in view.pipelines}
        weights = max(view.cost.rollout_weight_bytes(p.model, p.spec.rollout_tp)
                      for p in view.pipelines)
        act = max(view.cost.activation_bytes(p.model, MICRO_BATCH_TOKENS, n)
                  for p in view.pipelines)
        longest = max(view.cost.kv_bytes(p.model, p.spec.max_response_tokens + 512,
                                         p.spec.rollout_tp) for p in view.pipelines)
        states = sorted(self.resident.values(), reverse=True)[:self.params.max_train_states]
        base = hbm - sum(states) - MEM_HEADROOM  # room for the train states onloaded at once
        self.kv_mem = (base - act) / colocated - weights
        if self.kv_mem < longest:
            # Memory-tight (large models): engines may use the activations' room too; a
            # training stage then starts only on devices whose engines have finished.
            self.kv_mem = base / colocated - weights
            self.tight = True
        if self.kv_mem < longest:
            raise ConfigError(
                f"jigsaw: one train state ({max(self.resident.values()) / 1e9:.0f} GB per "
                f"device on {n} devices) leaves too little memory for {colocated} "
                "co-located rollout engine(s)", where="scheduler.params",
                fix="use more devices, a smaller model, or a larger rollout_tp")
        self.placed = True

    def memory_moves(self, view: View, b: Board,
                     order: Sequence[PipelineView] | None = None) -> list[Action]:
        """Onload a pipeline's train state when its training stage is next; offload it after
        its update. Finished moves are settled first, so the onloads see the memory they free.
        ``order``: who is considered first for the train-state slot (the policy passes its
        urgency order: the slot goes to the most urgent pipeline waiting, not the first in
        config order; None: config order)."""
        return self._settle(view, b) + self._start_moves(view, b, order or view.pipelines)

    def _settle(self, view: View, b: Board) -> list[Action]:
        actions: list[Action] = []
        everything = self._everything(view)
        for pv in view.pipelines:
            state = self._state.get(pv.name, HOST)
            if state != LOADING and state != UNLOADING:
                continue  # nothing moving to settle
            moving = {t.stage for t in pv.running if t.stage in (Stage.ONLOAD, Stage.OFFLOAD)}
            if state == LOADING and Stage.ONLOAD not in moving:
                self._state[pv.name] = DEVICE
            if state == UNLOADING and Stage.OFFLOAD not in moving:
                self._state[pv.name] = HOST
                actions.append(SetResident(pv.name, everything, 0.0))
                for d in everything:
                    b.mem_free[d] += self.resident[pv.name]
        return actions

    def _start_moves(self, view: View, b: Board,
                     order: Sequence[PipelineView]) -> list[Action]:
        actions: list[Action] = []
        everything = self._everything(view)
        keep = len(view.pipelines) <= self.params.max_train_states  # every state fits: stay
        for pv in order:
            state = self._state.get(pv.name, HOST)
            if state != DEVICE and state != HOST:
                continue  # moving: nothing to start
            wants = any(stage in MODEL_PASSES for _, stage in pv.ready())
            if state == DEVICE and not wants and not keep and not any(
                    t.stage in MODEL_PASSES for t in pv.running):
                self._state[pv.name] = UNLOADING
                actions.append(StartStage(pv.name, pv.steps_completed, Stage.OFFLOAD, everything,
                                          share=0.0))
            elif state == HOST and wants and not pv.finished and self._can_onload(view, b, pv):
                self._state[pv.name] = LOADING
                actions.append(SetResident(pv.name, everything, self.resident[pv.name]))
                actions.append(StartStage(pv.name, pv.steps_completed, Stage.ONLOAD, everything,
                                          share=0.0))
                for d in everything:
                    b.mem_free[d] -= self.resident[pv.name]
        return actions

    def _can_onload(self, view: View, b: Board, pv: PipelineView) -> bool:
        if sum(s != HOST for s in self._state.values()) >= self.params.max_train_states:
            return False  # max_train_states on the devices at a time (the memory plan above)
        n = len(view.devices)
        need = self.resident[pv.name] + view.cost.activation_bytes(pv.model, MICRO_BATCH_TOKENS,
                                                                   n)
        return all(b.mem_free[d] >= need for d in range(n))
