"""`rljob bench optimisations`: the papers' mechanisms on the tasks that show them
(examples/longtail.yaml: a three-digit number repeated once or 10-13 times, output
lengths an order of magnitude apart; examples/longprompt.yaml: long prompts, short
answers), each off and on, side by side in one run.

- **Skew-aware dispatch** (StreamRL §5, `rollout.dispatch`): periodic mode, one
  replica generating a step in four batches. fifo claims groups in release
  order, so most batches hold a long group and last as long as it; skew_aware
  claims the longest predicted groups first (the driver's online ranker), so the
  long ones share a batch. An oracle that knows each output length (the answer's)
  bounds what a ranker can give: the Tgen ratio to it is the makespan against the
  oracle.
- **Micro-batch order** (`trainer.microBatchOrder`): periodic, skew-aware. In slot
  order the trainer waits for the step's first slots, which skew-aware dispatch
  may generate last; in arrival order (auto's choice with skew-aware dispatch) it
  trains each batch's groups as they come.
- **StreamRL's ablation**, cumulative: sync, + skew-aware dispatch, + streaming
  (periodic), + asynchrony (async, staleness 1).
- **Packing** (`trainer.packing`) on examples/longprompt.yaml (36 characters of
  context before a short sum, 8 samples a prompt), sync mode so Ttrain stands
  alone: right-padded rows, packed sequences, shared-prompt attention.
- **Token-balanced data-parallel split** (`trainer.dataParallelSplit`): two trainer
  ranks on the long-tailed task, packed, sync: round robin against balanced token
  sums.

Every run of a task starts from the same warmed-up model (one supervised warm-up
per task, saved once), so the runs differ in the mechanism only. The configurations run in rounds
(each round all of them, one after the other) and the figures are medians over
the rounds: compare the figures of one run of the benchmark, not of two machines.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from rljob.api import RLJob
from rljob.local import LocalRun

from .examples import example, tiny_model

TASKS = {"longtail": "longtail.yaml", "longprompt": "longprompt.yaml"}  # in the examples


def config(task: str, workflow: dict, rollout: dict | None = None,
           trainer: dict | None = None, oracle: bool = False) -> dict:
    return {"task": task, "workflow": workflow, "rollout": rollout or {},
            "trainer": trainer or {}, "oracle": oracle}


SKEW = {"dispatch": "skew_aware"}
ASYNC1 = {"mode": "async", "maxStaleness": 1, "weightSync": "async"}
CONFIGS = {
    "sync, fifo": config("longtail", {"mode": "sync"}, {"dispatch": "fifo"}),
    "sync, skew-aware": config("longtail", {"mode": "sync"}, SKEW),
    "periodic, fifo": config("longtail", {"mode": "periodic"}, {"dispatch": "fifo"}),
    # microBatchOrder auto: arrival with skew-aware dispatch
    "periodic, skew-aware": config("longtail", {"mode": "periodic"}, SKEW),
    "periodic, oracle": config("longtail", {"mode": "periodic"}, SKEW, oracle=True),
    "periodic, skew-aware, slot order": config("longtail", {"mode": "periodic"}, SKEW,
                                               {"microBatchOrder": "slot"}),
    "async(1), skew-aware": config("longtail", ASYNC1, SKEW),
    # two replicas: one claims the predicted long tail first, the other the short end
    "periodic, 2 replicas, fifo": config("longtail", {"mode": "periodic"},
                                         {"dispatch": "fifo", "replicas": 2}),
    "periodic, 2 replicas, skew-aware": config("longtail", {"mode": "periodic"},
                                               {**SKEW, "replicas": 2}),
    "sync, fifo, packed": config("longtail", {"mode": "sync"}, {"dispatch": "fifo"},
                                 {"packing": "sequences"}),
    # the trainer's layouts on long prompts (sync: Ttrain alone)
    "long prompts, padded": config("longprompt", {"mode": "sync"}, {}, {"packing": "none"}),
    "long prompts, packed": config("longprompt", {"mode": "sync"}, {},
                                   {"packing": "sequences"}),
    "long prompts, shared prompt": config("longprompt", {"mode": "sync"}, {},
                                          {"packing": "shared_prompt"}),
    # two trainer ranks on mixed lengths, packed (a rank's cost is its tokens)
    "2 ranks, round robin": config("longtail", {"mode": "sync"}, {"dispatch": "fifo"},
                                   {"npusPerNode": 2, "packing": "sequences",
                                    "dataParallelSplit": "round_robin"}),
    "2 ranks, token balanced": config("longtail", {"mode": "sync"}, {"dispatch": "fifo"},
                                      {"npusPerNode": 2, "packing": "sequences",
                                       "dataParallelSplit": "token_balanced"}),
}
# (mechanism, off, on): the ratios printed
COMPARISONS = (
    ("skew-aware dispatch (periodic)", "periodic, fifo", "periodic, skew-aware"),
    ("  its ranker vs the oracle", "periodic, oracle", "periodic, skew-aware"),
    ("arrival-order micro-batches", "periodic, skew-aware, slot order", "periodic, skew-aware"),
    ("skew-aware dispatch, 2 replicas", "periodic, 2 replicas, fifo",
     "periodic, 2 replicas, skew-aware"),
    ("ablation: + skew-aware (sync)", "sync, fifo", "sync, skew-aware"),
    ("ablation: + streaming (periodic)", "sync, skew-aware", "periodic, skew-aware"),
    ("ablation: + async", "periodic, skew-aware", "async(1), skew-aware"),
    ("sequence packing (mixed lengths)", "sync, fifo", "sync, fifo, packed"),
    ("sequence packing (even lengths)", "long prompts, padded", "long prompts, packed"),
    ("shared-prompt attention", "long prompts, padded", "long prompts, shared prompt"),
    ("token-balanced DP split", "2 ranks, round robin", "2 ranks, token balanced"),
)


def base_doc(task: str) -> dict:
    doc = yaml.safe_load(example(TASKS[task]).read_text())
    spec = doc["spec"]
    spec["model"]["path"] = tiny_model()
    spec["dataset"]["path"] = str(example("data/" + Path(spec["dataset"]["path"]).name))
    spec["trainer"] = {"checkpointEvery": 10_000}
    return doc


def warm_model(task: str, root: Path) -> Path:
    """The task's supervised warm-up, once: its model directory."""
    doc = base_doc(task)
    doc["metadata"]["name"] = f"warm-{task}"
    doc["spec"]["rollout"]["dispatch"] = "fifo"
    run = LocalRun(RLJob.model_validate(doc), root / f"warm-{task}", max_steps=1)
    run.run_to_end()
    return root / f"warm-{task}" / "final"


def config_job(name: str, model: Path, steps: int) -> RLJob:
    c = CONFIGS[name]
    doc = base_doc(c["task"])
    spec = doc["spec"]
    doc["metadata"]["name"] = "opt-" + "".join(ch if ch.isalnum() else "-" for ch in name)[:40]
    spec["model"].update({"path": str(model), "warmupSteps": 0})
    spec["workflow"] = dict(c["workflow"])
    spec["rollout"].update(c["rollout"])
    spec["trainer"].update(c["trainer"])
    if c["oracle"]:  # lengths known: the answer's (rljob_bench/oracle.py)
        spec["rollout"]["lengthPredictor"] = "rljob_bench.oracle:AnswerLength"
    spec["algorithm"]["maxSteps"] = steps
    return RLJob.model_validate(doc)


def run_config(name: str, model: Path, steps: int, root: Path, skip: int = 2) -> dict:
    run = LocalRun(config_job(name, model, steps), root)
    run.run_to_end()
    ms = run.metrics()
    steady = ms[skip:]
    t0, t1 = ms[skip - 1]["time"], ms[-1]["time"]
    return {
        "steps": len(steady),
        "step_seconds": (t1 - t0) / len(steady),
        "tokens_per_s": sum(m["tokens"] for m in steady) / (t1 - t0),
        "gen_seconds": statistics.mean(m["gen_seconds"] for m in steady),
        "train_seconds": statistics.mean(m["train_seconds"] for m in steady),
        "response_length": statistics.mean(m["response_length"] for m in steady),
        "reward": statistics.mean(m["reward_mean"] for m in steady),
    }


def run(steps: int = 12, rounds: int = 2, keep: Path | None = None,
        configs: list[str] | None = None) -> dict:
    names = configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}: use {list(CONFIGS)}")
    per_round: list[dict[str, dict]] = []
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="rljob-bench-opt-") as tmp:
        root = keep or Path(tmp)
        models = {task: warm_model(task, root)
                  for task in sorted({CONFIGS[n]["task"] for n in names})}
        for r in range(rounds):
            per_round.append({n: run_config(n, models[CONFIGS[n]["task"]], steps,
                                            root / f"round-{r}" / str(i))
                              for i, n in enumerate(names)})
    merged = {n: {k: statistics.median(res[n][k] for res in per_round)
                  for k in per_round[0][n]} for n in names}
    ratios = []
    for mechanism, off, on in COMPARISONS:
        if off in names and on in names:
            ratios.append({
                "mechanism": mechanism, "off": off, "on": on,
                # per round, then the median: runs made next to each other
                "tokens_per_s": statistics.median(res[on]["tokens_per_s"] / res[off]["tokens_per_s"]
                                                  for res in per_round),
                "step_speedup": statistics.median(res[off]["step_seconds"] / res[on]["step_seconds"]
                                                  for res in per_round),
                "gen_speedup": statistics.median(res[off]["gen_seconds"] / res[on]["gen_seconds"]
                                                 for res in per_round),
            })
    return {"steps": steps, "rounds": rounds, "seconds": time.time() - t_start,
            "configs": merged, "ratios": ratios}


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    table = Table(title=f"examples/longtail.yaml and longprompt.yaml from one warmed-up model "
                        f"each, steady state of {results['steps']} steps; medians of "
                        f"{results['rounds']} rounds")
    for col in ("configuration", "step s", "tokens/s", "Tgen s", "Ttrain s",
                "response tokens", "reward"):
        table.add_column(col, justify="right")
    for name, r in results["configs"].items():
        table.add_row(name, f"{r['step_seconds']:.2f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['gen_seconds']:.2f}", f"{r['train_seconds']:.2f}",
                      f"{r['response_length']:.1f}", f"{r['reward']:.2f}")
    console.print(table)
    ratios = Table(title="each mechanism on over off (per round, median): >1 is a gain")
    for col in ("mechanism", "off", "on", "steps/s", "tokens/s", "Tgen (makespan)"):
        ratios.add_column(col, justify="right")
    for r in results["ratios"]:
        ratios.add_row(r["mechanism"], r["off"], r["on"], f"{r['step_speedup']:.2f}x",
                       f"{r['tokens_per_s']:.2f}x", f"{r['gen_speedup']:.2f}x")
    console.print(ratios)
    console.print(f"{results['seconds']:.0f} s in all")


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
