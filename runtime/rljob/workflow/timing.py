"""Tgen and Ttrain of a step, as StreamRL's gap δ = Tgen − Ttrain means them: the
time each side needs for one step on its own.

Tgen is the time the rollouts spent generating the step: the union of its groups'
generation spans [started_at, finished_at] over every replica. What a step waits
before the first replica starts on it (the release rule, the previous step's
groups still generating in async mode) is queueing, not generation: counting it,
as the span from release to the last finished group did, overstates δ by that
wait and makes the autoscaler add replicas that would only queue more.

Ttrain is the time the trainer computed on the step: the union of its micro-step
and optimizer spans, without the waits for samples between them.

    generation_seconds([(0, 4), (1, 5), (7, 8)])  == 6.0   # two replicas, then one
    generation_queue_seconds([0, 0], [(3, 5)])    == 3.0   # released at 0, started at 3
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of the intervals [start, end] (empty ones count 0)."""
    total, reach = 0.0, None
    for start, end in sorted((s, e) for s, e in spans if e > s):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def generation_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Tgen: (started_at, finished_at) of the step's groups → seconds generating."""
    return busy_seconds(spans)


def training_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Ttrain: the step's compute spans (micro-steps, optimizer) → seconds computing."""
    return busy_seconds(spans)


def generation_queue_seconds(released: Sequence[float],
                             spans: Sequence[tuple[float, float]]) -> float:
    """How long the step's prompts waited from their release until a replica began
    on them (reported beside Tgen, not in it)."""
    if not released or not spans:
        return 0.0
    return max(0.0, min(s for s, _ in spans) - min(released))


# what a profile record keeps of its steps: enough for medians and the length tail,
# a few kilobytes on the wire
RECORD_CALLS = 64
RECORD_LENGTHS = 512


def spread(values: list, most: int) -> list:
    """At most `most` of `values`, evenly spaced over them, both ends kept (pure)."""
    if len(values) <= most:
        return list(values)
    return [values[round(i * (len(values) - 1) / (most - 1))] for i in range(most)]


def profile_record(records: list[dict]) -> dict:
    """The steps' records as one, bounded in size (`RECORD_CALLS` engine calls,
    `RECORD_LENGTHS` response lengths, both evenly over the steps): what the trainer
    reports to the controller for the operator (pure)."""
    calls = [c for r in records for c in r.get("gen_calls", [])]
    lengths = sorted(n for r in records for n in r.get("response_lengths", []))
    prompts = [r["prompt_tokens"] for r in records if "prompt_tokens" in r]
    return {"steps": [records[0]["step"], records[-1]["step"]] if records else [],
            "gen_calls": [{k: (round(v, 6) if isinstance(v, float) else v)
                           for k, v in c.items()} for c in spread(calls, RECORD_CALLS)],
            "train_tokens": sum(r.get("train_tokens", 0) for r in records),
            "train_seconds": round(sum(r.get("train_seconds", 0.0) for r in records), 6),
            "response_lengths": spread(lengths, RECORD_LENGTHS),
            "prompt_tokens": statistics.fmean(prompts) if prompts else 0.0}
