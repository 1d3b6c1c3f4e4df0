"""In-tail log-probs (``engine/tail_logprobs.py``): a group's log-probs computed when it
finishes, before the whole batch exists, are those the post-rollout pass computes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jigsawrl.engine.models import build_model  # noqa: E402
from jigsawrl.engine.tail_logprobs import TailLogprobs  # noqa: E402
from jigsawrl.engine.trainer import build_batch, compute_logprobs  # noqa: E402

torch.set_num_threads(1)
PAD = 0


def groups() -> list[list[tuple[list[int], list[int], list[int]]]]:
    """Three GRPO groups of two responses each, of different lengths (one with tool tokens)."""
    g = torch.Generator().manual_seed(5)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 100, (n,), generator=g).tolist()

    out = []
    for prompt_len, lens in ((6, (4, 11)), (9, (2, 7)), (5, (13, 3))):
        prompt = ids(prompt_len)
        out.append([(prompt, ids(n), [1] * (n - 2) + [0, 1] if n > 3 else [1] * n)
                    for n in lens])
    return out


@pytest.mark.parametrize("share_prompt", [True, False])
def test_groups_computed_early_equal_the_whole_batch_pass(share_prompt: bool) -> None:
    actor = build_model("qwen2-1m", seed=1)[0]
    ref = build_model("qwen2-1m", seed=2)[0]
    gs = groups()
    seqs = [s for grp in gs for s in grp]
    whole = build_batch(seqs, torch.zeros(len(seqs)), PAD)
    want_old = compute_logprobs(actor, whole, 4, share_prompt)
    want_ref = compute_logprobs(ref, whole, 4, share_prompt)

    tail = TailLogprobs(actor, ref, PAD, micro_batch_size=4, share_prompt=share_prompt)
    tail.add_group(0, gs[0])  # groups 0 and 2 finished during the tail; group 1 was the tail
    tail.add_group(4, gs[2])
    batch = build_batch(seqs, torch.zeros(len(seqs)), PAD)
    assert tail.fill(batch) == [2, 3]
    assert batch.old_logprobs is not None and batch.ref_logprobs is not None
    read = batch.loss_mask.bool()  # the targets any loss reads (padding aside)
    assert torch.allclose(batch.old_logprobs[read], want_old[read], atol=1e-5)
    assert torch.allclose(batch.ref_logprobs[read], want_ref[read], atol=1e-5)
    assert batch.old_logprobs.abs().sum() > 0 and not torch.allclose(want_old, want_ref)


def test_weights_changed_before_fill_are_not_what_the_group_saw() -> None:
    """Why the weights must not change during the rollout: a group computed under other weights
    differs from the pass after (the equality above is not vacuous)."""
    actor = build_model("qwen2-1m", seed=1)[0]
    gs = groups()
    seqs = [s for grp in gs for s in grp]
    tail = TailLogprobs(build_model("qwen2-1m", seed=3)[0], None, PAD, micro_batch_size=4)
    tail.add_group(0, gs[0])
    batch = build_batch(seqs, torch.zeros(len(seqs)), PAD)
    tail.fill(batch)
    want = compute_logprobs(actor, build_batch(seqs, torch.zeros(len(seqs)), PAD), 4)
    assert batch.ref_logprobs is None
    assert not torch.allclose(batch.old_logprobs[:2], want[:2], atol=1e-3)


def test_a_group_added_twice_is_an_error() -> None:
    tail = TailLogprobs(build_model("qwen2-1m", seed=1)[0], None, PAD)
    tail.add_group(0, groups()[0])
    with pytest.raises(ValueError, match="added twice"):
        tail.add_group(1, groups()[1])
