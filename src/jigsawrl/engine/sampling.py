"""Token sampling for the rollout engine: temperature, top-p, per-request generators, log-probs.

Every request draws from its own ``torch.Generator`` (one uniform number per sampled token), so
what a request samples depends on its seed and its logits only, never on which other requests
share the batch; the generator's state travels with an exported request (`rng_state`) so a request
resumed on another engine goes on drawing the numbers it would have drawn. The draw is an inverse
CDF over the top-p nucleus, vectorised over the batch; only the uniform draws loop in Python.
The generators are CPU generators on every device (``engine/device.py``): the draws are then the
same on a GPU as on the CPU and the state exports as bytes; the batch's uniforms reach the logits'
device in one small copy, and the sampled tokens come back in one ``tolist``.

The log-prob of a sampled token is ``log_softmax(logits / temperature)`` at that token (plain
``log_softmax(logits)`` when the temperature is 0, i.e. greedy): the full-vocabulary distribution,
not the renormalised nucleus, which is what a trainer recomputes from the same logits.
"""

from __future__ import annotations

import torch


def new_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with ``seed``, or from OS entropy when ``seed`` is None."""
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def generator_state(gen: torch.Generator) -> bytes:
    """The generator's state as plain bytes (picklable, sendable)."""
    return bytes(gen.get_state().numpy().tobytes())


def generator_from_state(state: bytes) -> torch.Generator:
    gen = torch.Generator()
    gen.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    return gen


def sample_tokens(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Pick one token per row of ``logits`` ([B, V]); return the tokens and their log-probs.

    Rows with temperature 0 take the argmax (their generator is not used).
    """
    logits = logits.float()
    temps = torch.tensor(temperatures, dtype=torch.float32, device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    # Full-vocabulary rows and nucleus rows are drawn apart, so that how a row is drawn depends
    # on its own top_p only, never on the other rows of the batch.
    for nucleus in (False, True):
        sampled_rows = [b for b, t in enumerate(temperatures)
                        if t > 0 and (top_ps[b] < 1) == nucleus]
        if not sampled_rows:
            continue
        rows = torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)
        uniforms = torch.tensor([torch.rand((), generator=generators[b]).item()
                                 for b in sampled_rows], device=logits.device)
        sub = logp.index_select(0, rows)
        if nucleus:
            top_p = torch.tensor([top_ps[b] for b in sampled_rows], device=logits.device)
            picked = _nucleus_draw(sub, top_p, uniforms)
        else:
            picked = _inverse_cdf(sub.exp(), uniforms)
        tokens = tokens.index_copy(0, rows, picked)
    chosen = logp.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), chosen.tolist()


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw from the whole vocabulary in its own order (no sort is needed when top_p = 1)."""
    cdf = torch.cumsum(probs, dim=-1)
    idx = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)
    return idx.clamp(max=cdf.shape[-1] - 1)[:, 0]


def _nucleus_draw(logp: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from the smallest set of most likely tokens whose mass reaches top_p."""
    probs, order = torch.sort(logp.exp(), dim=-1, descending=True, stable=True)
    before = torch.cumsum(probs, dim=-1) - probs
    kept = torch.where(before < top_p.to(probs.device)[:, None], probs, torch.zeros_like(probs))
    cdf = torch.cumsum(kept, dim=-1)
    target = (uniforms * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, target, right=True)
    # u * total < total, so idx lands on a kept token; the clamp guards float rounding only.
    n_kept = (kept > 0).sum(dim=-1, keepdim=True)
    idx = torch.minimum(idx, n_kept - 1)
    return order.gather(1, idx)[:, 0]
