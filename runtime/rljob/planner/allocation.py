"""Resource allocation between rollout and training (StreamRL Algorithm 1).

Single datacenter: n NPUs shared, rollout replicas of `npus_per_replica` each
plus a trainer of y NPUs with x + y ≤ n; minimise the step time max(Tgen,
Ttrain). Tgen falls with replicas and Ttrain with trainer NPUs, so as NPUs move
from rollout to training max(Tgen, Ttrain) first falls then rises: binary
search for the crossing instead of trying every split.

Cross datacenter: each side has its own pool; start from everything, then
shrink the faster side as far as it stays no slower than the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Allocation:
    rollout_replicas: int
    rollout_npus: int
    trainer_npus: int
    gen_seconds: float
    train_seconds: float

    @property
    def step_seconds(self) -> float:
        return max(self.gen_seconds, self.train_seconds)

    @property
    def npus(self) -> int:
        return self.rollout_npus + self.trainer_npus

    @property
    def idle_ratio(self) -> float:
        """Share of NPU-time idle in a step when the faster side waits for the slower."""
        step = self.step_seconds
        if not math.isfinite(step) or step <= 0:
            return 0.0
        busy = self.rollout_npus * self.gen_seconds + self.trainer_npus * self.train_seconds
        return 1 - busy / (self.npus * step)


TimeOf = Callable[[int], float]


def fewest_of(tgen: TimeOf) -> TimeOf:
    """Tgen of the best of 1..k replicas: non-increasing, as the searches need it. A
    replica count can generate slower than a smaller one (a runtime that splits each
    share into batches of whole groups may give each replica more, smaller batches);
    a plan then leaves the extra replicas out. Each count is computed once."""
    best: list[float] = []

    def at(k: int) -> float:
        while len(best) < k:
            t = tgen(len(best) + 1)
            best.append(min(t, best[-1]) if best else t)
        return best[k - 1] if k >= 1 else tgen(k)
    return at


def _make(replicas: int, npr: int, trainer: int, tgen: TimeOf, ttrain: TimeOf) -> Allocation:
    return Allocation(replicas, replicas * npr, trainer, tgen(replicas), ttrain(trainer))


def _better(a: Allocation, b: Allocation | None) -> bool:
    if b is None:
        return True
    if not math.isclose(a.step_seconds, b.step_seconds, rel_tol=1e-12):
        return a.step_seconds < b.step_seconds
    return a.npus < b.npus  # same step time: fewer NPUs


def allocate_single(npus: int, npus_per_replica: int, trainer_sizes: list[int],
                    tgen: TimeOf, ttrain: TimeOf) -> Allocation:
    """Best split of one pool. `trainer_sizes`: the trainer sizes allowed (e.g.
    multiples of tp × pp); `ttrain(npus)` non-increasing (`tgen` is made so:
    `fewest_of`)."""
    tgen = fewest_of(tgen)
    sizes = sorted(s for s in set(trainer_sizes) if 0 < s <= npus - npus_per_replica)
    if not sizes:
        raise ValueError(f"{npus} NPUs cannot hold one rollout replica ({npus_per_replica} NPUs) "
                         f"and the smallest trainer ({min(trainer_sizes, default=0)} NPUs)")

    def at(i: int) -> Allocation:
        y = sizes[i]
        return _make((npus - y) // npus_per_replica, npus_per_replica, y, tgen, ttrain)

    # first trainer size where generation is the slower side
    lo, hi = 0, len(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        a = at(mid)
        if a.gen_seconds >= a.train_seconds:
            hi = mid
        else:
            lo = mid + 1
    best = None
    for i in {lo - 1, lo}:
        if 0 <= i < len(sizes):
            best = at(i) if _better(at(i), best) else best
    # the same step time with the fewest NPUs: each side at the least that keeps up
    step = best.step_seconds * (1 + 1e-12)
    r = _first(1, best.rollout_replicas, lambda k: tgen(k) <= step)
    y = sizes[_first(0, sizes.index(best.trainer_npus), lambda i: ttrain(sizes[i]) <= step)]
    return _make(r, npus_per_replica, y, tgen, ttrain)


def _first(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """Smallest k in [lo, hi] with ok(k), given ok(hi) and ok monotone."""
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def allocate_brute_force(npus: int, npus_per_replica: int, trainer_sizes: list[int],
                         tgen: TimeOf, ttrain: TimeOf) -> Allocation:
    """Every (replicas, trainer) with replicas·npr + trainer ≤ npus (for testing)."""
    best = None
    for y in sorted(set(trainer_sizes)):
        for r in range(1, (npus - y) // npus_per_replica + 1):
            a = _make(r, npus_per_replica, y, tgen, ttrain)
            best = a if _better(a, best) else best
    if best is None:
        raise ValueError("no feasible split")
    return best


def allocate_cross(rollout_pool: int, trainer_pool: int, npus_per_replica: int,
                   trainer_sizes: list[int], tgen: TimeOf, ttrain: TimeOf) -> Allocation:
    """Two pools (e.g. two datacenters): use both fully, then shrink the faster side
    to the least resources that keep it no slower than the other."""
    tgen = fewest_of(tgen)
    sizes = sorted(s for s in set(trainer_sizes) if 0 < s <= trainer_pool)
    max_r = rollout_pool // npus_per_replica
    if not sizes or max_r < 1:
        raise ValueError("a pool is too small for one rollout replica or the smallest trainer")
    r, y = max_r, sizes[-1]
    g, t = tgen(r), ttrain(y)
    if g < t:  # generation is faster: fewest replicas with tgen <= t
        r = _first(1, r, lambda k: tgen(k) <= t)
    elif t < g:  # training is faster: smallest trainer with ttrain <= g
        y = sizes[_first(0, len(sizes) - 1, lambda i: ttrain(sizes[i]) <= g)]
    return _make(r, npus_per_replica, y, tgen, ttrain)
