"""`rljob` command line: crd, validate, render, plan, simulate, run, worker, bench."""

from __future__ import annotations

from pathlib import Path

import typer

from . import __version__
from .contract import (EXIT_PROBLEMS, MASTER_PORT, PASSWORD_ENV, TQ_PORT, WEIGHTS_PORT,
                       listen_address, local_address)
from .infra.cliutil import plain_metavars, version_callback

app = typer.Typer(
    name="rljob",
    help="RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: NAME metavars, no type tags on flags
    context_settings={"help_option_names": ["-h", "--help"]},
)

DEFAULT_CRD_PATH = Path("crds/rljob.yaml")
# arguments and options that several commands take, declared once
JOB_FILE = typer.Argument(..., help="RLJob YAML.")
PROFILE = typer.Option(None, help="Measured profile JSON (else analytic figures).")
JSON_OUT = typer.Option(False, "--json", help="Print one JSON object.")
DEBUG = {"on": False}


_print_version = version_callback("rljob")


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the whole traceback of an "
                               "unexpected error (default: one line)."),
) -> None:
    """RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs."""
    DEBUG["on"] = debug


@app.command()
def version() -> None:
    """Print the rljob version (as --version does)."""
    _print_version(True)


@app.command()
def crd(
    output: Path = typer.Option(
        DEFAULT_CRD_PATH, "--output", "-o", help="Where to write the CRD; '-' for stdout."
    ),
    check: bool = typer.Option(
        False, "--check", help="Exit 1 if OUTPUT differs from the generated CRD; write nothing."
    ),
) -> None:
    """Generate the RLJob CustomResourceDefinition from the API models."""
    from .api.crd import render_crd

    text = render_crd()
    if str(output) == "-":
        typer.echo(text, nl=False)
        return
    if check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            typer.echo(f"{output} is out of date: run `rljob crd -o {output}`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{output} is up to date")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output}")


@app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="RLJob YAML files ('-' reads stdin)."),
    cluster: bool = typer.Option(False, "--cluster", help="Check only what the apiserver "
                                 "and the operator check: the job's paths are the pods', "
                                 "not looked for on this machine."),
) -> None:
    """Check RLJob YAML offline: the apiserver's schema and rules (its wording), then,
    unless --cluster, what `rljob run` needs on this machine (files, dataset keys,
    reward, context length). Every problem is reported, one line each."""
    import sys

    from .api.validation import check_text
    from .preflight import check_text_here

    bad = 0
    for path in files:
        if str(path) == "-":
            source, text, base = "<stdin>", sys.stdin.read(), Path.cwd()
        else:
            source, base = str(path), path.resolve().parent
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                typer.echo(f"{source}: cannot read: {getattr(exc, 'strerror', None) or exc}", err=True)
                bad += 1
                continue
        problems = [p.full for p in check_text(text, source)]
        if not cluster:
            problems += check_text_here(text, base)
        for p in problems:
            typer.echo(f"{source}: {p}", err=True)
        if problems:
            bad += 1
        else:
            typer.echo(f"{source}: valid")
    if bad:
        raise typer.Exit(1)


@app.command()
def render(
    file: Path = JOB_FILE,
    namespace: str = typer.Option(None, "--namespace", "-n",
                                  help="Namespace of the objects (default: the file's, or default)."),
) -> None:
    """Print, as YAML, the Kubernetes objects the operator creates for an RLJob."""
    from .api.builders import build_all, new_password, to_yaml

    job = _load_job(file)
    if namespace:
        job.metadata.namespace = namespace
    job.metadata.namespace = job.metadata.namespace or "default"
    if not job.metadata.name:
        typer.echo(f"{file}: metadata.name is required to render the job's objects", err=True)
        raise typer.Exit(1)
    typer.echo(to_yaml(build_all(job, new_password())), nl=False)


def _load_job(path: Path):
    from .api.validation import RLJobError, load_rljob

    try:
        return load_rljob(str(path))
    except RLJobError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


def _local_job(path: Path):
    """The job as this machine runs it: relative paths read from the file's directory."""
    from .preflight import resolve_paths

    return resolve_paths(_load_job(path), path.resolve().parent)


def _job_model(path: Path, profile: Path | None):
    import time

    from .planner.job import job_model
    from .planner.profile import Profile

    job = _local_job(path)
    try:
        prof = Profile.load(profile) if profile else None
        if prof is not None:
            prof, notes = prof.fit(job.spec, time.time())
            for note in notes:
                typer.echo(f"{profile}: {note}", err=True)
            if prof is None:
                raise typer.Exit(1)
        return job, job_model(job.spec, prof)
    except (OSError, ValueError) as exc:
        typer.echo(f"{profile or path}: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("profile")
def profile_cmd(
    file: Path = JOB_FILE,
    out: Path = typer.Option(Path("profile.json"), "--out", "-o",
                             help="Where to write the profile (JSON)."),
    from_run: Path = typer.Option(None, "--from-run", help="A run directory of this job: "
                                  "its live profile (the engine's timed calls, the "
                                  "trainer's tokens/s and the workload of its last steps) "
                                  "instead of measuring here."),
    skip_steps: int = typer.Option(3, min=0, help="--from-run: steps left out at the "
                                   "start (start-up, compilation)."),
    last_steps: int = typer.Option(20, min=1, help="--from-run: the steps it reads."),
    train_steps: int = typer.Option(3, min=1, help="Timed trainer steps (offline)."),
) -> None:
    """Measure the job's profile: its rollout engine's decode-step seconds against
    batch size, its trainer's tokens/s and its workload, for `plan --profile`,
    `simulate --profile` and the operator."""
    from .planner.live import profile_from_run

    job = _local_job(file)
    try:
        if from_run is not None:
            prof = profile_from_run(from_run, job.spec, skip_steps, last_steps)
        else:
            from .profiler import measure

            prof = measure(job.spec, train_steps, log=lambda line: typer.echo(line, err=True))
    except (OSError, ValueError) as exc:
        typer.echo(f"{from_run or file}: {exc}", err=True)
        raise typer.Exit(1) from None
    prof.save(out)
    gen = prof.gen
    typer.echo(f"wrote {out} ({prof.meta['source']}): decode step "
               + ", ".join(f"{b:g} rows {p * 1e3:.2f} ms"
                           for b, p in zip(gen.batch_sizes, gen.ptl_seconds))
               + f"; prefill {gen.prefill_per_token * 1e6:.1f} us/token; trainer "
               f"{prof.train.tokens_per_second[-1]:.0f} tokens/s at "
               f"{prof.train.npus[-1]:g} rank(s); {len(prof.output_lengths)} responses, "
               f"mean {sum(prof.output_lengths) / max(len(prof.output_lengths), 1):.1f} "
               f"tokens, prompts {prof.prompt_tokens:.1f}")


@app.command()
def plan(
    file: Path = JOB_FILE,
    npus: int = typer.Option(None, help="Accelerators (NPUs, GPUs; cores on CPU) to split "
                             "between rollout and training (default: what the job asks "
                             "for now)."),
    cross: str = typer.Option(None, help="Separate pools 'ROLLOUT,TRAINER' (e.g. two "
                              "datacenters) instead of one --npus pool."),
    profile: Path = PROFILE,
    json_out: bool = JSON_OUT,
) -> None:
    """Split NPUs between rollout and training (StreamRL Algorithm 1)."""
    import json

    from .planner.allocation import Allocation
    from .planner.scaling import gain_of_one_more_replica

    job, model = _job_model(file, profile)
    spec = job.spec
    current = Allocation(spec.rollout.replicas, spec.rollout.replicas * model.npus_per_replica,
                         spec.trainer.world_size, model.tgen(spec.rollout.replicas),
                         model.ttrain(spec.trainer.world_size))
    cross = _plan_pools(file, spec, current, npus, cross)
    best = _best_allocation(file, model, npus or current.npus, cross)

    def row(a: Allocation) -> dict:
        return {"rollout_replicas": a.rollout_replicas, "rollout_npus": a.rollout_npus,
                "trainer_npus": a.trainer_npus, "gen_seconds": a.gen_seconds,
                "train_seconds": a.train_seconds, "step_seconds": a.step_seconds,
                "idle_ratio": a.idle_ratio,
                "gain_of_one_more_replica": gain_of_one_more_replica(
                    model.gen, model.workload, a.rollout_replicas)}

    out = {"job": job.metadata.name, "source": model.source, "plan": row(best),
           "pools": [int(x) for x in cross.split(",")] if cross else None,
           "current": row(current),
           "workload": {"samples": model.workload.samples,
                        "mean_output_tokens": model.workload.mean_output,
                        "max_output_tokens": model.workload.max_output}}
    if json_out:
        typer.echo(json.dumps(out, indent=2))
    else:
        _print_plan(job, model, out, cross)


def _plan_pools(file: Path, spec, current, npus: int | None, cross: str | None) -> str | None:
    """--cross as given; the job's own two pools when rollout and trainer run on
    different accelerators (rollout.accelerator / trainer.accelerator): never one
    pool to split (StreamRL §2.3)."""
    if spec.accelerator_for("rollout") == spec.accelerator_for("trainer") or cross:
        return cross
    if npus:
        typer.echo(f"{file}: rollout and trainer run on different accelerators: give their "
                   "pools with --cross ROLLOUT,TRAINER instead of --npus", err=True)
        raise typer.Exit(2)
    return f"{current.rollout_npus},{current.trainer_npus}"


def _best_allocation(file: Path, model, total: int, cross: str | None):
    """StreamRL's Algorithm 1 over one pool of `total`, or over the two pools of
    `cross` (ROLLOUT,TRAINER)."""
    from .planner.allocation import allocate_cross, allocate_single

    try:
        if not cross:
            return allocate_single(total, model.npus_per_replica, model.trainer_sizes(total),
                                   model.tgen, model.ttrain)
        try:
            rpool, tpool = (int(x) for x in cross.split(","))
        except ValueError:
            typer.echo("--cross takes two NPU counts: ROLLOUT,TRAINER (e.g. 32,16)", err=True)
            raise typer.Exit(2) from None
        return allocate_cross(rpool, tpool, model.npus_per_replica,
                              model.trainer_sizes(tpool), model.tgen, model.ttrain)
    except ValueError as exc:
        typer.echo(f"{file}: {exc}", err=True)
        raise typer.Exit(1) from None


def _print_plan(job, model, out: dict, cross: str | None) -> None:
    spec = job.spec
    units = {"cpu": "core", "gpu": "GPU"}
    unit = units.get(spec.accelerator_for("trainer").type, "NPU")
    r_unit = units.get(spec.accelerator_for("rollout").type, "NPU")
    pools = f"; separate pools {cross.replace(',', ' + ')}" if cross else ""
    _print_table(
        f"{job.metadata.name}: rollout/trainer split ({model.source}; trainer gangs fill "
        f"one node or whole nodes of {spec.trainer.npus_per_node} {unit}"
        f"{'s' if spec.trainer.npus_per_node != 1 else ''}{pools})",
        ("", "rollout", f"trainer {unit}s", "Tgen s", "Ttrain s", "step s", "idle",
         "δ′ of +1 replica s"),
        [(name, f"{r['rollout_replicas']} × {model.npus_per_replica} {r_unit}",
          str(r["trainer_npus"]), f"{r['gen_seconds']:.2f}", f"{r['train_seconds']:.2f}",
          f"{r['step_seconds']:.2f}", f"{r['idle_ratio']:.0%}",
          f"{r['gain_of_one_more_replica']:.2f}")
         for name, r in (("plan", out["plan"]), ("as specified", out["current"]))], 110)


def _print_table(title: str, columns, rows, width: int) -> None:
    """A right-aligned rich table, at least `width` wide (a pipe gets it whole)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, width)).print(table)


@app.command()
def simulate(
    file: Path = JOB_FILE,
    out: Path = typer.Option(Path("simulate.png"), "--out", "-o", help="Gantt chart PNG."),
    steps: int = typer.Option(20, help="Steps to simulate."),
    tail_sigma: float = typer.Option(0.6, help="Log-normal sigma of per-sample generation "
                                     "time (0 = every sample alike)."),
    weight_sync_seconds: float = typer.Option(None, help="Weight transfer time per step "
                                              "(default: model bytes at 10 GB/s)."),
    profile: Path = PROFILE,
    json_out: bool = JSON_OUT,
) -> None:
    """Simulate the job's pipeline in sync, periodic and async modes; write a Gantt PNG."""
    import json

    from .planner.job import pipeline_config
    from .planner.simulator import plot_gantt, simulate as run_sim

    job, model = _job_model(file, profile)
    k = job.spec.workflow.staleness_bound or 1
    variants = [("sync", False), ("periodic", True), ("async", True)]
    results = [run_sim(pipeline_config(model, mode, streaming, steps, tail_sigma,
                                       weight_sync_seconds)) for mode, streaming in variants]
    base = results[0].throughput
    rows = [{"mode": r.config.mode if r.config.mode != "async" else f"async(k={k})",
             "step_seconds": r.step_seconds, "samples_per_second": r.throughput,
             "speedup_vs_sync": r.throughput / base, "bubble_ratio": r.bubble_ratio,
             "max_staleness": max(r.staleness, default=0)} for r in results]
    window = max(r.makespan for r in results)  # one time axis, every mode to its end
    plot_gantt(results, str(out), window=window,
               title=f"{job.metadata.name}: simulated pipeline, {steps} steps ({model.source})")
    if json_out:
        typer.echo(json.dumps({"job": job.metadata.name, "modes": rows, "gantt": str(out)},
                              indent=2))
        return
    _print_table(
        f"{job.metadata.name}: simulated pipeline, {steps} steps ({model.source})",
        ("mode", "step s", "samples/s", "vs sync", "bubble ratio", "max staleness"),
        [(r["mode"], f"{r['step_seconds']:.2f}", f"{r['samples_per_second']:.1f}",
          f"{r['speedup_vs_sync']:.2f}x", f"{r['bubble_ratio']:.0%}", str(r["max_staleness"]))
         for r in rows], 100)
    typer.echo(f"wrote {out}")


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
    log_level: str = typer.Option("INFO", help="Log level."),
) -> None:
    """Run the TransferQueue controller (gRPC, health, metrics) until SIGTERM."""
    import asyncio
    import logging
    import os

    from .transferqueue.alloc import tune_allocator
    from .transferqueue.controller import ControllerError, check_lease_seconds
    from .transferqueue.service import (StorageError, TransferQueueService,
                                        UnitConfig, check_unit_url, serve)

    tune_allocator()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    password = os.environ.get(password_env) or None
    try:
        check_lease_seconds(lease_seconds)
        if redis:
            units = [UnitConfig("redis", check_unit_url(url), password) for url in redis]
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
    asyncio.run(serve(service, listen, metrics_port))


bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _report(bench, results: dict, json_out: bool) -> None:
    """A benchmark's results: one JSON object, or its own tables."""
    if json_out:
        import json

        typer.echo(json.dumps(results, indent=2))
    else:
        bench.render(results)


@bench_app.command("transferqueue")
def bench_transferqueue(
    redis: str = typer.Option(None, help="Use this Redis URL instead of starting a redis-server."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    quick: bool = typer.Option(False, help="A quarter of the data: a faster, noisier run."),
) -> None:
    """put+get MB/s and claim latency of TransferQueue next to raw Redis."""
    from .bench import transferqueue as bench

    _report(bench, bench.run(redis, quick=quick), json_out)


@bench_app.command("dispatch")
def bench_dispatch(
    seeds: int = typer.Option(5, help="Synthetic steps per scenario."),
    json_out: bool = JSON_OUT,
) -> None:
    """Makespan of random vs skew-aware vs oracle dispatch on a long-tail workload."""
    from .bench import dispatch as bench

    _report(bench, bench.run(seeds, progress=lambda line: typer.echo(line, err=True)),
            json_out)


@bench_app.command("workflow")
def bench_workflow(
    steps: int = typer.Option(12, help="Steps per mode (the first 3 are not measured)."),
    keep: Path = typer.Option(None, help="Keep the run directories here."),
    rounds: int = typer.Option(2, min=1, help="Rounds of the four modes; medians are printed."),
    prompts: int = typer.Option(None, min=1, help="Prompts per step (16 samples each, one "
                                "micro-batch per prompt; default: the size a short probe "
                                "of this machine finds balances generation and training)."),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", min=1,
                                     help="rollout.maxNumSeqs of the job (default: the "
                                     "spec's default)."),
    peer: str = typer.Option(None, "--peer", help="trl: also run TRL's GRPOTrainer on the "
                             "same job in each round, configured for it and at its own "
                             "defaults, and print our ratio to each (needs `pip install "
                             "trl`)."),
    algorithm: str = typer.Option("grpo", help="grpo, or ppo (the same job trained with a "
                                  "critic streaming through its own task)."),
    lend_cores: bool = typer.Option(False, "--lend-cores", help="Run our modes with "
                                    "`rljob run --lend-cores`."),
    json_out: bool = JSON_OUT,
) -> None:
    """The same small job in sync, periodic, async(1) and async(2): tokens/s, bubbles,
    speedups, bounds."""
    from .bench import workflow as bench

    if algorithm not in ("grpo", "ppo"):
        raise typer.BadParameter("use grpo or ppo", param_hint="--algorithm")
    _report(bench, bench.run(steps, keep, rounds, prompts, max_num_seqs, peer, algorithm,
                             lend_cores), json_out)


@bench_app.command("offpolicy")
def bench_offpolicy(
    file: Path = JOB_FILE,
    steps: int = typer.Option(None, min=1, help="Steps per run (default: the job's "
                              "algorithm.maxSteps)."),
    last: int = typer.Option(30, min=1, help="The reward compared is the mean of this many "
                             "last steps."),
    seeds: int = typer.Option(1, min=1, help="Runs per configuration, each with its own "
                              "algorithm.seed; their means are printed."),
    temperature: float = typer.Option(None, help="rollout.temperature of every run."),
    top_p: float = typer.Option(None, "--top-p", help="rollout.topP of every run."),
    keep: Path = typer.Option(None, help="Keep the run directories here."),
    json_out: bool = JSON_OUT,
) -> None:
    """The job in sync, then async(1) and async(2) under each offPolicyCorrection (none,
    tis, mis): the reward of the last steps next to sync's, the clipped share, the
    importance weights and the engine mismatch."""
    from .bench import offpolicy as bench

    job = _local_job(file)
    _report(bench, bench.run(job, str(file), steps, last, seeds, temperature, top_p,
                             keep=keep, progress=lambda line: typer.echo(line, err=True)),
            json_out)


@bench_app.command("engines")
def bench_engines(
    steps: int = typer.Option(20, min=5, help="Steps per engine (the first 3 are not "
                              "measured)."),
    rounds: int = typer.Option(1, min=1, help="Rounds of the two engines; medians are "
                               "printed."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1,
                                     help="rollout.maxNumSeqs of the job."),
    keep: Path = typer.Option(None, help="Keep the run directories here."),
    json_out: bool = JSON_OUT,
) -> None:
    """The same small job with the hf and the vllm rollout engine: generated tokens/s,
    weight-update seconds, steps/s."""
    from .bench import engines as bench

    _report(bench, bench.run(steps, rounds, max_num_seqs, keep), json_out)


@bench_app.command("optimisations")
def bench_optimisations(
    steps: int = typer.Option(12, min=4, help="Steps per configuration (the first 2 are "
                              "not measured)."),
    rounds: int = typer.Option(2, min=1, help="Rounds of every configuration; medians are "
                               "printed."),
    config: list[str] = typer.Option([], "--config", metavar="NAME",
                                     help="Run only these configurations (repeat)."),
    keep: Path = typer.Option(None, help="Keep the run directories here."),
    json_out: bool = JSON_OUT,
) -> None:
    """The papers' mechanisms, each off and on side by side: skew-aware dispatch (and an
    oracle ranker; one and two replicas), arrival-order micro-batches, StreamRL's ablation
    (sync, + skew-aware, + streaming, + async), sequence packing, shared-prompt attention
    and the token-balanced data-parallel split."""
    from .bench import optimisations as bench

    _report(bench, bench.run(steps, rounds, keep, config or None), json_out)


@bench_app.command("weights")
def bench_weights(
    rounds: int = typer.Option(3, min=1, help="Versions sent over each transport; medians "
                               "are printed."),
    layers: int = typer.Option(None, min=1, help="Transformer layers (Qwen2-0.5B: 24)."),
    dtype: str = typer.Option("bfloat16", help="The weights' dtype."),
    json_out: bool = JSON_OUT,
) -> None:
    """One weight version to a replica in another process over grpc and collective
    (gloo): publish, transfer and update seconds side by side."""
    from .bench import weights as bench

    _report(bench, bench.run(rounds, layers, dtype), json_out)


@bench_app.command("calibration")
def bench_calibration(
    steps: int = typer.Option(12, min=5, help="Steps of each mode's run."),
    keep: Path = typer.Option(None, help="Keep the runs in this directory."),
    json_out: bool = JSON_OUT,
) -> None:
    """The bench workflow job in sync, periodic and async(1): measured seconds a step
    against the simulator's, fed with the runs' live profiles."""
    from .bench import calibration as bench

    _report(bench, bench.run(steps, keep), json_out)


@bench_app.command("weight-memory")
def bench_weight_memory(
    tp: int = typer.Option(2, min=1, help="The vLLM replica's tensor-parallel workers."),
    bucket_mb: int = typer.Option(16, min=1, help="The collective path's bucket size, MB."),
    json_out: bool = JSON_OUT,
) -> None:
    """One weight update to a tensor-parallel vLLM replica (needs vLLM), over grpc and
    collective: each worker's peak memory growth during it."""
    from .bench import weight_memory as bench

    _report(bench, bench.run(tp, bucket_mb), json_out)


@bench_app.command("trainer")
def bench_trainer(
    engines: str = typer.Option("torch,megatron", help="Trainer engines, comma-separated "
                                "(torch, megatron)."),
    accelerator: str = typer.Option("cpu", help="cpu, or gpu (the first CUDA device)."),
    model: str = typer.Option("tiny", help="tiny (examples/models/tiny-qwen2) or qwen2-0.5b "
                              "(Qwen2-0.5B's shapes); random init either way."),
    steps: int = typer.Option(5, min=1, help="Timed optimizer steps; medians are printed."),
    warmup: int = typer.Option(2, min=0, help="Optimizer steps before the timed ones."),
    prompt_len: int = typer.Option(16, "--prompt-len", min=1, help="Prompt tokens per sample."),
    response_len: int = typer.Option(32, "--response-len", min=1,
                                     help="Response tokens per sample."),
    group: int = typer.Option(8, min=2, help="Samples per prompt (GRPO's group)."),
    micro_batch: int = typer.Option(8, "--micro-batch", min=1,
                                    help="Samples per micro-batch."),
    micro_batches: int = typer.Option(2, "--micro-batches", min=1,
                                      help="Micro-batches per optimizer step."),
    json_out: bool = JSON_OUT,
) -> None:
    """The trainer's GRPO step with each trainer engine (torch, megatron) side by side:
    step seconds, trained tokens/s, peak device memory, optimizer state."""
    from .bench import trainer as bench

    names = tuple(e.strip() for e in engines.split(",") if e.strip())
    try:
        results = bench.run(names, accelerator, model, steps, warmup, prompt_len, response_len,
                            group, micro_batch, micro_batches)
    except ValueError as exc:
        typer.echo(f"bench trainer: {exc}", err=True)
        raise typer.Exit(2) from None
    _report(bench, results, json_out)


def _job_spec(job_file: Path):
    return _load_job(job_file).spec


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
    from .transferqueue.alloc import tune_allocator
    from .trainer.worker import run_trainer

    import os

    _worker_logging()
    tune_allocator()
    if metrics_port and os.environ.get("LOCAL_RANK"):
        # torchrun starts one process per accelerator in the pod: one port each
        metrics_port += int(os.environ["LOCAL_RANK"])
    run_trainer(_job_spec(job), tq, weights_listen, rank, world_size, master, run_dir, resume,
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
    from .rollout.worker import run_rollout
    from .transferqueue.alloc import tune_allocator

    _worker_logging()
    tune_allocator()
    run_rollout(_job_spec(job), tq, weights, replica, run_dir, metrics_port)


@worker_app.command("driver")
def worker_driver(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    tq: str = typer.Option(..., help="TransferQueue controller address."),
    weights: str = typer.Option(..., help="Trainer rank 0's weight service address."),
    run_dir: Path = typer.Option(None, help="Run directory (unused by the driver)."),
    start_step: int = typer.Option(0, help="First step to release (resume); a step the "
                                   "table already holds is never released again."),
    max_steps: int = typer.Option(None, help="Override algorithm.maxSteps."),
    metrics_port: int = typer.Option(None, help="Serve Prometheus metrics on this port."),
) -> None:
    """Release each step's prompts as the workflow mode allows."""
    from .inputs.models import load_tokenizer
    from .workflow.driver import run_driver

    _worker_logging()
    spec = _job_spec(job)
    run_driver(spec, tq, weights, load_tokenizer(spec.model), start_step, max_steps,
               metrics_port=metrics_port)


@worker_app.command("preflight")
def worker_preflight(
    job: Path = typer.Option(..., help="RLJob YAML (the resolved spec)."),
    termination_log: Path = typer.Option(None, help="Where to write the problems for "
                                         "Kubernetes (default /dev/termination-log when it "
                                         "exists)."),
) -> None:
    """Check the job in its pod, volumes mounted (model, tokenizer, dataset keys,
    reward, context length); exit 3 with the problems as the termination message."""
    from . import preflight

    problems = preflight.check(_load_job(job), volumes_here=True)
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


@app.command()
def run(
    file: Path = JOB_FILE,
    max_steps: int = typer.Option(None, "--max-steps", help="Override algorithm.maxSteps."),
    run_dir: Path = typer.Option(None, help="Run directory (default runs/NAME-TIMESTAMP)."),
    resume: Path = typer.Option(None, help="Continue the run in this directory from its "
                                "last checkpoint."),
    redis: list[str] = typer.Option([], "--redis", metavar="URL",
                                    help="Redis URL(s) for TransferQueue "
                                    "storage units (default: in-process memory)."),
    wide: bool = typer.Option(False, "--wide", help="Show each step's off-policy figures "
                              "too: clipped share, importance weights (mean, max, capped "
                              "share, effective sample size) and the engine mismatch."),
    lend_cores: bool = typer.Option(False, "--lend-cores",
                                    help="A side that waits lends its cores to the other "
                                    "(the trainer computes on a parked rollout's cores, a "
                                    "rollout on a waiting trainer's); hf engine, torch "
                                    "trainer. Off by default: on the tiny model it costs "
                                    "more than it gives (README, Performance)."),
) -> None:
    """Run the job on this machine as local processes, with a live view."""
    import signal
    import time

    from rich.console import Console

    from .infra.rundir import RunDir
    from .liveview import RunView
    from .infra.devices import describe as describe_devices
    from .local import JobFailed, LocalRun, cluster_only_fields, write_plots
    from .preflight import check as preflight

    source = RunDir(resume).job_file if resume else file
    job = _local_job(source)
    # a local run reads every path here, a PVC's too
    problems = preflight(job, source.resolve().parent, volumes_here=True)
    if problems:  # before anything starts
        for p in problems:
            typer.echo(f"{source}: {p}", err=True)
        raise typer.Exit(1)
    if resume:
        directory = resume
    else:
        directory = run_dir or Path("runs") / f"{job.metadata.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    runner = LocalRun(job, directory, redis=list(redis), max_steps=max_steps, resume=bool(resume),
                      lend_cores=lend_cores)
    console = Console()
    console.print(f"run directory: {directory}")
    try:  # each trainer rank and rollout replica its own accelerators (infra/devices.py)
        plan = runner.devices
    except ValueError as exc:
        typer.echo(f"{source}: {exc}", err=True)
        raise typer.Exit(1) from None
    if plan:
        console.print(describe_devices(plan, {w: job.spec.accelerator_for(w.split("-")[0]).type
                                              for w in plan}), soft_wrap=True)
    ignored = cluster_only_fields(job)
    if ignored:
        console.print(f"not applied on this machine (cluster only): {', '.join(ignored)}",
                      soft_wrap=True)
    view = RunView(runner, job, console, 0 if resume else job.spec.model.warmup_steps,
                   time.monotonic(), wide)

    class Interrupted(BaseException):  # like KeyboardInterrupt: no `except Exception` eats it
        pass

    def on_signal(signum, _frame):
        raise Interrupted(signum)

    # SIGINT too: a run started in the background of a script inherits it ignored
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    status = 0
    try:
        runner.start()
        with view.open() as live:
            while not runner.supervise():
                live.update(view.render())
                time.sleep(0.5)
            live.update(view.render())
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT
        status = 128 + signum
        console.print(f"interrupted ({signal.Signals(signum).name}): stopping; the trainer "
                      "checkpoints what it trained")
    except (JobFailed, RuntimeError, TimeoutError) as exc:
        status = 1
        console.print(f"[red]run failed[/red]: {exc}")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        runner.stop()
        if status == 0:
            runner.purge_storage()  # a finished job's table is nobody's
    view.summary(directory, write_plots(directory), status, file)
    if status:
        raise typer.Exit(status)


def main() -> None:
    """`rljob`: an unexpected error ends in one line and exit 1 (`--debug`: the whole
    traceback); the pods' `rljob worker ...` keep their tracebacks for the logs."""
    import sys

    import typer.main

    cmd = typer.main.get_command(app)
    plain_metavars(cmd)
    try:
        cmd(prog_name="rljob")
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, not a traceback
        if DEBUG["on"] or sys.argv[1:2] == ["worker"]:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        typer.echo(f"rljob: error: {type(exc).__name__}: {first} (rljob --debug ... shows "
                   "the traceback)", err=True)
        sys.exit(1)
