"""The look-ahead's forecaster: a cheap fluid model of the pool a few events ahead.

Why a fluid model: the look-ahead scores several candidate actions at every decision, within the
decision-time budget (p99 ≤ 10 ms at 64 devices × 8 pipelines), so it cannot replay the full
continuous-batching simulation. Instead each pipeline is a *chain* of works (the rest of its
current step, then its next step), each work has a remaining amount in "seconds on the whole pool
at full share" and a kind:

- ``memory`` (rollout decode, memory-bound): its speed depends only on its compute share through
  the belief slowdown table, not on how many devices it spans (a tail is sequential decoding);
- ``compute`` (log-probs, update): speed = the fraction of the pool it gets — running on every
  device at share ``s`` gives ``1/slowdown(s)``; running only on the devices that no memory-bound
  work occupies gives ``1 - f`` (FSDP runs at the pace of its slowest device);
- ``host`` (reward, weight sync): fixed wall time, no device compute.

The continuation rule inside the forecast is the policy's own default (rollouts start at once and
share the devices; compute works run one at a time, largest weighted urgency first). Score: the
weighted sum of every pipeline's forecast step-completion time (lower is better); a pipeline whose
step does not complete within the horizon is charged its remaining chain at full speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class FWork:
    pipeline: str
    stage: str
    kind: str  # memory | compute | host
    remaining: float  # seconds at full share on the whole pool (wall seconds for host/memory)
    ends_step: bool = False  # completing it completes the pipeline's current step


@dataclass(slots=True)
class FState:
    """A forecast snapshot: running works, each pipeline's queued chain, weights."""

    now: float
    running: list[FWork]
    chains: dict[str, list[FWork]]
    weights: dict[str, float]
    mem_frac: float = 1.0  # device fraction memory-bound works occupy (< 1 after migration)
    deferred: set[str] = field(default_factory=set)  # compute works held back at t = now


Slow = Callable[[str, float], float]


def _rates(st: FState, slow: Slow, mem_share: float) -> dict[int, float]:
    """Progress rate of each running work (units of ``remaining`` per second)."""
    mems = [w for w in st.running if w.kind == "memory"]
    share_m = mem_share if mems else 0.0
    rates: dict[int, float] = {}
    for i, w in enumerate(st.running):
        if w.kind == "host":
            rates[i] = 1.0
        elif w.kind == "memory":
            n = len(mems)
            share = min(1.0, max(share_m, (1.0 - _compute_share(st, share_m)) / n))
            rates[i] = 1.0 / slow(w.stage, share)
        else:
            shared = 1.0 / slow(w.stage, _compute_share(st, share_m)) if mems else 1.0
            rates[i] = max(shared, 1.0 - st.mem_frac) if mems else 1.0
    return rates


def _compute_share(st: FState, mem_share: float) -> float:
    mems = sum(1 for w in st.running if w.kind == "memory")
    return max(0.2, 1.0 - mem_share * min(mems, 1)) if mems else 1.0


def _start_next(st: FState, pipeline: str) -> None:
    chain = st.chains.get(pipeline)
    if chain:
        st.running.append(chain.pop(0))


def _admit_compute(st: FState, pending: list[FWork]) -> None:
    """One compute work at a time, highest weight first (the policy's default rule)."""
    if any(w.kind == "compute" for w in st.running) or not pending:
        return
    pending.sort(key=lambda w: -st.weights.get(w.pipeline, 1.0))
    st.running.append(pending.pop(0))


def forecast(st: FState, depth: int, slow: Slow, mem_share: float = 0.4) -> float:
    """Weighted sum of forecast step-completion times after ``depth`` events (lower is better)."""
    done: dict[str, float] = {}
    pending = [w for w in st.running if w.kind == "compute" and w.pipeline in st.deferred]
    st.running = [w for w in st.running if w not in pending]
    t = st.now
    for _ in range(max(0, depth)):
        if not st.running:
            _admit_compute(st, pending)
            if not st.running:
                break
        rates = _rates(st, slow, mem_share)
        i, dt = min(((i, w.remaining / max(rates[i], 1e-9)) for i, w in enumerate(st.running)),
                    key=lambda x: x[1])
        t += dt
        for j, w in enumerate(st.running):
            w.remaining -= rates[j] * dt
        fin = st.running.pop(i)
        if fin.ends_step and fin.pipeline not in done:
            done[fin.pipeline] = t
        nxt = st.chains.get(fin.pipeline)
        if nxt:
            if nxt[0].kind == "compute":
                pending.append(nxt.pop(0))
            else:
                _start_next(st, fin.pipeline)
        _admit_compute(st, pending)
    return _score(st, done, pending, t)


def _score(st: FState, done: dict[str, float], pending: list[FWork], t: float) -> float:
    total = 0.0
    for p, w in st.weights.items():
        if p in done:
            total += w * (done[p] - st.now)
            continue
        left = sum(x.remaining for x in st.running + pending if x.pipeline == p)
        chain = st.chains.get(p, [])
        upto = next((k for k, x in enumerate(chain) if x.ends_step), len(chain) - 1)
        left += sum(x.remaining for x in chain[: upto + 1])
        total += w * (t - st.now + left)
    return total
