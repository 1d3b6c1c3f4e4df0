"""How the shared-prompt forward groups a micro-batch's responses into passes
(:mod:`jigsawrl.engine.shared_prompt`), in pure Python: the engine runs these passes, and the
cost model (``CostParams.train_shares_prompt``) counts the positions they compute.
"""

from __future__ import annotations

import math

BUCKET_OVERHEAD_TOKENS = 32  # what one more forward pass costs, in padded positions (guess)


def length_buckets(lengths: list[int], overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[list[int]]:
    """Rows grouped into runs of similar length, minimising padded positions plus ``overhead``
    per group (an exact dynamic programme over the rows sorted by length)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    lens = [max(lengths[i], 1) for i in order]
    n = len(lens)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 in one group, padded to lens[j-1]
            cost = best[i] + (j - i) * lens[j - 1] + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups[::-1]
