"""`rljob bench dispatch`: generation makespan of one step on a synthetic long-tail
workload, dispatched at random, by the skew-aware planner (ranker predictions)
and by an oracle that knows every output length (the shape of StreamRL Fig. 9)."""

from __future__ import annotations

from statistics import mean

from rljob.planner.dispatch import compare_dispatch
from rljob.infra.hardware import HARDWARE
from rljob.planner.profile import MODEL_PRESETS, GenProfile

SCENARIOS = [
    # (instances, prompts per step, group size, max decode batch)
    (2, 32, 8, 16),
    (4, 64, 8, 16),
    (8, 128, 8, 16),
    (4, 64, 8, 64),
]


def run(seeds: int = 5, progress=None) -> dict:
    """Each scenario's mean makespans; `progress(line)` hears of each one as it starts
    (a scenario plans every seed's step three ways: tens of seconds on 2 cores)."""
    gen = GenProfile.analytic(HARDWARE["ascend"], MODEL_PRESETS["qwen2.5-7b"], 4)
    rows = []
    for n, (instances, prompts, group, batch) in enumerate(SCENARIOS, 1):
        if progress:
            progress(f"scenario {n}/{len(SCENARIOS)}: {instances} instances, "
                     f"{prompts * group} samples, decode batch {batch}, {seeds} seeds")
        cs = [compare_dispatch(gen, instances, prompts, group, seed=s, batch=batch)
              for s in range(seeds)]
        rows.append({
            "instances": instances, "samples": prompts * group, "batch": batch,
            "random_s": mean(c.random_makespan for c in cs),
            "ours_s": mean(c.ours_makespan for c in cs),
            "oracle_s": mean(c.oracle_makespan for c in cs),
            "tail_recall": mean(c.tail_recall for c in cs),
            "long_tail_instances": [c.long_tail_instances for c in cs],
        })
    return {"model": "Qwen2.5-7B on 4 x Ascend 910B per instance (analytic PTL)",
            "seeds": seeds, "rows": rows}


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Generation makespan of one step, mean of {results['seeds']} seeds "
                        f"({results['model']})")
    for col in ("instances", "samples", "batch", "random s", "ours s", "oracle s",
                "ours vs random", "top-20% recall"):
        table.add_column(col, justify="right")
    for r in results["rows"]:
        table.add_row(str(r["instances"]), str(r["samples"]), str(r["batch"]),
                      f"{r['random_s']:.1f}", f"{r['ours_s']:.1f}", f"{r['oracle_s']:.1f}",
                      f"{r['random_s'] / r['ours_s']:.2f}x", f"{r['tail_recall']:.2f}")
    table.caption = (
        "instances: rollout instances sharing the step; samples: prompts × group size; "
        "batch: most sequences an instance decodes at once; random / ours / oracle s: the "
        "step's generation makespan when groups go to instances at random, by the "
        "skew-aware planner from predicted lengths (StreamRL Algorithm 2), and by an "
        "oracle that knows every length; top-20% recall: the share of the truly longest "
        "fifth that the predictions put in the long tail")
    Console(width=max(Console().width, 110)).print(table)
