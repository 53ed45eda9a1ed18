"""`rljob bench peer`: one GRPO job run three ways, side by side on one device:
`rljob run` in sync and in async(1), and TRL's `GRPOTrainer` configured for the
same job as `bench workflow --peer trl` configures it (`peer_trl.FAIR`). Printed:
generated tokens/s over the steady state, step seconds, Tgen and Ttrain, async's
overlap bound (`planner.cost.overlap_bound`, from the sync run's own Tgen, Ttrain
and reference seconds) and the fraction of it reached, each of ours over TRL's,
and where a step goes: each role's seconds a step in each kind of timeline span,
beside the step's seconds (what no span covers is waiting: for samples, for
weights, or the orchestration between them).

The job: prompts × group samples a step, up to `max_new_tokens` new tokens, one
rollout replica and one trainer rank (on one accelerator they share it: weights
go over gRPC, since a collective refuses two ranks on one device), lr 1e-6, the
`arith_partial` reward, the character vocabulary on both sides. Model `tiny` (the
examples' tiny Qwen2) or `qwen2-0.5b` (Qwen2-0.5B's layers: 24 of width 896, 14
heads, 2 KV heads, MLP 4864; the character vocabulary instead of its 151,936
tokens), random init; float32 masters, bfloat16 passes on an accelerator (both
sides). Generation: the hf engine for ours, `generate` for TRL's (vLLM on neither
side)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from rljob.api import RLJob
from rljob.local import write_plots
from rljob.planner.cost import bound_times, overlap_bound
from rljob.workflow.tasks import reference_task

from .examples import example
from .trainer import MODELS, model_config
from .workflow import measure, mode_dir, mode_name

MODES = (("sync", None), ("async", 1))


def model_dir(model: str, root: Path) -> Path:
    """A config directory for `random:` (the tiny model's own; else written)."""
    if model == "tiny":
        return example("models/tiny-qwen2")
    path = root / model
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model_config(model), indent=1))
    return path


def peer_job(mode: str, k: int | None, steps: int, model: Path, accelerator: str,
             prompts: int, group: int, max_new_tokens: int, micro_batch: int,
             lr: float = 1e-6, name: str = "peer") -> RLJob:
    """The job (pure but for validation): `mode` with `maxStaleness` k, one rollout
    replica of the hf engine and one trainer rank, a random-init model from the
    config directory `model`, the character vocabulary, `arith_partial`."""
    workflow: dict = {"mode": mode, "weightSync": "async" if mode == "async" else "sync"}
    if k is not None:
        workflow["maxStaleness"] = k
    if accelerator != "cpu":  # one device: trainer and rollout share it
        workflow["weightTransport"] = "grpc"
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
        "metadata": {"name": f"{name}-{mode}"},
        "spec": {
            "model": {"path": f"random:{model}", "tokenizer": "builtin:char",
                      "dtype": "float32" if accelerator == "cpu" else "bfloat16"},
            "dataset": {"path": str(example("data/arith.jsonl"))},
            "algorithm": {"name": "grpo", "groupSize": group, "promptsPerStep": prompts,
                          "samplesPerMicroBatch": micro_batch, "lr": lr,
                          "maxSteps": steps},
            "workflow": workflow,
            "rollout": {"replicas": 1, "maxReplicas": 1, "engine": "hf",
                        "maxNewTokens": max_new_tokens},
            "trainer": {"npusPerNode": 1, "checkpointEvery": 10_000},
            "reward": {"name": "arith_partial"},
            "accelerator": {"type": accelerator},
        }})


def run(accelerator: str = "cpu", model: str = "tiny", steps: int = 10, warmup: int = 3,
        prompts: int = 16, group: int = 8, max_new_tokens: int = 22, micro_batch: int = 16,
        keep: Path | None = None, peer: bool = True) -> dict:
    if model not in MODELS:
        raise SystemExit(f"--model {model}: use one of {', '.join(MODELS)}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-peer-") as tmp:
        root = keep or Path(tmp)
        config = model_dir(model, root)

        def job(mode: str, k: int | None) -> RLJob:
            return peer_job(mode, k, steps, config, accelerator, prompts, group,
                            max_new_tokens, micro_batch)

        for mode, k in MODES:
            name = mode_name(mode, k)
            run_dir = root / mode_dir(mode, k)
            results[name] = measure(job(mode, k), run_dir, warmup)
            if keep is not None:  # kept: its timeline and reward drawn, as `rljob run` does
                write_plots(run_dir)
            # each run's figures as soon as it ends (a later run's failure keeps them)
            print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
        trl = None
        if peer:
            from .peer_trl import run_trl

            trl = run_trl(job("sync", None), steps, warmup_steps=warmup)
    sync = results["sync"]
    t_train, t_either = bound_times(sync["train_seconds"], sync["reference_seconds"],
                                    reference_task(job("sync", None).spec))
    for name, r in results.items():
        r["bound"] = overlap_bound(name.split("(")[0], sync["gen_seconds"], t_train,
                                   t_either=t_either)
        r["speedup"] = r["tokens_per_s"] / sync["tokens_per_s"]
        r["of_bound"] = r["speedup"] / r["bound"]
        if trl is not None:
            r["vs_trl"] = r["tokens_per_s"] / trl["tokens_per_s"]
    return {"accelerator": accelerator, "model": model, "steps": steps, "warmup": warmup,
            "prompts": prompts, "group": group, "max_new_tokens": max_new_tokens,
            "micro_batch": micro_batch, "modes": results, "trl": trl}


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    trl = results["trl"]
    table = Table(title=f"one GRPO job on one {results['accelerator']} device, model "
                        f"{results['model']}: {results['prompts']} prompts × {results['group']}"
                        f" samples a step, up to {results['max_new_tokens']} new tokens, "
                        f"steps {results['warmup'] + 1}-{results['steps']} measured")
    for col in ("run", "tokens/s", "vs TRL", "vs sync", "bound", "of bound", "step s",
                "Tgen s", "Ttrain s", "ref s", "max staleness"):
        table.add_column(col, justify="right")
    for name, r in results["modes"].items():
        table.add_row(f"rljob {name}", f"{r['tokens_per_s']:.0f}",
                      f"{r['vs_trl']:.2f}x" if "vs_trl" in r else "-",
                      f"{r['speedup']:.2f}x", f"{r['bound']:.2f}x", f"{r['of_bound']:.0%}",
                      f"{r['step_seconds']:.3f}", f"{r['gen_seconds']:.3f}",
                      f"{r['train_seconds']:.3f}", f"{r['reference_seconds']:.3f}",
                      str(r["staleness_max"]))
    if trl is not None:
        table.add_row(f"TRL {trl['trl']}", f"{trl['tokens_per_s']:.0f}", "1.00x", "-", "-",
                      "-", f"{trl['step_seconds']:.3f}", "-", "-", "-", "0")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    for name, r in results["modes"].items():
        console.print(f"where a step of rljob {name} goes ({r['step_seconds']:.3f} s): " + "; ".join(
            f"{role} " + ", ".join(f"{kind} {sec:.3f}" for kind, sec in sorted(kinds.items()))
            for role, kinds in sorted(r["step_parts"].items())))
    console.print("bound: the most overlap can give over sync, from sync's Tgen, Ttrain and "
                  "ref ((Tgen + Ttrain + ref/2) / max(Tgen, Ttrain, (Tgen + Ttrain + ref)/2)); "
                  "TRL: GRPOTrainer configured for the job (rljob_bench/peer_trl.py FAIR), "
                  "the whole step in one generate")
