"""`rljob bench workflow`: one small job run in sync, periodic, async(1) and
async(2), side by side: generated tokens/s over the steady state, bubble ratio
(idle share of the rollout and trainer processes), each mode's speedup over sync,
the most overlap could give (`planner.cost.overlap_bound`, from the round's own
sync Tgen, Ttrain and the reference's forwards) and the
fraction of it reached, and each side's compute a
step next to the other over its compute alone (sync), which is what contention
for the machine costs.

The job: one rollout replica and one trainer rank on cores of their own, a tiny
random-init Qwen2, 16 samples of up to 22 tokens per prompt, one group per
micro-batch. Overlap can hide at most the shorter of generation and training, so
unless `--prompts` is given a short probe (`bench.probe`) times each side alone
on this machine and picks the prompts per step where both overlapping modes'
predicted bounds are highest; the probe's generation cost per batch also goes
into periodic's bound.

The modes run in rounds (sync, periodic, async(1), async(2), sync, ...): a shared
machine drifts in speed over a minute, so each round's speedups compare runs made
next to each other, and the figures printed are medians over the rounds."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rljob.api import RLJob
from rljob.local import LocalRun
from rljob.planner.cost import bound_times, overlap_bound
from rljob.infra.timeline import bubble_ratio, busy_seconds, load_spans
from rljob.workflow.tasks import reference_task, rollout_batch_rows

from .examples import example, tiny_model

MODES = (("sync", None), ("periodic", None), ("async", 1), ("async", 2))
PROMPTS = 16  # prompts per step, 16 samples each
MAX_NEW_TOKENS = 22
CPU_READS = 0.1  # seconds between two reads of the workers' CPU time


def mode_name(mode: str, k: int | None) -> str:
    """How a mode is shown: sync, periodic, async(1) (pure)."""
    return mode if k is None else f"{mode}({k})"


def mode_dir(mode: str, k: int | None) -> str:
    """A mode's run directory's name: sync, periodic, async-1 (pure)."""
    return mode if k is None else f"{mode}-{k}"


def bench_job(mode: str, k: int | None, steps: int, root: Path, prompts: int = PROMPTS,
              max_num_seqs: int | None = None, engine: str = "hf",
              algorithm: str = "grpo") -> RLJob:
    workflow = {"mode": mode, "weightSync": "async" if mode == "async" else "sync"}
    if k is not None:
        workflow["maxStaleness"] = k
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
        "metadata": {"name": f"bench-{mode}"},
        "spec": {
            "model": {"path": tiny_model(),
                      "tokenizer": "builtin:char", "dtype": "float32"},
            "dataset": {"path": str(example("data/arith.jsonl"))},
            # ppo: the same samples, with the critic's advantages (critic.py)
            "algorithm": {"name": algorithm, "groupSize": 16, "promptsPerStep": prompts,
                          "samplesPerMicroBatch": 16, "lr": 1e-4, "maxSteps": steps},
            "workflow": workflow,
            "rollout": {"replicas": 1, "engine": engine, "maxNewTokens": MAX_NEW_TOKENS,
                        **({"maxNumSeqs": max_num_seqs} if max_num_seqs else {})},
            "trainer": {"npusPerNode": 1, "checkpointEvery": 10_000},
            "reward": {"name": "arith_partial"},
        }})


def run_mode(mode: str, k: int | None, steps: int, root: Path, warmup_steps: int = 3,
             prompts: int = PROMPTS, max_num_seqs: int | None = None,
             algorithm: str = "grpo", lend_cores: bool = False) -> dict:
    job = bench_job(mode, k, steps, root, prompts, max_num_seqs, algorithm=algorithm)
    # a directory each
    return measure(job, root / mode_dir(mode, k), warmup_steps,
                   lend_cores)


def measure(job: RLJob, run_dir: Path, warmup_steps: int = 3, lend_cores: bool = False,
            token: str | None = None) -> dict:
    """`rljob run` of `job` in `run_dir`: its steady-state figures (after
    `warmup_steps`), from its metrics and its timeline; `token` "" runs it without a
    job token (what the token costs: `rljob bench security`)."""
    run = LocalRun(job, run_dir, lend_cores=lend_cores,
                   **({"token": token} if token is not None else {}))
    run.start()
    cpu: dict[str, list[tuple[float, float]]] = {}  # worker -> (wall, CPU seconds) reads
    try:
        while not run.supervise():
            for name, proc in list(run.procs.items()):
                used = _cpu_seconds(proc.pid)
                if used is not None:
                    cpu.setdefault(name, []).append((time.time(), used))
            time.sleep(CPU_READS)
    finally:
        run.stop()
    ms = run.metrics()
    steady = ms[warmup_steps:]  # the first steps include process start-up and compilation
    t0, t1 = ms[warmup_steps - 1]["time"], ms[-1]["time"]
    tokens = sum(m["tokens"] for m in steady)
    spans = [s for s in load_spans(run.run_dir) if s.step >= warmup_steps]
    n = len(steady)
    return {
        "steps": len(steady),
        "seconds": t1 - t0,
        "tokens_per_s": tokens / (t1 - t0),
        "step_seconds": (t1 - t0) / len(steady),
        "gen_seconds": sum(m["gen_seconds"] for m in steady) / len(steady),
        "train_seconds": sum(m["train_seconds"] for m in steady) / len(steady),
        # each side's own compute a step (its spans), without the waits: alone in sync,
        # next to the other side in the overlapping modes (their ratio is the contention)
        "gen_busy_seconds": sum(s.end - s.start for s in spans
                                if s.worker.startswith("rollout") and s.kind == "generate") / n,
        "train_busy_seconds": sum(s.end - s.start for s in spans if s.worker == "trainer-0"
                                  and s.kind in ("train", "optimizer")) / n,
        # the reference's log-probs a step, whichever side computed them (a task of its
        # own: not in Ttrain, which counts the trainer's micro-steps and optimizer)
        "reference_seconds": sum(s.end - s.start for s in spans if s.kind == "reference") / n,
        "bubble_ratio": bubble_ratio(spans, window=(t0, t1)),
        # a step's seconds during which some worker computes (the rest of it, every
        # worker waits on claims, puts, writes, weights or the release)
        "busy_seconds": busy_seconds(spans, (t0, t1)) / n,
        # the light processes' share of a core in the steady state (they share the
        # rollout's core)
        "light_cpu_share": {name: _share(reads, t0, t1) for name, reads in cpu.items()
                            if name in ("transferqueue", "driver")},
        # each process's CPU seconds a step (all its threads; /proc): what a step costs
        # the machine, steadier than its wall time on a shared one
        "cpu_seconds": {name: used / n for name, reads in sorted(cpu.items())
                        if (used := cpu_between(reads, t0, t1)) is not None},
        "staleness_max": max(m["staleness_max"] for m in steady),
        "step_parts": step_parts(spans, n),
    }


def step_parts(spans: list, steps: int) -> dict[str, dict[str, float]]:
    """Seconds a step each role (trainer, rollout: its replicas together) spent in
    each kind of span (pure): where a step goes, beside the step's seconds."""
    parts: dict[str, dict[str, float]] = {}
    for s in spans:
        role = s.worker.split("-")[0]
        kinds = parts.setdefault(role, {})
        kinds[s.kind] = kinds.get(s.kind, 0.0) + (s.end - s.start) / max(steps, 1)
    return parts


def _peer(runs: list[dict]) -> dict:
    """The peer's figures over the rounds (medians)."""
    return {"name": "trl", "version": runs[0]["trl"],
            "tokens_per_s": statistics.median(p["tokens_per_s"] for p in runs),
            "step_seconds": statistics.median(p["step_seconds"] for p in runs)}


def _vs(per_round: list[dict], runs: list[dict], names: list[str]) -> dict:
    """Our modes' tokens/s over the peer's, each round's own, medians."""
    return {m: statistics.median(res[m]["tokens_per_s"] / p["tokens_per_s"]
                                 for res, p in zip(per_round, runs)) for m in names}


def _merge(key: str, values: list):
    """One figure of the rounds': the worst staleness, else the median (per name)."""
    if key == "staleness_max":
        return max(values)
    if isinstance(values[0], dict):
        return {k: statistics.median(v[k] for v in values if k in v) for k in values[0]}
    return statistics.median(values)


def _share(reads: list[tuple[float, float]], t0: float, t1: float) -> float:
    """CPU seconds per wall second between the reads nearest t0 and t1."""
    inside = [r for r in reads if t0 <= r[0] <= t1] or reads
    (w0, c0), (w1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (w1 - w0) if w1 > w0 else 0.0


def cpu_between(reads: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """CPU seconds a process used between wall times t0 and t1 (pure), from its
    (wall, CPU seconds) reads in time order: each end read off the line between the
    two reads around it, and clamped to the first and last read (a process that
    started after t0 or ended before t1 used none outside its reads). None with
    fewer than two reads."""
    if len(reads) < 2:
        return None

    def at(t: float) -> float:
        if t <= reads[0][0]:
            return reads[0][1]
        for (w0, c0), (w1, c1) in zip(reads, reads[1:]):
            if t <= w1:
                return c0 + (c1 - c0) * (t - w0) / (w1 - w0) if w1 > w0 else c1
        return reads[-1][1]

    return max(at(t1) - at(t0), 0.0)


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc), None if gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(steps: int = 12, keep: Path | None = None, rounds: int = 2,
        prompts: int | None = None, max_num_seqs: int | None = None,
        peer: str | None = None, algorithm: str = "grpo", lend_cores: bool = False) -> dict:
    """`prompts` None: a short probe of this machine picks the prompts per step
    (`bench.probe.choose_prompts`). `algorithm` ppo: the job trains with a critic."""
    if peer not in (None, "trl"):
        raise SystemExit(f"--peer {peer}: the peer the benchmark knows is trl")
    per_round: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="rljob-bench-") as tmp:
        root = keep or Path(tmp)
        shape = _probe(root, prompts, max_num_seqs, algorithm)
        prompts = shape["prompts"]
        for r in range(rounds):
            results = {}
            for mode, k in MODES:
                name = mode_name(mode, k)
                results[name] = run_mode(mode, k, steps, root / f"round-{r}", prompts=prompts,
                                         max_num_seqs=max_num_seqs, algorithm=algorithm,
                                         lend_cores=lend_cores)
            if peer == "trl":  # the colocated peer, in the same round: configured for
                from .peer_trl import run_trl  # the job, and at its own defaults

                job = bench_job("sync", None, steps, root, prompts, max_num_seqs)
                results["trl"] = run_trl(job, steps)
                results["trl-defaults"] = run_trl(job, steps, fair=False)
            per_round.append(results)
    peers = [res.pop("trl") for res in per_round if "trl" in res]
    defaults = [res.pop("trl-defaults") for res in per_round if "trl-defaults" in res]
    names = list(per_round[0])
    spec = bench_job("periodic", None, steps, Path("."), prompts, max_num_seqs).spec
    pieces = _pieces(spec)  # periodic's batches a step (the other modes' bounds need none)
    shared = reference_task(bench_job("sync", None, steps, Path("."), prompts,
                                      max_num_seqs).spec)
    for res in per_round:  # each round's bounds from its own sync run (Tgen, Ttrain apart)
        sync = res["sync"]
        t_train, t_either = bound_times(sync["train_seconds"], sync["reference_seconds"],
                                        shared)
        for name, r in res.items():
            r["bound"] = overlap_bound(name.split("(")[0], sync["gen_seconds"], t_train,
                                       pieces, shape["gen_fixed"], t_either=t_either)
            r["of_bound"] = r["tokens_per_s"] / sync["tokens_per_s"] / r["bound"]
    modes = {}
    for m in names:
        runs = [res[m] for res in per_round]
        modes[m] = {key: _merge(key, [r[key] for r in runs]) for key in runs[0]}
    speedup = {m: statistics.median(res[m]["tokens_per_s"] / res["sync"]["tokens_per_s"]
                                    for res in per_round) for m in names}
    out_peer = {}
    if peers:
        out_peer = {"peer": _peer(peers), "vs_peer": _vs(per_round, peers, names),
                    "peer_defaults": _peer(defaults),
                    "vs_peer_defaults": _vs(per_round, defaults, names)}
    sync = modes["sync"]
    for m in modes.values():  # each side's compute a step next to the other, over alone
        m["gen_contention"] = m["gen_busy_seconds"] / sync["gen_busy_seconds"]
        m["train_contention"] = m["train_busy_seconds"] / sync["train_busy_seconds"]
    return {**out_peer, "shape": shape, "algorithm": algorithm, "lend_cores": lend_cores,
            "max_num_seqs": spec.rollout.max_num_seqs, "periodic_pieces_per_step": pieces,
            "tokens_per_s": {m: modes[m]["tokens_per_s"] for m in names},
            "bound": {m: modes[m]["bound"] for m in names},
            "of_bound": {m: modes[m]["of_bound"] for m in names},
            "speedup": speedup, "rounds": len(per_round),
            "speedup_per_round": [{m: res[m]["tokens_per_s"] / res["sync"]["tokens_per_s"]
                                   for m in names} for res in per_round],
            "modes": modes}


def _probe(root: Path, prompts: int | None, max_num_seqs: int | None,
           algorithm: str = "grpo") -> dict:
    """Each side alone on this machine (`bench.probe`): generation's fixed part a
    batch (periodic's bound pays it once per batch) and, unless `prompts` is
    given, the prompts per step where overlap has the most to gain."""
    from . import probe

    def job_for(p: int) -> RLJob:
        return bench_job("sync", None, 1, root, p, max_num_seqs, algorithm=algorithm)

    def pieces_for(p: int) -> int:
        return _pieces(bench_job("periodic", None, 1, root, p, max_num_seqs).spec)

    rollout_threads, trainer_threads = probe.threads_of(job_for(PROMPTS), root / "probe")
    found = probe.run_probe(job_for, rollout_threads, trainer_threads)
    chosen = prompts or probe.choose_prompts(found, pieces_for)
    gen, train = probe.predict(found, chosen)
    return {"prompts": chosen, "chosen_by": "--prompts" if prompts else "probe",
            "gen_fixed": probe.gen_fixed(found),
            "probe": {"prompts": list(found.prompts), "gen_seconds": list(found.gen_seconds),
                      "train_seconds": list(found.train_seconds),
                      "threads": {"rollout": found.rollout_threads,
                                  "trainer": found.trainer_threads},
                      "seconds": found.seconds},
            "predicted": {"gen_seconds": gen, "train_seconds": train,
                          "bound": probe.predicted_speedups(found, chosen, pieces_for(chosen))}}


def _pieces(spec) -> int:
    """Rollout batches per step and replica."""
    a, r = spec.algorithm, spec.rollout
    per_replica = a.samples_per_step // r.replicas
    return -(-per_replica // rollout_batch_rows(a.samples_per_step, a.group_size, r.replicas,
                                                r.max_num_seqs, spec.workflow.mode))


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"the same {results.get('algorithm', 'grpo')} job in four workflow "
                        "modes (1 rollout replica generating "
                        f"up to {results['max_num_seqs']} sequences a batch, 1 trainer "
                        f"rank, steady state; medians of {results['rounds']} rounds)")
    for col in ("mode", "tokens/s", "vs sync", "bound", "of bound", "step s", "Tgen s",
                "Ttrain s", "ref s", "gen busy s", "train busy s", "bubble ratio",
                "max staleness"):
        table.add_column(col, justify="right")
    for mode, r in results["modes"].items():
        table.add_row(mode, f"{r['tokens_per_s']:.0f}", f"{results['speedup'][mode]:.2f}x",
                      f"{r['bound']:.2f}x", f"{r['of_bound']:.0%}",
                      f"{r['step_seconds']:.2f}", f"{r['gen_seconds']:.2f}",
                      f"{r['train_seconds']:.2f}", f"{r['reference_seconds']:.2f}",
                      f"{r['gen_busy_seconds']:.2f} ({r['gen_contention']:.2f}x)",
                      f"{r['train_busy_seconds']:.2f} ({r['train_contention']:.2f}x)",
                      f"{r['bubble_ratio']:.0%}", str(r["staleness_max"]))
    shape, p = results["shape"], results["shape"]["probe"]
    pred = shape["predicted"]
    Console().print(
        "probe ({:.0f} s, each side alone, {} rollout / {} trainer thread(s)): Tgen {} s, "
        "Ttrain {} s at {} prompts a step; a generation batch costs {:.3f} s whatever its "
        "size".format(p["seconds"], p["threads"]["rollout"], p["threads"]["trainer"],
                      " / ".join(f"{x:.2f}" for x in p["gen_seconds"]),
                      " / ".join(f"{x:.2f}" for x in p["train_seconds"]),
                      " / ".join(str(x) for x in p["prompts"]), shape["gen_fixed"]))
    Console().print(
        "shape: {} prompts × 16 a step ({}); predicted Tgen {:.2f} s, Ttrain {:.2f} s, "
        "bounds periodic {:.2f}x, async {:.2f}x".format(
            shape["prompts"], "--prompts" if shape["chosen_by"] == "--prompts" else
            "where both overlapping modes gain most; --prompts N sets it",
            pred["gen_seconds"], pred["train_seconds"], pred["bound"]["periodic"],
            pred["bound"]["async"]))
    Console(width=max(Console().width, 140)).print(table)
    if "peer" in results:
        for key, what in (("peer", "configured for the job"),
                          ("peer_defaults", "at its own defaults")):
            p = results[key]
            Console().print(
                f"peer: TRL {p['version']} GRPOTrainer {what} (one process, the whole step "
                f"in one generate): {p['tokens_per_s']:.0f} tokens/s, "
                f"{p['step_seconds']:.2f} s a step; ours/TRL: " + ", ".join(
                    f"{m} {v:.2f}x" for m, v in results["vs_" + key].items()))
    Console().print("light processes, share of a core (the rollout's): " + "; ".join(
        f"{mode} " + ", ".join(f"{'controller' if n == 'transferqueue' else n} {v:.0%}"
                               for n, v in sorted(r["light_cpu_share"].items()))
        for mode, r in results["modes"].items()))
    pieces = results["periodic_pieces_per_step"]
    Console().print("bound: the most overlap can give over sync from sync's Tgen, Ttrain "
                    "and ref (the reference's forwards a step: sync splits them over both "
                    "sides, async gives them to whichever waits) (async: (Tgen + Ttrain + "
                    "ref/2) / max(Tgen, Ttrain, (Tgen + Ttrain + ref)/2); periodic: "
                    f"{pieces} rollout batch(es) a step, fill and drain included, each batch "
                    "paying generation's fixed part, the trainer computing each batch's "
                    "reference); busy: each side's own compute a step, "
                    "and in brackets over sync's, where it runs alone")


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
