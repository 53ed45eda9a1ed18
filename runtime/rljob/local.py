"""`rljob run FILE`: the whole job as local processes, the embedded default.

The same entrypoints as the pods: `rljob worker transferqueue`, `rljob worker
trainer` (one per rank; DDP over gloo when there is more than one),
`rljob worker rollout` (one per replica) and `rljob worker driver`. The run
directory gets job.yaml, metrics.jsonl, spans/, checkpoints/, final/ (weights),
reward.png and timeline.png.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .api import RLJob
from .netutil import free_port


@dataclass
class LocalRun:
    job: RLJob
    run_dir: Path
    redis: list[str] = field(default_factory=list)
    max_steps: int | None = None
    resume: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.max_steps or self.job.spec.algorithm.max_steps

    def _cpus_for(self, name: str) -> set[int] | None:
        """Trainer ranks and rollout replicas each get a core of their own, round
        robin (trainers first), so busy workers do not bounce between cores; the
        light processes (controller, driver) share the last core, away from the
        trainer, whose step ends every pipeline stage."""
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(cpus) < 2:
            return None
        spec = self.job.spec
        order = [f"trainer-{r}" for r in range(spec.trainer.world_size)] + \
                [f"rollout-{i}" for i in range(spec.rollout.replicas)]
        if name not in order:
            return {cpus[-1]}
        return {cpus[order.index(name) % len(cpus)]}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out = open(logs / f"{name}.log", "ab")
        cpus = self._cpus_for(name)
        proc = subprocess.Popen([sys.executable, "-m", "rljob", "worker", *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus
                                else None)
        self.procs[name] = proc
        return proc

    def start(self) -> None:
        spec = self.job.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        job_file = self.run_dir / "job.yaml"
        if not (self.resume and job_file.exists()):
            job_file.write_text(yaml.safe_dump(self.job.to_wire(), sort_keys=False))
        self.tq_address = f"127.0.0.1:{free_port()}"
        self.weights_address = f"127.0.0.1:{free_port()}"
        master = f"127.0.0.1:{free_port()}"
        common = ["--job", str(job_file), "--run-dir", str(self.run_dir)]
        tq_args = ["transferqueue", "--listen", self.tq_address, "--job", self.job.metadata.name
                   or "rljob", "--lease-seconds", str(spec.transfer_queue.lease_seconds),
                   "--log-level", "WARNING"]
        for url in self.redis:
            tq_args += ["--redis", url]
        tq = self._spawn("transferqueue", tq_args)
        self._wait_listening(tq, "transferqueue")
        steps = ["--max-steps", str(self.steps)]
        world = spec.trainer.world_size
        start_step = self._resume_step() if self.resume else 0
        self._trainer_args = ["trainer", *common, *steps, "--tq", self.tq_address,
                              "--weights-listen", self.weights_address, "--world-size",
                              str(world), "--master", master]
        for r in range(world):
            self.start_trainer(r, resume=self.resume)
        for i in range(spec.rollout.replicas):
            self._spawn(f"rollout-{i}", ["rollout", *common, "--tq", self.tq_address,
                                         "--weights", self.weights_address,
                                         "--replica", str(i)])
        self._spawn("driver", ["driver", *common, *steps, "--tq", self.tq_address,
                               "--weights", self.weights_address,
                               "--start-step", str(start_step)])

    def start_trainer(self, rank: int, resume: bool) -> subprocess.Popen:
        """(Re)start one trainer rank; with `resume`, from the run's last checkpoint."""
        return self._spawn(f"trainer-{rank}", [*self._trainer_args, "--rank", str(rank)]
                           + (["--resume"] if resume else []))

    def _resume_step(self) -> int:
        ckpts = list((self.run_dir / "checkpoints").glob("step-*"))
        return max((int(p.name.split("-")[1]) for p in ckpts), default=0)

    def _wait_listening(self, proc: subprocess.Popen, name: str, timeout: float = 60) -> None:
        log = self.run_dir / "logs" / f"{name}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
            if log.exists() and "listening" in log.read_text():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{name} did not start within {timeout}s")

    def failed(self) -> str | None:
        """Name and log tail of a child that died with an error, if any."""
        for name, p in self.procs.items():
            code = p.poll()
            if code not in (None, 0):
                tail = (self.run_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                return f"{name} exited with {code}:\n{tail}"
        return None

    def trainer_done(self) -> bool:
        trainers = [p for n, p in self.procs.items() if n.startswith("trainer-")]
        return all(p.poll() == 0 for p in trainers)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def metrics(self) -> list[dict]:
        return read_metrics(self.run_dir)


def read_metrics(run_dir: Path) -> list[dict]:
    """The per-step lines of RUN_DIR/metrics.jsonl (none yet: [])."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_plots(run_dir: Path) -> dict:
    """reward.png and timeline.png of a finished (or stopped) run; returns a summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .timeline import bubble_ratio, load_spans, plot_gantt

    metrics = read_metrics(run_dir)
    summary: dict = {"steps": len(metrics)}
    if metrics:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([m["step"] for m in metrics], [m["reward_mean"] for m in metrics], marker=".")
        ax.set_xlabel("step")
        ax.set_ylabel("mean reward")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / "reward.png", dpi=110)
        plt.close(fig)
        summary["reward_first"] = metrics[0]["reward_mean"]
        summary["reward_last"] = metrics[-1]["reward_mean"]
    spans = [s for s in load_spans(run_dir) if s.step >= 0]
    if spans:
        ratio = bubble_ratio(spans)
        summary["bubble_ratio"] = ratio
        plot_gantt([(f"{run_dir.name}: bubble ratio {ratio:.0%}", spans)],
                   run_dir / "timeline.png")
    return summary
