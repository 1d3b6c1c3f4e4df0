"""Data parallelism of a model pass over device workers: the helpers' shards and how the train
state's holder combines them.

What: the holder exports a :class:`~jigsawrl.executors.raycluster.messages.ShardPayload` (the
model's weights, the step's batch, the trainer config); each helper worker loads the weights into
a model of its own (:class:`ShardModels`, built once per pipeline) and computes its rows
(:func:`run_shard`): log-probs, or the update's gradients over the whole batch's token count.
The holder computes its own rows and combines (:func:`combine_shards`): log-probs are gathered,
gradients summed into one optimizer step. Tensors arrive on the CPU (``wire.py``); each side moves
what it receives onto its models' device (``engine/device.py``) and sends host copies.
"""

from __future__ import annotations

from typing import Any

import ray

from jigsawrl.executors.raycluster.messages import ShardRequest, ShardResult, Timed
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, wall_now, worker_device
from jigsawrl.stages import Stage


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
            logprobs = compute_logprobs(model, shard, cfg.micro_batch_size)
        return ShardResult(t_start=t_start, t_end=wall_now(),
                           tokens=int(shard.attention_mask.sum()), grads=grads, logprobs=logprobs)


def combine_shards(pipe: Any, stage: str, data: Any, helpers: list[Any],
                   bounds: tuple[tuple[int, int], ...]) -> tuple[Any, tuple[Timed, ...]]:
    """The holder's shard (rows ``bounds[0]``) plus the helpers' (``helpers``: their
    ``ObjectRef`` s, rows ``bounds[1:]``); returns the stage's result (the update's metrics, or
    None: the log-probs are written into the batch) and the helpers' timings."""
    import torch

    from jigsawrl.engine.device import model_device, to_device
    from jigsawrl.engine.trainer import compute_logprobs

    trainer = pipe.trainer
    device = model_device(trainer.model)
    batch = to_device(data.batch, device)  # (a batch onloaded from host memory is on the CPU)
    own = batch.slice(*bounds[0])
    got: list[ShardResult] = []

    def fetch() -> list[ShardResult]:
        got.extend(ray.get(helpers))
        return got

    if stage == Stage.ACTOR_UPDATE:
        total = float(batch.loss_mask.sum())
        metrics = trainer.update_data_parallel(
            own, total, lambda: [to_device(r.grads, device) for r in fetch()])
        data.metrics.update(metrics)
        return metrics, tuple(r.timing() for r in got)
    model = trainer.ref_model if stage == Stage.REF_LOGPROB else trainer.model
    parts = [compute_logprobs(model, own, trainer.config.micro_batch_size)]
    parts += [r.logprobs for r in fetch()]
    full = torch.zeros(batch.loss_mask.shape, dtype=torch.float32, device=device)
    for (start, stop), lp in zip(bounds, parts, strict=True):
        full[start:stop, : lp.shape[1]] = lp
    if stage == Stage.REF_LOGPROB:
        batch.ref_logprobs = full
    else:
        batch.old_logprobs = full
    return None, tuple(r.timing() for r in got)
