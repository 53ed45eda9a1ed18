"""`rljob bench overhead`: what the orchestration costs a step, with the compute
taken out. A model so small that generating and training take about nothing
(one layer of width 16, the character vocabulary, 4 new tokens) runs 256 samples
a step (16 prompts × 16) through `rljob run` in sync, periodic and async(1):
every claim, put, write and ack through TransferQueue, every weight publication
and fetch, the driver's release and the version waits are there as in a real
job, and what a step costs beyond its compute is theirs.

Printed per mode: the steady step's milliseconds, its compute (the timeline's
generate, reference, train and optimizer spans a step: added up in sync, where
they run one after the other, the busier side's in the overlapping modes) and
the rest, the orchestration's milliseconds a step; and the step's milliseconds
during which no worker computes at all (every one waits on a claim, put, write,
weights or the release): the orchestration on the step's path, where the
overlapping modes' compute does not hide it (in periodic one side's compute waits
for the other's: the rollout's last batch, then the trainer's). And each process's
CPU milliseconds a step (all its threads, read from /proc while the job runs):
where the step's wall time is its hops' latency, not the machine's CPU, they say
which process's work grew, and they swing less than wall time on a shared machine.
CI's machine can run it, so a fixed cost that creeps in shows without an
accelerator (where a step is short, such costs are most of it)."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from rljob.api import RLJob

from .peer import peer_job
from .workflow import measure, mode_dir, mode_name

MODES = (("sync", None), ("periodic", None), ("async", 1))
NANO = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 100,
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "torch_dtype": "float32"}
COMPUTE = ("generate", "reference", "train", "optimizer")


def overhead_job(mode: str, k: int | None, steps: int, model: Path, prompts: int = 16,
                 group: int = 16, max_new_tokens: int = 4) -> RLJob:
    """`peer.peer_job` on CPU with the nano model: the whole step one micro-batch."""
    return peer_job(mode, k, steps, model, "cpu", prompts, group, max_new_tokens,
                    micro_batch=prompts * group, lr=1e-4, name="overhead")


def compute_ms(mode: str, parts: dict[str, dict[str, float]]) -> float:
    """Compute milliseconds a step (pure): each role's compute spans a step, added up
    in sync, the busier role's where the mode overlaps them."""
    per_role = [sum(kinds.get(k, 0.0) for k in COMPUTE) for kinds in parts.values()]
    if not per_role:
        return 0.0
    return 1e3 * (sum(per_role) if mode == "sync" else max(per_role))


def run(steps: int = 30, warmup: int = 5, rounds: int = 1, keep: Path | None = None,
        modes: tuple[str, ...] = ("sync", "periodic", "async")) -> dict:
    unknown = sorted(set(modes) - {m for m, _ in MODES})
    if unknown or not modes:
        raise ValueError(f"modes {', '.join(unknown) or 'none'}: use sync, periodic, async")
    per_round: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="rljob-bench-overhead-") as tmp:
        root = keep or Path(tmp)
        model = root / "nano"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(NANO))
        for r in range(rounds):
            res = {}
            for mode, k in [(m, k) for m, k in MODES if m in modes]:
                m = measure(overhead_job(mode, k, steps, model),
                            root / f"round-{r}" / mode_dir(mode, k), warmup)
                step = 1e3 * m["step_seconds"]
                comp = compute_ms(mode, m["step_parts"])
                res[mode_name(mode, k)] = {"step_ms": step, "compute_ms": comp,
                             "orchestration_ms": step - comp,
                             "idle_ms": step - 1e3 * m["busy_seconds"],
                             "step_parts": m["step_parts"], "steps": m["steps"],
                             "cpu_ms": {w: 1e3 * v for w, v in m["cpu_seconds"].items()}}
            per_round.append(res)
    figures = {name: {key: statistics.median(r[name][key] for r in per_round)
                      for key in ("step_ms", "compute_ms", "orchestration_ms", "idle_ms")}
               for name in per_round[0]}
    for name in figures:
        figures[name]["cpu_ms"] = {
            worker: statistics.median(r[name]["cpu_ms"][worker] for r in per_round
                                      if worker in r[name]["cpu_ms"])
            # the controller first, then the workers by name
            for worker in sorted({w for r in per_round for w in r[name]["cpu_ms"]},
                                 key=lambda w: (w != "transferqueue", w))}
        figures[name]["step_parts_ms"] = {
            role: {kind: 1e3 * sec for kind, sec in sorted(kinds.items())}
            for role, kinds in per_round[-1][name]["step_parts"].items()}
    return {"steps": steps, "warmup": warmup, "rounds": rounds,
            "samples_per_step": 256, "modes": figures}


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"orchestration a step: a nano model, {results['samples_per_step']} "
                        f"samples a step, steps {results['warmup'] + 1}-{results['steps']} "
                        f"(medians of {results['rounds']} round(s))")
    for col in ("mode", "step ms", "compute ms", "orchestration ms", "no compute ms"):
        table.add_column(col, justify="right")
    for name, m in results["modes"].items():
        table.add_row(name, f"{m['step_ms']:.1f}", f"{m['compute_ms']:.1f}",
                      f"{m['orchestration_ms']:.1f}", f"{m['idle_ms']:.1f}")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    for name, m in results["modes"].items():
        console.print(f"{name}, ms a step: " + "; ".join(
            f"{role} " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items())
            for role, kinds in sorted(m["step_parts_ms"].items())))
    for name, m in results["modes"].items():
        cpu = m.get("cpu_ms", {})
        console.print(f"{name}, CPU ms a step: " + ", ".join(
            f"{'controller' if w == 'transferqueue' else w} {v:.1f}" for w, v in cpu.items())
            + f"; all {sum(cpu.values()):.1f} in a {m['step_ms']:.1f} ms step")
    console.print("compute: the generate, reference, train and optimizer spans a step "
                  "(added up in sync, the busier side's in the overlapping modes); "
                  "orchestration: the rest of the step; no compute: the step's time "
                  "during which no worker computes; CPU: each process's, all its "
                  "threads (/proc)")
