"""Data parallelism of a model pass over device workers: the helpers' shards and how the train
state's holder combines them.

What: the holder exports a :class:`~jigsawrl.executors.raycluster.messages.ShardPayload` (the
model's weights, the step's batch, the trainer config); each helper worker loads the weights into
a model of its own (:class:`ShardModels`, built once per pipeline) and computes its rows
(:func:`run_shard`): log-probs, or the update's gradients over the whole batch's token count.
The holder computes its own rows and combines (:func:`combine_shards`): log-probs are gathered,
gradients summed into one optimizer step per PPO epoch (:class:`UpdateRounds`: each later epoch
sends the helpers the weights after the previous step). Tensors arrive on the CPU (``wire.py``);
each side moves what it receives onto its models' device (``engine/device.py``) and sends host
copies.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from jigsawrl.executors.raycluster.messages import (
    ShardPayload,
    ShardRequest,
    ShardResult,
    StageRequest,
    Timed,
)
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, wall_now, worker_device
from jigsawrl.stages import Stage

log = logging.getLogger(__name__)


class ShardModels:
    """The model each pipeline's data-parallel helper calls load weights into (built once)."""

    def __init__(self, local: LocalPipelines) -> None:
        self.local = local
        self.models: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        model = self.models.get(name)
        if model is None:
            from jigsawrl.engine.pipeline import build_model_and_tokenizer

            spec = self.local.specs[name]
            model = self.models[name] = build_model_and_tokenizer(
                spec.model, self.local.seed, device=worker_device(spec))[0]
        return model

    def run_shard(self, req: ShardRequest, payload: Any) -> ShardResult:
        """A helper's part of a model pass: rows ``req.start:req.stop`` of the payload's batch."""
        import torch

        from jigsawrl.engine.device import model_device, to_device
        from jigsawrl.engine.trainer import compute_logprobs, shard_grads

        torch.set_num_threads(max(1, req.threads))
        t_start = wall_now()
        model = self.get(req.pipeline)
        model.load_state_dict(payload.weights)
        batch, cfg = to_device(payload.batch, model_device(model)), payload.config
        shard = batch.slice(req.start, req.stop)
        grads = logprobs = None
        if req.stage == Stage.ACTOR_UPDATE:
            grads = shard_grads(model, shard, float(batch.loss_mask.sum()), cfg)
        else:
            logprobs = compute_logprobs(model, shard, cfg.micro_batch_size, cfg.share_prompt,
                                        cfg.autocast)
        return ShardResult(t_start=t_start, t_end=wall_now(),
                           tokens=int(shard.attention_mask.sum()), grads=grads, logprobs=logprobs)


def payload_of(model: Any, batch: Any, config: Any) -> ShardPayload:
    """What a helper needs for a pass on ``model``'s current weights: host copies of them
    (a snapshot later steps do not change), the step's batch and the trainer config."""
    from jigsawrl.engine.device import to_host

    return ShardPayload(to_host(model.state_dict(), copy=True), batch, config)


def fetch_shard(get: Any, ref: Any, what: str, index: int) -> ShardResult | None:
    """Helper ``index``'s shard, or None (logged) when its call failed: the caller then
    computes those rows itself."""
    try:
        return get(ref)
    except ray.exceptions.RayError as exc:
        log.warning("%s: data-parallel helper %d failed (%s); its rows are computed on the "
                    "holder", what, index, type(exc).__name__)
        return None


def empty_span() -> Timed:
    """The timing of a helper that answered nothing (its rows ran on the holder)."""
    now = wall_now()
    return Timed(t_start=now, t_end=now, tokens=0)


class UpdateRounds:
    """The helpers' side of a data-parallel update, one round per PPO epoch.

    Epoch 0's helper calls were submitted by the executor with the stage (``first``); each
    later epoch needs the weights after the previous optimizer step, so the holder exports them
    and calls the helpers (``actors``) again. A helper whose call fails (its worker died) has
    its rows computed here instead, that epoch and every later one: the step's maths is the
    same, only slower, and the run goes on. ``get``, ``put`` and ``submit`` (Ray's, by default)
    are injectable for tests.
    """

    def __init__(self, trainer: Any, req: StageRequest, data: Any, batch: Any,
                 first: list[Any], actors: list[Any], *, get: Any = None, put: Any = None,
                 submit: Any = None) -> None:
        self.trainer, self.req, self.data, self.batch = trainer, req, data, batch
        self.total = float(batch.loss_mask.sum())
        self.bounds = list(req.bounds[1:])
        self.first, self.actors = first, actors
        self.get = get or ray.get
        self.put = put or ray.put
        self.submit = submit or self._submit
        self.lost: set[int] = set()  # helpers whose rows this holder computes
        self.spans: list[list[ShardResult]] = [[] for _ in self.bounds]

    def _submit(self, index: int, request: ShardRequest, payload: Any) -> Any:
        return self.actors[index].dp_shard.remote(request, payload)

    def launch(self, epoch: int) -> Any:
        """Start epoch ``epoch``'s helper shards; return the function that fetches them."""
        if epoch == 0:
            refs: list[Any] = list(self.first)
        else:
            self.lost.update(range(len(self.actors), len(self.bounds)))  # no worker to call
            payload = None
            if len(self.lost) < len(self.bounds):
                payload = self.put(payload_of(self.trainer.model, self.data.batch,
                                              self.trainer.config))
            refs = [None if i in self.lost else
                    self.submit(i, ShardRequest(self.req.pipeline, self.req.stage, lo, hi,
                                                self.req.threads), payload)
                    for i, (lo, hi) in enumerate(self.bounds)]
        return lambda: self._fetch(refs)

    def _fetch(self, refs: list[Any]) -> list[Any]:
        from jigsawrl.engine.trainer import ShardGrads, accumulate_grads

        out = []
        for i, ((lo, hi), ref) in enumerate(zip(self.bounds, refs, strict=True)):
            if i not in self.lost:
                res = fetch_shard(self.get, ref, f"{self.req.pipeline}/{self.req.stage}", i + 1)
                if res is not None:
                    self.spans[i].append(res)
                    out.append(res.grads)
                    continue
                self.lost.add(i)
            sums = accumulate_grads(self.trainer.model, self.batch.slice(lo, hi), self.total,
                                    self.trainer.config)  # added to the holder's .grad
            params = [p for p in self.trainer.model.parameters() if p.requires_grad]
            out.append(ShardGrads([None] * len(params), sums))
        return out

    def timings(self) -> tuple[tuple[Timed, ...], ...]:
        """Per helper, one span per epoch round it answered (a helper lost before its first
        answer: one empty span at the holder's clock). Not one span from the first round's
        start to the last one's end: between rounds the helper's worker is free and runs other
        calls (a rollout slice ran there in a chaos drill, and the merged span put the device
        at 1.5 of its compute)."""
        return tuple(tuple(Timed(t_start=r.t_start, t_end=r.t_end, tokens=r.tokens)
                           for r in shards) if shards else (empty_span(),)
                     for shards in self.spans)


def combine_shards(pipe: Any, req: StageRequest, data: Any, helpers: list[Any],
                   actors: list[Any]) -> tuple[Any, tuple[Timed | tuple[Timed, ...], ...]]:
    """The holder's shard (rows ``req.bounds[0]``) plus the helpers' (``helpers``: their
    ``ObjectRef`` s, rows ``req.bounds[1:]``; ``actors``: their workers, called again for each
    later PPO epoch); returns the stage's result (the update's metrics, or None: the log-probs
    are written into the batch) and the helpers' timings."""

    from jigsawrl.engine.device import model_device, to_device

    trainer = pipe.trainer
    device = model_device(trainer.model)
    batch = to_device(data.batch, device)  # (a batch onloaded from host memory is on the CPU)
    bounds = req.bounds
    own = batch.slice(*bounds[0])
    if req.stage == Stage.ACTOR_UPDATE:
        rounds = UpdateRounds(trainer, req, data, batch, helpers, actors)

        def shards(epoch: int) -> Any:
            fetch = rounds.launch(epoch)
            return lambda: [to_device(g, device) for g in fetch()]

        metrics = trainer.update_data_parallel(own, rounds.total, shards)
        metrics["perf/dp_lost_helpers"] = float(len(rounds.lost))  # their rows ran here
        data.metrics.update(metrics)
        return metrics, rounds.timings()
    model = trainer.ref_model if req.stage == Stage.REF_LOGPROB else trainer.model
    full, timings = gather_logprobs(model, batch, bounds, helpers, trainer.config,
                                    f"{req.pipeline}/{req.stage}")
    if req.stage == Stage.REF_LOGPROB:
        batch.ref_logprobs = full
    else:
        batch.old_logprobs = full
    return None, timings


def gather_logprobs(model: Any, batch: Any, bounds: tuple[tuple[int, int], ...],
                    helpers: list[Any], cfg: Any, what: str, *,
                    get: Any = None) -> tuple[Any, tuple[Timed, ...]]:
    """The log-probs of the whole batch: this process's rows ``bounds[0]``, then each helper's
    (``helpers``: their ``ObjectRef`` s, rows ``bounds[1:]``); a helper whose call failed has
    its rows computed here (logged; its timing an empty span), so one dead helper slows the pass
    and does not fail it. ``get`` (``ray.get`` by default) is injectable for tests."""
    import torch

    from jigsawrl.engine.device import model_device, to_device
    from jigsawrl.engine.trainer import compute_logprobs

    get = get or ray.get
    device = model_device(model)

    def local(lo: int, hi: int) -> Any:
        return compute_logprobs(model, batch.slice(lo, hi), cfg.micro_batch_size,
                                cfg.share_prompt, cfg.autocast)

    parts = [local(*bounds[0])]
    timings: list[Timed] = []
    for i, ((lo, hi), ref) in enumerate(zip(bounds[1:], helpers, strict=True), start=1):
        res = fetch_shard(get, ref, what, i)  # after this process's rows: side by side
        parts.append(local(lo, hi) if res is None else to_device(res.logprobs, device))
        timings.append(empty_span() if res is None else res.timing())
    full = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=device)
    for (start, stop), lp in zip(bounds, parts, strict=True):
        full[start:stop, : lp.shape[1]] = lp
    return full, tuple(timings)
