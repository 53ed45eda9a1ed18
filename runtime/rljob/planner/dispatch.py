"""Skew-aware dispatch of prompts to rollout instances (StreamRL §5).

A few very long generations decide when a step's rollout ends. Three parts:
- `LengthRanker`: an online model of output length from the prompt (hashed
  character n-grams + word features, AdaGrad regression on log length) with a
  per-prompt memory (RL revisits prompts every epoch and GRPO samples each G
  times). Judged like StreamRL Table 4: recall of the true top-20 % tail.
- `plan_dispatch` (Algorithm 2): the predicted long tail gets k instances of its
  own, so it decodes at a small batch (lower per-token latency) while the
  regular prompts share the rest; k is the one with the smallest predicted
  makespan. Within an instance, longest first (LPT).
- `simulate_instance`: makespan of one continuously batching instance, used to
  compare random dispatch, ours and an oracle that knows the lengths.

In TransferQueue the plan becomes claim policies: the driver writes predicted
lengths as row lengths, long-tail replicas claim `longest_first`, the others
`shortest_first` (see `claim_policy_for`). What a running job uses of this (the
ranker, the claim policy of each replica) is the workflow's: workflow/dispatch.py.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..workflow.dispatch import LengthRanker
from .profile import GenProfile


def tail_recall(predicted: Sequence[float], actual: Sequence[float], top: float = 0.2) -> float:
    """Fraction of the true top-`top` longest samples that the prediction ranks there."""
    n = len(actual)
    k = max(1, int(round(n * top)))
    true_tail = set(np.argsort(actual)[-k:].tolist())
    pred_tail = set(np.argsort(predicted)[-k:].tolist())
    return len(true_tail & pred_tail) / k


# ---- one instance ---------------------------------------------------------------------
def simulate_instance(lengths: Sequence[int], gen: GenProfile, batch: int | None = None) -> float:
    """Seconds for one continuously batching instance to generate `lengths` in the
    given order: up to `batch` sequences decode together, each step takes
    PTL(active sequences), a finished sequence's slot is refilled at once."""
    bs = min(batch or gen.max_batch_size, gen.max_batch_size)
    queue = list(lengths)
    qi = 0
    active: list[int] = []  # heap of the decode step at which each sequence finishes
    step = 0
    t = 0.0
    while qi < len(queue) or active:
        while qi < len(queue) and len(active) < bs:
            heapq.heappush(active, step + max(int(queue[qi]), 1))
            qi += 1
        nxt = active[0]
        t += (nxt - step) * gen.ptl(len(active))
        step = nxt
        while active and active[0] == step:
            heapq.heappop(active)
    return t


def makespan(assignment: Sequence[Sequence[int]], lengths: Sequence[int], gen: GenProfile,
             batch: int | None = None) -> float:
    """Generation makespan of instances each running its list of sample ids in order."""
    return max((simulate_instance([lengths[i] for i in ids], gen, batch) for ids in assignment),
               default=0.0)


# ---- dispatch strategies ------------------------------------------------------------
def random_dispatch(n: int, instances: int, seed: int = 0) -> list[list[int]]:
    ids = list(range(n))
    random.Random(seed).shuffle(ids)
    return [ids[k::instances] for k in range(instances)]


def lpt_dispatch(ids: Sequence[int], predicted: Sequence[float], instances: int) -> list[list[int]]:
    """Longest first to the instance with the least predicted tokens; each instance
    then runs its samples longest first."""
    heap = [(0.0, k) for k in range(instances)]
    out: list[list[int]] = [[] for _ in range(instances)]
    for i in sorted(ids, key=lambda i: predicted[i], reverse=True):
        load, k = heapq.heappop(heap)
        out[k].append(i)
        heapq.heappush(heap, (load + predicted[i], k))
    return out


@dataclass(frozen=True)
class DispatchPlan:
    long_tail_instances: int  # k: instances that serve the predicted long tail
    threshold: float  # predicted length at or above which a sample is long-tail
    assignment: list[list[int]]  # sample ids per instance, in run order
    predicted_makespan: float


def plan_dispatch(predicted: Sequence[float], instances: int, gen: GenProfile,
                  batch: int | None = None, tail: float = 0.2) -> DispatchPlan:
    """Algorithm 2: choose k (0 = no split) minimising the predicted makespan."""
    n = len(predicted)
    pred = [max(1, int(round(p))) for p in predicted]
    order = sorted(range(n), key=lambda i: pred[i], reverse=True)
    n_tail = max(1, int(round(n * tail)))
    long_ids, regular_ids = order[:n_tail], order[n_tail:]
    best = None
    for k in range(0, instances):
        if k == 0:
            assignment = lpt_dispatch(order, pred, instances)
            threshold = math.inf
        else:
            assignment = (lpt_dispatch(long_ids, pred, k)
                          + lpt_dispatch(regular_ids, pred, instances - k))
            threshold = float(pred[long_ids[-1]])
        ms = makespan(assignment, pred, gen, batch)
        if best is None or ms < best.predicted_makespan:
            best = DispatchPlan(k, threshold, assignment, ms)
    return best


def claim_policy_for(replica: int, plan: DispatchPlan) -> str:
    """The TransferQueue claim policy of a rollout replica under `plan`."""
    if plan.long_tail_instances and replica < plan.long_tail_instances:
        return "longest_first"
    return "shortest_first" if plan.long_tail_instances else "longest_first"


# ---- a synthetic long-tail workload --------------------------------------------------------
TEMPLATES = [
    # (template, base log-length, log-length per unit of difficulty)
    ("Compute {a} + {b}.", 3.0, 0.05),
    ("What is {a} times {b}? Answer with a number.", 3.3, 0.05),
    ("Sort these numbers: {nums}.", 3.6, 0.12),
    ("Solve step by step: a train leaves at {a} km/h and another at {b} km/h; "
     "when do they meet over {c} km?", 5.2, 0.10),
    ("Prove that the sum of the first {a} odd numbers is a square, explaining every step.",
     6.4, 0.08),
    ("Write a detailed derivation of the closed form for a recurrence with {k} terms: {nums}.",
     6.8, 0.15),
]


def synthetic_prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        t = rng.choices(range(len(TEMPLATES)), weights=[30, 25, 15, 15, 10, 5])[0]
        k = rng.randint(2, 9)
        nums = ", ".join(str(rng.randint(1, 99)) for _ in range(k))
        out.append(TEMPLATES[t][0].format(a=rng.randint(2, 99), b=rng.randint(2, 99),
                                          c=rng.randint(50, 900), k=k, nums=nums))
    return out


def synthetic_lengths(prompts: Sequence[str], seed: int = 0, max_tokens: int = 4096,
                      sigma: float = 0.45) -> list[int]:
    """Output lengths with a long tail: log-normal around a per-template base that
    grows with the prompt's difficulty (number of listed items)."""
    rng = random.Random(seed)
    out = []
    for p in prompts:
        for template, base, per_unit in TEMPLATES:
            if p.startswith(template.split("{")[0]):
                break
        difficulty = p.count(",") + sum(c.isdigit() for c in p) / 4
        mu = base + per_unit * difficulty
        out.append(int(min(max_tokens, max(4, math.exp(rng.gauss(mu, sigma))))))
    return out


@dataclass(frozen=True)
class DispatchComparison:
    random_makespan: float
    ours_makespan: float
    oracle_makespan: float
    long_tail_instances: int
    tail_recall: float


def compare_dispatch(gen: GenProfile, instances: int = 4, prompts_per_step: int = 64,
                     group_size: int = 4, history_steps: int = 12, seed: int = 0,
                     batch: int | None = None) -> DispatchComparison:
    """Train the ranker on `history_steps` earlier steps of the synthetic workload,
    then dispatch one new step three ways and simulate each with the true lengths."""
    ranker = LengthRanker()
    pool = synthetic_prompts(prompts_per_step * 4, seed)  # a dataset revisited over epochs
    rng = random.Random(seed + 1)
    for step in range(history_steps):
        batch_prompts = [p for p in rng.sample(pool, prompts_per_step) for _ in range(group_size)]
        ranker.observe(batch_prompts, synthetic_lengths(batch_prompts, seed + 100 + step))
    step_prompts = [p for p in rng.sample(pool, prompts_per_step) for _ in range(group_size)]
    lengths = synthetic_lengths(step_prompts, seed + 999)
    predicted = ranker.predict(step_prompts)
    ours = plan_dispatch(predicted, instances, gen, batch)
    oracle = plan_dispatch([float(x) for x in lengths], instances, gen, batch)
    return DispatchComparison(
        random_makespan=makespan(random_dispatch(len(lengths), instances, seed), lengths, gen,
                                 batch),
        ours_makespan=makespan(ours.assignment, lengths, gen, batch),
        oracle_makespan=makespan(oracle.assignment, lengths, gen, batch),
        long_tail_instances=ours.long_tail_instances,
        tail_recall=tail_recall(predicted, lengths),
    )
