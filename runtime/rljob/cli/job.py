"""The job's own commands: version, crd, validate, render and run (the job on this
machine as local processes, with a live view)."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import JOB_FILE, app, load_job, local_job, print_version

DEFAULT_CRD_PATH = Path("crds/rljob.yaml")
# `rljob render`'s Redis password unless --fresh-secret: the same text every time
RENDER_PASSWORD = "rendered-placeholder"


@app.command()
def version() -> None:
    """Print the rljob version (as --version does)."""
    print_version(True)


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
    from ..api.crd import render_crd

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

    from ..api.validation import check_text
    from ..preflight import check_text_here

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
    fresh_secret: bool = typer.Option(
        False, "--fresh-secret", help="A new random Redis password, job token and (with "
        "transferQueue.tls) CA and certificate in the Secret, as the operator makes them. "
        f"Without it the Secret holds the fixed placeholder {RENDER_PASSWORD!r} for each, "
        "so two renders of one file are the same text."),
    network_policy: bool = typer.Option(
        True, "--network-policy/--no-network-policy",
        help="The job's NetworkPolicy, as an operator with networkPolicy.enabled makes it."),
    operator_namespace: str = typer.Option(
        "rljob-system", metavar="NAMESPACE",
        help="The operator's namespace, whose operator pods the policy admits."),
    monitoring_namespace: list[str] = typer.Option(
        ["monitoring"], "--monitoring-namespace", metavar="NAMESPACE",
        help="A namespace the policy admits to the metrics ports (repeat)."),
) -> None:
    """Print, as YAML, the Kubernetes objects the operator creates for an RLJob."""
    from ..api.builders import NetworkAccess, build_all, new_password, to_yaml
    from ..contract import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
    from ..infra import tls
    from ..infra.auth import new_token

    job = load_job(file)
    if namespace:
        job.metadata.namespace = namespace
    job.metadata.namespace = job.metadata.namespace or "default"
    if not job.metadata.name:
        typer.echo(f"{file}: metadata.name is required to render the job's objects", err=True)
        raise typer.Exit(1)
    password = new_password() if fresh_secret else RENDER_PASSWORD
    token = new_token() if fresh_secret else RENDER_PASSWORD
    pems = None  # transferQueue.tls: the job's CA and certificate, made or a placeholder
    if job.spec.transfer_queue.tls:
        pems = (tls.make().env() if fresh_secret
                else dict.fromkeys((TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV), RENDER_PASSWORD))
    access = NetworkAccess(network_policy, operator_namespace or None, tuple(monitoring_namespace))
    typer.echo(to_yaml(build_all(job, password, token=token, access=access, tls=pems)),
               nl=False)


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
    pin_cores: bool = typer.Option(
        True, "--pin-cores/--no-pin-cores", envvar="RLJOB_PIN_CORES",
        help="Pin each trainer rank and rollout replica to cores of its own. Off: each "
             "computes with as many threads as it would have cores, where the OS places "
             "it: faster where several runs or other work share the machine (pinned, "
             "each run's trainer takes the same first core). --lend-cores pins "
             "regardless."),
    lend_cores: bool = typer.Option(False, "--lend-cores",
                                    help="A side that waits lends its cores to the other "
                                    "(the trainer computes on a parked rollout's cores, a "
                                    "rollout on a waiting trainer's); hf engine, torch "
                                    "trainer. Off by default: on the tiny model it costs "
                                    "more than it gives (docs/benchmarks/placement.md, \"Lending an "
                                    "idle core\")."),
    torch_profile: str = typer.Option(
        None, "--torch-profile", envvar="RLJOB_TORCH_PROFILE", metavar="FIRST-LAST",
        help="Record torch's profiler over these steps (counted from 1, as in "
             "metrics.jsonl) in the trainer's rank 0 and each hf rollout replica: "
             "RUN_DIR/profiles/WORKER.json (a trace for chrome://tracing or Perfetto), "
             ".txt (operators by their own time) and .summary.json."),
) -> None:
    """Run the job on this machine as local processes, with a live view."""
    import signal
    import time

    from rich.console import Console

    from ..infra.rundir import RunDir
    from ..infra.torchprof import parse_steps
    from ..liveview import RunView
    from ..infra.devices import describe as describe_devices
    from ..local import JobFailed, LocalRun, cluster_only_fields, write_plots
    from ..preflight import check as preflight

    if torch_profile is not None:
        try:
            parse_steps(torch_profile)
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
    source = RunDir(resume).job_file if resume else file
    job = local_job(source)
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
                      lend_cores=lend_cores, pin_cores=pin_cores, torch_profile=torch_profile)
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
                   time.monotonic(), wide, resumed=bool(resume))

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
        if view.this_run() or resume:
            console.print(f"interrupted ({signal.Signals(signum).name}): stopping; the "
                          "trainer checkpoints what it trained")
        else:
            console.print(f"interrupted ({signal.Signals(signum).name}) before the first RL "
                          "step: stopping (nothing trained to checkpoint; run it again to "
                          "start over)")
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


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="A run directory of `rljob run`."),
    out: Path = typer.Argument(..., help="Where to write the model (a new directory)."),
    step: int = typer.Option(None, "--step", min=0, help="The checkpoint's step (default "
                             "the newest)."),
    merge: bool = typer.Option(False, "--merge", help="A LoRA job's: the model with the "
                               "adapter merged in, not the adapter alone."),
) -> None:
    """Write a checkpoint as Hugging Face loads it: the model and its tokenizer, or a
    LoRA job's adapter in PEFT's format (with --merge, the merged model, which
    transformers and vLLM load as they are)."""
    from ..trainer.export import ExportError, export as write

    try:
        typer.echo(f"wrote {out}: {write(run_dir, out, step, merge)}")
    except ExportError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
