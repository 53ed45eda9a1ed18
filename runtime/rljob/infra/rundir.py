"""The run directory's layout, named in one place for the workers that write it and
the commands that read it (`rljob run --run-dir`, a pod's /checkpoints):

    job.yaml                   the resolved job (local runs)
    logs/NAME.log              each worker's output; logs/events.log the supervisor's
    logs/NAME.pid              the pid of each worker's current life (local runs)
    metrics.jsonl              one line per trained step
    spans/WORKER.jsonl         each worker's timed spans (timeline.png's input)
    tensorboard/               TensorBoard event files
    wandb/, wandb-run-id       W&B's files and the run's id (a resumed run goes on)
    checkpoints/step-N/FILE    the trainer's checkpoint after step N (FILE.partial
                               while it is written)
    checkpoints/critic/step-N.pt   PPO's critic after step N
    final/                     the last weights, in Hugging Face's layout
    reference.safetensors      the frozen reference, for the replicas that compute
                               the reference task (local runs; trainer/reference.py)
    reward.png, timeline.png   the plots of a finished run
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PARTIAL = ".partial"


def step_of(path: Path) -> int:
    """N of `step-N` or `step-N.pt` (pure)."""
    return int(path.name.split(".")[0].split("-")[1])


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of(cls, run_dir: str | Path | RunDir | None) -> RunDir | None:
        """A RunDir for a path (None stays None: a worker without a run directory)."""
        if run_dir is None or isinstance(run_dir, RunDir):
            return run_dir
        return cls(Path(run_dir))

    # ---- files --------------------------------------------------------------
    @property
    def job_file(self) -> Path:
        return self.root / "job.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def wandb_id(self) -> Path:
        return self.root / "wandb-run-id"

    @property
    def warmup_progress(self) -> Path:
        """The supervised warm-up's progress ({"step", "of", "loss", "seconds"}), for the live view."""
        return self.root / "warmup.json"

    @property
    def token(self) -> Path:
        """The run's token (readable by its owner only): what a tool of this machine
        presents to the run's servers (infra/auth.py)."""
        return self.root / "token"

    @property
    def ca(self) -> Path:
        """The run's CA certificate (transferQueue.tls): what a tool of this machine
        trusts to reach the run's servers (infra/tls.py)."""
        return self.root / "ca.crt"

    @property
    def final(self) -> Path:
        return self.root / "final"

    @property
    def reference(self) -> Path:
        """The frozen reference's weights (safetensors), for the replicas of a local
        run that compute the reference task (trainer/reference.py)."""
        return self.root / "reference.safetensors"

    @property
    def reward_plot(self) -> Path:
        return self.root / "reward.png"

    @property
    def timeline_plot(self) -> Path:
        return self.root / "timeline.png"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        return self.logs / f"{name}.pid"

    @property
    def events_log(self) -> Path:
        return self.log("events")

    @property
    def spans(self) -> Path:
        return self.root / "spans"

    def span_file(self, worker: str) -> Path:
        return self.spans / f"{worker}.jsonl"

    # ---- checkpoints --------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def checkpoint_steps(self, file: str = "*.pt") -> list[int]:
        """Steps with a complete trainer checkpoint (a `file` in it; one a kill cut
        short has only its .partial file), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(step_of(p) for p in self.checkpoints.glob("step-*")
                      if p.is_dir() and any(p.glob(file)))

    @property
    def critic_checkpoints(self) -> Path:
        return self.checkpoints / "critic"

    def critic_checkpoint(self, step: int) -> Path:
        return self.critic_checkpoints / f"step-{step}.pt"

    def critic_checkpoint_files(self) -> list[Path]:
        """The critic's complete checkpoints, oldest first."""
        if not self.critic_checkpoints.is_dir():
            return []
        return sorted(self.critic_checkpoints.glob("step-*.pt"), key=step_of)

    # ---- what a run wrote ---------------------------------------------------
    def outputs(self) -> list[str]:
        """The names of the results a user looks at first, those that exist."""
        named = {"metrics.jsonl": self.metrics, "reward.png": self.reward_plot,
                 "timeline.png": self.timeline_plot, "final/": self.final}
        return [n for n, p in named.items() if p.exists()]


def readable_as_new(directory: Path) -> None:
    """Give each file in `directory` the mode this process's umask gives a new file:
    safetensors writes its file 0600 where the rest of a transformers directory
    follows the umask, and a model directory is read by others (a serving pod, the
    next job's pods under another user)."""
    mask = os.umask(0)
    os.umask(mask)
    for f in directory.iterdir():
        if f.is_file() and not f.is_symlink():
            f.chmod(0o666 & ~mask)
