"""`rljob bench workflow`: one small job run in sync, periodic, async(1) and
async(2), side by side: generated tokens/s over the steady state, bubble ratio
(idle share of the rollout and trainer processes), each mode's speedup over sync,
the most overlap could give (`planner.cost.overlap_bound`, from the round's own
sync Tgen and Ttrain) and the fraction of it reached.

The job is shaped so overlap can pay on a 2-core machine: one rollout replica
and one trainer rank, each a single-threaded process pinned to its own core,
with generation and training of one step taking about the same time (256
samples of up to 22 tokens from 16 prompts × 16; ~0.5 s each alone), and a
step cut in 16 micro-batches of one group each. Periodic's pipeline fill (the
first group's generation, the trainer waiting) and drain (the last
micro-batch's training and the optimizer, the rollout waiting for the new
weights) are then a sixteenth of a step each; with 8 groups per step they
were an eighth, which caps periodic at 2 / (1 + 1/8) ≈ 1.78x before any
overhead, against 2 / (1 + 1/16) ≈ 1.88x now.

The modes run in rounds (sync, periodic, async(1), sync, ...): a shared machine
drifts in speed over a minute, so each round's speedups compare runs made next
to each other, and the figures printed are medians over the rounds."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from ..api import RLJob
from ..local import LocalRun
from ..planner.cost import overlap_bound
from ..timeline import bubble_ratio, load_spans
from ..workflow.tasks import rollout_batch_rows

MODES = (("sync", None), ("periodic", None), ("async", 1), ("async", 2))
PROMPTS = 16  # prompts per step, 16 samples each
MAX_NEW_TOKENS = 22


def bench_job(mode: str, k: int | None, steps: int, root: Path, prompts: int = PROMPTS,
              max_num_seqs: int | None = None) -> RLJob:
    workflow = {"mode": mode, "weightSync": "async" if mode == "async" else "sync"}
    if k is not None:
        workflow["maxStaleness"] = k
    repo = Path(__file__).resolve().parents[3]
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
        "metadata": {"name": f"bench-{mode}"},
        "spec": {
            "model": {"path": f"random:{repo / 'examples/models/tiny-qwen2'}",
                      "tokenizer": "builtin:char", "dtype": "float32"},
            "dataset": {"path": str(repo / "examples/data/arith.jsonl")},
            "algorithm": {"groupSize": 16, "globalBatchSize": prompts, "microBatchSize": 16,
                          "lr": 1e-4, "maxSteps": steps},
            "workflow": workflow,
            "rollout": {"replicas": 1, "maxNewTokens": MAX_NEW_TOKENS,
                        **({"maxNumSeqs": max_num_seqs} if max_num_seqs else {})},
            "trainer": {"npusPerNode": 1, "checkpointEvery": 10_000},
            "reward": {"name": "arith_partial"},
        }})


def run_mode(mode: str, k: int | None, steps: int, root: Path, warmup_steps: int = 3,
             prompts: int = PROMPTS, max_num_seqs: int | None = None) -> dict:
    job = bench_job(mode, k, steps, root, prompts, max_num_seqs)
    run = LocalRun(job, root / mode)
    run.start()
    try:
        while not run.supervise():
            time.sleep(0.2)
    finally:
        run.stop()
    ms = run.metrics()
    steady = ms[warmup_steps:]  # the first steps include process start-up and compilation
    t0, t1 = ms[warmup_steps - 1]["time"], ms[-1]["time"]
    tokens = sum(m["tokens"] for m in steady)
    spans = [s for s in load_spans(run.run_dir) if s.step >= warmup_steps]
    return {
        "steps": len(steady),
        "seconds": t1 - t0,
        "tokens_per_s": tokens / (t1 - t0),
        "step_seconds": (t1 - t0) / len(steady),
        "gen_seconds": sum(m["gen_seconds"] for m in steady) / len(steady),
        "train_seconds": sum(m["train_seconds"] for m in steady) / len(steady),
        "bubble_ratio": bubble_ratio(spans, window=(t0, t1)),
        "staleness_max": max(m["staleness_max"] for m in steady),
    }


def run(steps: int = 12, keep: Path | None = None, rounds: int = 2,
        prompts: int = PROMPTS, max_num_seqs: int | None = None, peer: str | None = None) -> dict:
    if peer not in (None, "trl"):
        raise SystemExit(f"--peer {peer}: the peer the benchmark knows is trl")
    per_round: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="rljob-bench-") as tmp:
        root = keep or Path(tmp)
        for r in range(rounds):
            results = {}
            for mode, k in MODES:
                name = mode if k is None else f"async({k})"
                results[name] = run_mode(mode, k, steps, root / f"round-{r}", prompts=prompts,
                                         max_num_seqs=max_num_seqs)
            if peer == "trl":  # the colocated peer, in the same round
                from .peer_trl import run_trl

                results["trl"] = run_trl(bench_job("sync", None, steps, root, prompts,
                                                   max_num_seqs), steps)
            per_round.append(results)
    peers = [res.pop("trl") for res in per_round if "trl" in res]
    names = list(per_round[0])
    spec = bench_job("periodic", None, steps, Path("."), prompts, max_num_seqs).spec
    pieces = _pieces(spec)  # periodic's batches a step (the other modes' bounds need none)
    for res in per_round:  # each round's bounds from its own sync run (Tgen, Ttrain apart)
        sync = res["sync"]
        for name, r in res.items():
            r["bound"] = overlap_bound(name.split("(")[0], sync["gen_seconds"],
                                       sync["train_seconds"], pieces)
            r["of_bound"] = r["tokens_per_s"] / sync["tokens_per_s"] / r["bound"]
    modes = {}
    for m in names:
        runs = [res[m] for res in per_round]
        modes[m] = {key: (statistics.median(r[key] for r in runs)
                          if key != "staleness_max" else max(r[key] for r in runs))
                    for key in runs[0]}
    speedup = {m: statistics.median(res[m]["tokens_per_s"] / res["sync"]["tokens_per_s"]
                                    for res in per_round) for m in names}
    out_peer = {}
    if peers:
        out_peer = {"peer": {"name": "trl", "version": peers[0]["trl"],
                             "tokens_per_s": statistics.median(p["tokens_per_s"] for p in peers),
                             "step_seconds": statistics.median(p["step_seconds"] for p in peers)},
                    "vs_peer": {m: statistics.median(res[m]["tokens_per_s"] / p["tokens_per_s"]
                                                     for res, p in zip(per_round, peers))
                                for m in names}}
    return {**out_peer,
            "max_num_seqs": spec.rollout.max_num_seqs, "periodic_pieces_per_step": pieces,
            "tokens_per_s": {m: modes[m]["tokens_per_s"] for m in names},
            "bound": {m: modes[m]["bound"] for m in names},
            "of_bound": {m: modes[m]["of_bound"] for m in names},
            "speedup": speedup, "rounds": len(per_round),
            "speedup_per_round": [{m: res[m]["tokens_per_s"] / res["sync"]["tokens_per_s"]
                                   for m in names} for res in per_round],
            "modes": modes}


def _pieces(spec) -> int:
    """Rollout batches per step and replica."""
    a, r = spec.algorithm, spec.rollout
    per_replica = a.samples_per_step // r.replicas
    return -(-per_replica // rollout_batch_rows(a.samples_per_step, a.group_size, r.replicas,
                                                r.max_num_seqs, spec.workflow.mode))


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the same job in four workflow modes (1 rollout replica generating "
                        f"up to {results['max_num_seqs']} sequences a batch, 1 trainer "
                        f"rank, steady state; medians of {results['rounds']} rounds)")
    for col in ("mode", "tokens/s", "vs sync", "bound", "of bound", "step s", "Tgen s",
                "Ttrain s", "bubble ratio", "max staleness"):
        table.add_column(col, justify="right")
    for mode, r in results["modes"].items():
        table.add_row(mode, f"{r['tokens_per_s']:.0f}", f"{results['speedup'][mode]:.2f}x",
                      f"{r['bound']:.2f}x", f"{r['of_bound']:.0%}",
                      f"{r['step_seconds']:.2f}", f"{r['gen_seconds']:.2f}",
                      f"{r['train_seconds']:.2f}", f"{r['bubble_ratio']:.0%}",
                      str(r["staleness_max"]))
    Console(width=max(Console().width, 120)).print(table)
    if "peer" in results:
        p = results["peer"]
        Console().print(f"peer: TRL {p['version']} GRPOTrainer (one process, the whole step in "
                        f"one generate): {p['tokens_per_s']:.0f} tokens/s, "
                        f"{p['step_seconds']:.2f} s a step; ours/TRL: " + ", ".join(
                            f"{m} {v:.2f}x" for m, v in results["vs_peer"].items()))
    pieces = results["periodic_pieces_per_step"]
    Console().print("bound: the most overlap can give over sync from sync's Tgen and Ttrain "
                    f"(async: (Tgen + Ttrain) / max; periodic: {pieces} rollout batch(es) a "
                    "step, fill and drain included)")


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
