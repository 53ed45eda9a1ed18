"""Where trainer rank 0 writes the figures of each trained step: `metrics.jsonl` of
the run directory, the worker's Prometheus gauges, TensorBoard event files
(`logging.tensorboard`) and Weights & Biases (`logging.wandb`).

A sink is a class with `write(metrics, version)` and `close()` whose factory joins the
registry with `@sink("name")` (or, from an installed package, an entry point in the
group `rljob.step_sinks`); `open_sinks` builds the ones a job asks for and hands back
one object that writes to all of them:

    sinks = open_sinks(spec, run_dir, start, prom)
    sinks.write(step_metrics, version)   # after each optimizer step
    sinks.close()

A resumed run (`start` > 0) trains the steps after its checkpoint again: the
sinks that can drop what they recorded of those steps do (metrics.jsonl,
TensorBoard); W&B keeps its points and ignores the repeated steps.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

from ..api.spec import RLJobSpec
from ..infra.registry import Registry
from ..infra.rundir import RunDir

log = logging.getLogger("rljob.trainer")

# metrics.jsonl key → the name TensorBoard and W&B plot it under
SCALARS = {
    "reward_mean": "reward/mean", "loss": "train/loss", "kl": "train/kl",
    "clip": "train/clip_fraction", "grad_norm": "train/grad_norm",
    "staleness_mean": "staleness/mean", "staleness_max": "staleness/max",
    "tokens_per_second": "throughput/tokens_per_second",
    "samples_per_second": "throughput/samples_per_second",
    "gen_seconds": "time/gen_seconds", "train_seconds": "time/train_seconds",
    "step_seconds": "time/step_seconds", "response_length": "rollout/response_length",
    "is_weight_mean": "offpolicy/importance_weight_mean",
    "is_weight_max": "offpolicy/importance_weight_max",
    "is_capped": "offpolicy/importance_capped_fraction", "is_ess": "offpolicy/ess_fraction",
    "logp_mismatch_mean": "offpolicy/logprob_mismatch_mean",
    "logp_mismatch_max": "offpolicy/logprob_mismatch_max",
    "filtered_share": "dynamic_sampling/filtered_share",
    "extra_prompts": "dynamic_sampling/extra_prompts",
    "groups_filled": "dynamic_sampling/groups_filled",
    # reward.url, reward.model (the reward task's)
    "rule_reward_mean": "reward/rule_mean", "reward_failed": "reward/failed",
    "reward_seconds": "time/reward_seconds",
    # episodes (rollout.environment)
    "turns_mean": "episodes/turns_mean",
    "tool_calls": "episodes/tool_calls",
    "tool_errors": "episodes/tool_errors",
    "malformed_calls": "episodes/malformed_calls",
    "tool_seconds": "episodes/tool_seconds",
    "episode_errors": "episodes/errors",
    "observation_tokens": "episodes/observation_tokens",
    "env_reward_mean": "episodes/env_reward_mean",
    "prefix_cache_hit": "episodes/prefix_cache_hit",
}


def scalars(m: dict) -> dict[str, float]:
    return {tag: m[key] for key, tag in SCALARS.items() if m.get(key) is not None}


class StepSink(ABC):
    """One destination of the step figures."""

    @abstractmethod
    def write(self, m: dict, version: int) -> None:
        """Record step `version`'s figures `m` (a metrics.jsonl line)."""

    def close(self) -> None:
        """Flush and let go of what the sink holds."""


# name → factory(spec, run_dir, start, prom) returning a sink, or None when the
# job does not ask for it (or rank 0 has no run directory for it)
SinkFactory = Callable[[RLJobSpec, "Path | None", int, object], "StepSink | None"]
SINKS: Registry[SinkFactory] = Registry("step sink", None, "rljob.step_sinks")


def sink(name: str):
    """Register a sink factory under `name` (once)."""
    return SINKS.register(name)


class Sinks(StepSink):
    """Every sink of a job, written in registration order."""

    def __init__(self, sinks: list[StepSink]):
        self.sinks = sinks

    def write(self, m: dict, version: int) -> None:
        for s in self.sinks:
            s.write(m, version)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception as exc:  # noqa: BLE001 - closing the others matters more
                log.warning("closing %s: %s", type(s).__name__, exc)


def open_sinks(spec: RLJobSpec, run_dir: str | Path | RunDir | None, start: int,
               prom=None) -> Sinks:
    made = (factory(spec, RunDir.of(run_dir), start, prom)
            for factory in SINKS.loaded().values())
    return Sinks([s for s in made if s is not None])


class JsonlSink(StepSink):
    """One JSON line per step (what `rljob run` plots and resumes from)."""

    def __init__(self, path: Path, start: int):
        if path.exists():  # steps after the checkpoint are trained again: their lines go
            # (a last line without its newline was torn by the life that ended)
            kept = [line for line in path.read_text().split("\n")[:-1]
                    if line.strip() and json.loads(line)["step"] <= start]
            path.write_text("".join(line + "\n" for line in kept))
        self.file = open(path, "a")

    def write(self, m: dict, version: int) -> None:
        self.file.write(json.dumps(m) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class PrometheusSink(StepSink):
    """The worker's gauges and counters (`WorkerMetrics`) of the last step."""

    def __init__(self, prom):
        self.prom = prom

    def write(self, m: dict, version: int) -> None:
        p = self.prom
        p.step.set(version)
        p.version.set(version)
        p.samples.inc(m["samples"])
        p.tokens.inc(m["tokens"])
        p.reward.set(m["reward_mean"])
        p.staleness.set(m["staleness_mean"])
        p.gen_seconds.set(m["gen_seconds"])
        p.train_seconds.set(m["train_seconds"])
        for key, gauge in p.off_policy.items():
            if m.get(key) is not None:  # none: no fresh sample to measure a mismatch on
                gauge.set(m[key])


class TensorBoardSink(StepSink):
    """Event files in RUN_DIR/tensorboard: one event per step holding every figure
    of it, with TensorBoard's own writer (an event a figure, as a SummaryWriter's
    `add_scalar` makes them, cost 1.7 ms of CPU for a step's 18 figures and the
    flush; one event 0.3 ms)."""

    def __init__(self, directory: Path, start: int):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # imported once, when the sink is made: a job without it never loads tensorboard
        self.event, self.summary = Event, Summary
        self.writer = EventFileWriter(str(directory))
        if start:  # a resumed run: TensorBoard drops its points after the checkpoint
            self.writer.add_event(Event(wall_time=time.time(), step=start + 1,
                                        session_log=SessionLog(status=SessionLog.START)))

    def write(self, m: dict, version: int) -> None:
        values = [self.summary.Value(tag=tag, simple_value=float(v))
                  for tag, v in scalars(m).items()]
        self.writer.add_event(self.event(wall_time=time.time(), step=version,
                                         summary=self.summary(value=values)))
        self.writer.flush()  # a step's points show while the job runs

    def close(self) -> None:
        self.writer.close()


class WandbSink(StepSink):
    """A W&B run of the job: its spec as the config, a point per step. The run's id
    is kept in the run directory, so `--resume` (or a restarted trainer gang)
    continues the same W&B run."""

    def __init__(self, spec: RLJobSpec, run_dir: RunDir | None):
        import wandb

        cfg = spec.logging.wandb
        run_id = None
        id_file = run_dir.wandb_id if run_dir else None
        if id_file is not None and id_file.exists():
            run_id = id_file.read_text().strip()
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, mode=cfg.mode,
            # no run directory (a pod without trainer.checkpointPvc): a scratch one
            dir=str(run_dir.root) if run_dir else tempfile.mkdtemp(prefix="rljob-wandb-"),
            name=run_dir.root.name if run_dir else None, id=run_id, resume="allow",
            config=spec.model_dump(mode="json", by_alias=True, exclude_none=True))
        if id_file is not None and run_id is None:
            id_file.write_text(self.run.id)

    def write(self, m: dict, version: int) -> None:
        self.run.log(scalars(m), step=version)

    def close(self) -> None:
        self.run.finish()


@sink("metrics.jsonl")
def _jsonl(spec, run_dir, start, prom):
    return JsonlSink(run_dir.metrics, start) if run_dir else None


@sink("prometheus")
def _prometheus(spec, run_dir, start, prom):
    return PrometheusSink(prom) if prom is not None else None


@sink("tensorboard")
def _tensorboard(spec, run_dir, start, prom):
    if not (run_dir and spec.logging.tensorboard):
        return None
    return TensorBoardSink(run_dir.tensorboard, start)


@sink("wandb")
def _wandb(spec, run_dir, start, prom):
    return WandbSink(spec, run_dir) if spec.logging.wandb else None


def wandb_problems(spec: RLJobSpec, environ=os.environ) -> list[str]:
    """What keeps `logging.wandb` from working here (preflight)."""
    cfg = spec.logging.wandb
    if cfg is None:
        return []
    try:
        import wandb  # noqa: F401
    except ImportError:
        return ["logging.wandb: the wandb package is not installed here: pip install "
                "'rljob[wandb]' (or remove logging.wandb)"]
    if cfg.mode == "online" and not environ.get("WANDB_API_KEY") and not _netrc_has_wandb():
        return ["logging.wandb: mode online needs a W&B API key: set WANDB_API_KEY (on a "
                "cluster: logging.wandb.apiKeySecret), run `wandb login`, or use mode: "
                "offline"]
    return []


def _netrc_has_wandb() -> bool:
    import netrc

    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False
