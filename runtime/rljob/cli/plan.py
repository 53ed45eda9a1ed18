"""Planning commands: profile (measure the job), plan (split accelerators between
rollout and training, StreamRL's Algorithm 1) and simulate (the pipeline's modes)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import JOB_FILE, JSON_OUT, PROFILE, app, local_job


def _job_model(path: Path, profile: Path | None):
    import time

    from ..planner.job import job_model
    from ..planner.profile import Profile

    job = local_job(path)
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
    from ..planner.live import profile_from_run

    job = local_job(file)
    try:
        if from_run is not None:
            prof = profile_from_run(from_run, job.spec, skip_steps, last_steps)
        else:
            from ..profiler import measure

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

    from ..planner.allocation import Allocation
    from ..planner.scaling import gain_of_one_more_replica

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
        _print_plan(job, model, out, cross, file)


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
    from ..planner.allocation import allocate_cross, allocate_single

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


def _print_plan(job, model, out: dict, cross: str | None, file: Path) -> None:
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
    from rich.console import Console

    say = Console().print  # wrapped to a terminal's width, whole words
    say(why(out["plan"], out["current"], unit, r_unit), markup=False, highlight=False)
    if model.source.startswith("analytic") and _small_model(model):
        say(f"analytic: a roofline of the model's FLOPs and bytes on a typical "
                   f"{model.hardware.name}, which a model this small misses (its steps cost "
                   f"per-step overheads it does not count): `rljob profile {file} "
                   "--from-run RUN_DIR` reads a short run of the job (`rljob profile "
                   f"{file}` measures each side alone), then `rljob plan --profile "
                   "profile.json`",
            markup=False, highlight=False)


def why(plan: dict, current: dict, unit: str, r_unit: str) -> str:
    """One line on the plan against the job as specified (pure)."""
    if (plan["rollout_replicas"], plan["trainer_npus"]) == (
            current["rollout_replicas"], current["trainer_npus"]):
        return "the split as specified is the fastest of those tried"
    slower = "training" if current["train_seconds"] >= current["gen_seconds"] else "generation"
    n_plan, n_cur = plan["trainer_npus"], current["trainer_npus"]
    moves = [f"the trainer {n_cur} → {n_plan} {unit}{'s' if n_plan != 1 else ''}"
             if n_plan != n_cur else "",
             f"rollout {current['rollout_replicas']} → {plan['rollout_replicas']} "
             f"replica{'s' if plan['rollout_replicas'] != 1 else ''}"
             if plan["rollout_replicas"] != current["rollout_replicas"] else ""]
    head = (f"why another split: as specified, {slower} is the slower side (Tgen "
            f"{current['gen_seconds']:.2f} s, Ttrain {current['train_seconds']:.2f} s); "
            f"{', '.join(m for m in moves if m)}")
    freed = (current["rollout_npus"] + current["trainer_npus"]
             - plan["rollout_npus"] - plan["trainer_npus"])
    if plan["step_seconds"] >= current["step_seconds"] * 0.99 and freed > 0:
        return (f"{head} keeps a step at {plan['step_seconds']:.2f} s with {freed} "
                f"{unit}{'s' if freed != 1 else ''} fewer")
    return (f"{head} takes a step from {current['step_seconds']:.2f} s to "
            f"{plan['step_seconds']:.2f} s")


def _small_model(model) -> bool:
    """A model whose roofline the per-step overheads swamp (under 100M parameters)."""
    from ..planner.job import model_shape

    try:
        return model_shape(model.spec).params < 100e6
    except ValueError:
        return False


def _print_table(title: str, columns, rows, width: int) -> None:
    """A right-aligned rich table: on a terminal as wide as the terminal (headers and
    the title wrap, figures never do); elsewhere at least `width` wide, so a pipe or a
    log gets each row whole on one line."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True)
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    if not console.is_terminal:
        console = Console(width=max(console.width, width))
    console.print(table)


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

    from ..planner.job import pipeline_config
    from ..planner.simulator import plot_gantt, simulate as run_sim

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


