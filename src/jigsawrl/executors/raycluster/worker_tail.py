"""A device worker's in-tail log-probs: the old (and reference) log-probs of a sync rollout's
finished GRPO groups, computed on a rank's device once that rank drained, while the rollout's
tail still runs elsewhere (jigsaw's ``tail_logprobs``; issue 11 item 4, issue 14 item 2).

Why exact: a sync pipeline's weights do not change until its update, which runs after the
rollout; the rollout's weights (what this worker's engines loaded, checked by version) are the
actor's, so the rows computed here are those the post-rollout pass would compute
(``engine/tail_logprobs.py``, tested to 1e-5). The reference model never changes: it is built
once per pipeline here from the train state's host copy the first call brings.

The holder of the train state writes these rows into the step's batch and computes only the
rows left (:func:`~jigsawrl.engine.tail_logprobs.fill_rows`, in ``worker_train.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from jigsawrl.executors.raycluster.messages import TailRequest, TailResult, TrainState
from jigsawrl.executors.raycluster.worker_pipes import LocalPipelines, wall_now, worker_device

log = logging.getLogger(__name__)


class TailHost:
    """The in-tail passes of one device worker (see the module docstring).

    Args:
        local: the worker's pipelines.
        weights: the rollout side's newest weights per pipeline (``RolloutHost.weights``).
        actors: the models to load the actor's weights into (``ShardModels``).
    """

    def __init__(self, local: LocalPipelines, weights: dict[str, tuple[int, Any]],
                 actors: Any) -> None:
        self.local = local
        self.weights = weights
        self.actors = actors
        self.refs: dict[str, Any] = {}  # pipeline -> its reference model, built once

    def run(self, req: TailRequest, ref_state: TrainState | None) -> TailResult:
        """Compute ``req``'s rows (``ref_state``: the train state's host copy, needed by the
        first call of a pipeline that asks for reference log-probs here)."""
        import torch

        from jigsawrl.engine.device import to_host
        from jigsawrl.engine.pipeline import grpo_config
        from jigsawrl.engine.tail_logprobs import pass_options, rows_logprobs

        torch.set_num_threads(max(1, req.threads))
        t_start = wall_now()
        name = req.pipeline
        pipe = self.local.get(name)
        opts = pass_options(grpo_config(pipe.spec.train))
        seqs = list(req.sequences)
        pad = pipe.tokenizer.pad_token_id
        old = ref = None
        if req.old:
            version, weights = self.weights.get(name, (-1, None))
            if version != req.version:
                raise RuntimeError(f"device {self.local.device}: in-tail log-probs of {name} "
                                   f"step {req.step} need weights version {req.version}, this "
                                   f"worker holds {version}")
            model = self.actors.get(name)
            model.load_state_dict(weights)
            old = tuple(to_host(rows_logprobs(model, seqs, pad, opts)))
        t_mid = wall_now()
        if req.ref:
            ref = tuple(to_host(rows_logprobs(self._ref(name, ref_state), seqs, pad, opts)))
        tokens = sum(len(p) + len(r) for p, r, _ in seqs) * (int(req.old) + int(req.ref))
        return TailResult(t_start=t_start, t_end=wall_now(), tokens=tokens, rows=req.rows,
                          old=old, ref=ref, t_mid=t_mid)

    def _ref(self, name: str, state: TrainState | None) -> Any:
        model = self.refs.get(name)
        if model is not None:
            return model
        if state is None or state.train.get("ref") is None:
            raise RuntimeError(f"device {self.local.device}: in-tail reference log-probs of "
                               f"{name} need its train state's reference weights")
        from jigsawrl.engine.pipeline import build_model_and_tokenizer

        spec = self.local.specs[name]
        model = build_model_and_tokenizer(spec.model, self.local.seed,
                                          device=worker_device(spec))[0]
        model.load_state_dict(state.train["ref"])
        model.requires_grad_(False)
        model.eval()
        self.refs[name] = model
        return model


def kept_rows(refs: list[Any], stage: str, *, get: Any = None) -> dict[int, Any]:
    """The rows the in-tail calls ``refs`` computed for ``stage`` (row -> log-probs); a call
    that failed is skipped (logged): its rows are computed by the pass. ``get`` (``ray.get``
    by default) is injectable for tests."""
    import ray

    from jigsawrl.stages import Stage

    get = get or ray.get
    out: dict[int, Any] = {}
    for i, ref in enumerate(refs):
        try:
            res = get(ref)
        except Exception as exc:  # noqa: BLE001 - a dead worker, other weights: recompute
            log.warning("%s: in-tail call %d failed (%s); its rows are computed now", stage, i,
                        type(exc).__name__)
            continue
        rows = res.old if stage == Stage.OLD_LOGPROB else res.ref
        if rows is not None:
            out.update(zip(res.rows, rows, strict=True))
    return out


def fill_from_tail(pipe: Any, data: Any, stage: str, refs: list[Any], *,
                   get: Any = None) -> int:
    """The holder's log-prob pass of ``stage`` on the step's batch ``data``: the rows the
    in-tail calls ``refs`` computed written in, the rest computed here; returns how many rows
    came from the tail."""
    from jigsawrl.engine.device import to_device
    from jigsawrl.engine.tail_logprobs import fill_rows, pass_options
    from jigsawrl.stages import Stage

    trainer = pipe.trainer
    model = trainer.ref_model if stage == Stage.REF_LOGPROB else trainer.model
    kept = kept_rows(refs, stage, get=get)
    batch = to_device(data.batch, pipe.device)
    full, _ = fill_rows(model, batch, kept, pass_options(trainer.config))
    if stage == Stage.REF_LOGPROB:
        data.batch.ref_logprobs = full
    else:
        data.batch.old_logprobs = full
    return len(kept)
