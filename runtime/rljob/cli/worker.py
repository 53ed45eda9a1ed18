"""`rljob worker ROLE`: the pods' entrypoints (transferqueue, trainer, rollout,
reward, driver, preflight), whose flags `contract.worker_argv` writes."""

from __future__ import annotations

from pathlib import Path

import typer

from ..contract import (EXIT_PROBLEMS, MASTER_PORT, PASSWORD_ENV, TQ_PORT, WEIGHTS_PORT,
                        listen_address, local_address)
from .app import app, load_job

worker_app = typer.Typer(help="Pod entrypoints of the job's components.", no_args_is_help=True)
app.add_typer(worker_app, name="worker")


@worker_app.command("transferqueue")
def worker_transferqueue(
    listen: str = typer.Option(listen_address(TQ_PORT), help="gRPC listen address."),
    job: str = typer.Option("rljob", help="Job name: prefixes every storage key."),
    redis: list[str] = typer.Option(
        [], "--redis", help="Redis URL of a storage unit, once per unit; none = memory units."),
    memory_units: int = typer.Option(1, help="In-process memory units when no --redis is given."),
    password_env: str = typer.Option(
        PASSWORD_ENV, help="Environment variable holding the Redis password."),
    lease_seconds: float = typer.Option(60.0, help="Claims expire after this many seconds."),
    max_row_bytes: int = typer.Option(64 << 20, help="Largest row accepted, bytes."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
    health_port: int = typer.Option(
        None, help="Serve gRPC health alone on this port, in plain text (for probes)."),
    log_level: str = typer.Option("INFO", help="Log level."),
) -> None:
    """Run the TransferQueue controller (gRPC, health, metrics) until SIGTERM."""
    import asyncio
    import logging
    import os

    from ..infra.heap import importing

    with importing():
        from ..transferqueue.alloc import tune_allocator
        from ..transferqueue.service import TransferQueueService, serve
        from ..transferqueue.state import ControllerError, check_lease_seconds
        from ..transferqueue.units import StorageError, UnitConfig, check_unit_url, redis_user

    tune_allocator()
    _become("transferqueue", job=job)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    password = os.environ.get(password_env) or None
    try:
        check_lease_seconds(lease_seconds)
        if redis:
            units = [UnitConfig("redis", check_unit_url(url), password, redis_user())
                     for url in redis]
        else:
            units = [UnitConfig("memory") for _ in range(memory_units)]
    except (ControllerError, StorageError) as exc:
        typer.echo(f"transferqueue: --{'lease-seconds' if isinstance(exc, ControllerError) else 'redis'}"
                   f": {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        service = TransferQueueService(job, units, lease_seconds, max_row_bytes)
    except Exception as exc:  # a wrong password, storage that never came up: one clear line
        typer.echo(f"transferqueue: {exc}", err=True)
        raise typer.Exit(2) from None
    asyncio.run(serve(service, listen, metrics_port, health_port=health_port))


def _become(role: str, index: int | None = None, of: int | None = None,
            job: str | None = None) -> None:
    """This process titled as its `role` in the job (`ps`, `top`), and, as a worker of
    `rljob run`, bound to live no longer than seconds past it (infra/lifeline.py)."""
    import os

    from ..contract import LIFELINE_ENV
    from ..infra.lifeline import watch_parent
    from ..infra.proctitle import set_title

    set_title(role, index, of, job)
    if os.environ.get(LIFELINE_ENV) == "1":
        watch_parent()


def _job_spec(job_file: Path, role: str, index: int | None = None, of: int | None = None):
    """The job's spec, this process become its `role` in the job."""
    job = load_job(job_file)
    _become(role, index, of, job.metadata.name)
    return job.spec


def _worker_logging(level: str = "INFO") -> None:
    import logging

    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@worker_app.command("trainer")
def worker_trainer(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    tq: str = typer.Option(..., help="TransferQueue controller address."),
    weights_listen: str = typer.Option(listen_address(WEIGHTS_PORT),
                                       help="Where rank 0 serves weights."),
    rank: int = typer.Option(0, envvar="RANK"),
    world_size: int = typer.Option(1, envvar="WORLD_SIZE"),
    master: str = typer.Option(local_address(MASTER_PORT),
                               help="MASTER_ADDR:MASTER_PORT of the gang."),
    run_dir: Path = typer.Option(None, help="Metrics, spans, checkpoints, final weights."),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in run-dir."),
    max_steps: int = typer.Option(None, help="Override algorithm.maxSteps."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
) -> None:
    """One rank of the trainer gang."""
    import os

    from ..infra.heap import importing

    with importing():
        from ..transferqueue.alloc import tune_allocator
        from ..trainer.worker import run_trainer

    _worker_logging()
    tune_allocator()
    if metrics_port and os.environ.get("LOCAL_RANK"):
        # torchrun starts one process per accelerator in the pod: one port each
        metrics_port += int(os.environ["LOCAL_RANK"])
    spec = _job_spec(job, "trainer", rank, world_size)
    run_trainer(spec, tq, weights_listen, rank, world_size, master, run_dir, resume,
                max_steps, metrics_port, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


@worker_app.command("rollout")
def worker_rollout(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    tq: str = typer.Option(..., help="TransferQueue controller address."),
    weights: str = typer.Option(..., help="Trainer rank 0's weight service address."),
    replica: int = typer.Option(0, help="Replica index."),
    run_dir: Path = typer.Option(None, help="Where to log spans."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
) -> None:
    """One rollout replica."""
    from ..infra.heap import importing

    with importing():
        from ..rollout.worker import run_rollout
        from ..transferqueue.alloc import tune_allocator

    _worker_logging()
    tune_allocator()
    run_rollout(_job_spec(job, "rollout", replica), tq, weights, replica, run_dir, metrics_port)


@worker_app.command("reward")
def worker_reward(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    tq: str = typer.Option(..., help="TransferQueue controller address."),
    replica: int = typer.Option(0, help="Replica index."),
    run_dir: Path = typer.Option(None, help="Where to log spans."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
) -> None:
    """One reward replica (reward.url, reward.model): scores the finished samples."""
    from ..infra.heap import importing

    with importing():
        from ..scorer.worker import run_reward

    _worker_logging()
    spec = _job_spec(job, "reward", replica)
    if not spec.reward.streamed:
        typer.echo("reward: the job has no reward.url nor reward.model: its rollouts score "
                   "the samples", err=True)
        raise typer.Exit(2)
    run_reward(spec, tq, replica, run_dir, metrics_port)


@worker_app.command("driver")
def worker_driver(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    tq: str = typer.Option(..., help="TransferQueue controller address."),
    weights: str = typer.Option(..., help="Trainer rank 0's weight service address."),
    run_dir: Path = typer.Option(None, help="Run directory: the driver's timeline (its puts)."),
    start_step: int = typer.Option(0, help="First step to release (resume); a step the "
                                   "table already holds is never released again."),
    max_steps: int = typer.Option(None, help="Override algorithm.maxSteps."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
    stay: bool = typer.Option(False, help="Once done, stay until terminated (in a pod: "
                              "a container that exits is restarted, and its pod is not "
                              "Ready meanwhile)."),
) -> None:
    """Release each step's prompts as the workflow mode allows."""
    import logging
    import signal
    import sys

    from ..infra.heap import importing

    with importing():
        from ..inputs.models import load_tokenizer
        from ..workflow.driver import run_driver

    # in a pod the driver is its container's PID 1, which ignores SIGTERM unless it
    # handles it (the pod would wait out its grace period): it ends at once, losing
    # nothing (a step is released once, and a restarted driver skips what the table holds)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    _worker_logging()
    spec = _job_spec(job, "driver")
    run_driver(spec, tq, weights, load_tokenizer(spec.model), start_step, max_steps,
               metrics_port=metrics_port, run_dir=run_dir)
    if stay:
        # the TransferQueue controller beside it serves the job's table and stats
        # until the job's children go (ttlSecondsAfterFinished)
        logging.getLogger("rljob.driver").info(
            "every step released and the last version published; staying until terminated")
        while True:
            signal.pause()


@worker_app.command("preflight")
def worker_preflight(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    termination_log: Path = typer.Option(None, help="Where to write the problems for "
                                         "Kubernetes (default /dev/termination-log when it "
                                         "exists)."),
) -> None:
    """Check the job in its pod, volumes mounted (model, tokenizer, dataset keys,
    reward, context length); exit 3 with the problems as the termination message."""
    from .. import preflight

    problems = preflight.check(load_job(job), volumes_here=True)
    for p in problems:
        typer.echo(p, err=True)
    if not problems:
        typer.echo("preflight: the job's model, tokenizer, dataset and reward check out")
        return
    out = termination_log or (preflight.TERMINATION_LOG
                              if preflight.TERMINATION_LOG.exists() else None)
    if out is not None:
        out.write_text(preflight.termination_message(problems), encoding="utf-8")
    raise typer.Exit(EXIT_PROBLEMS)


