"""Pure sampling helpers used by claim policies."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def balance_over_ranks(lengths: Sequence[int], k: int, equal_size: bool = True) -> list[int]:
    """Assign items to `k` ranks so the sums of `lengths` are balanced.

    Karmarkar–Karp largest differencing for k-way partitioning: every item
    starts as a k-tuple of subsets (with equal_size, items come in sorted
    chunks of k, one per subset, so every rank gets the same number of items
    when len(lengths) is a multiple of k); the two tuples with the largest
    spread are merged, pairing the heaviest subset of one with the lightest of
    the other, until one tuple remains. Returns the rank of each item.
    """
    n = len(lengths)
    if k <= 1 or n == 0:
        return [0] * n
    order = sorted(range(n), key=lambda i: lengths[i], reverse=True)
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    tie = 0
    if equal_size:
        for start in range(0, n, k):
            chunk = order[start:start + k]
            subsets = [(lengths[i], [i]) for i in chunk] + [(0, [])] * (k - len(chunk))
            subsets.sort(key=lambda s: s[0], reverse=True)
            heapq.heappush(heap, (-(subsets[0][0] - subsets[-1][0]), tie, subsets))
            tie += 1
    else:
        for i in order:
            subsets = [(lengths[i], [i])] + [(0, [])] * (k - 1)
            heapq.heappush(heap, (-lengths[i], tie, subsets))
            tie += 1
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))]
        merged.sort(key=lambda s: s[0], reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    ranks = [0] * n
    for rank, (_, items) in enumerate(heap[0][2]):
        for i in items:
            ranks[i] = rank
    return ranks


def rank_sums(lengths: Sequence[int], ranks: Sequence[int], k: int) -> list[int]:
    sums = [0] * k
    for length, r in zip(lengths, ranks):
        sums[r] += length
    return sums
