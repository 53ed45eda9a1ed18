"""`rljob` command line: crd, validate (more subcommands join as they land)."""

from __future__ import annotations

from pathlib import Path

import typer

from . import __version__

app = typer.Typer(
    name="rljob",
    help="RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_CRD_PATH = Path("crds/rljob.yaml")


@app.command()
def version() -> None:
    """Print the rljob version."""
    typer.echo(__version__)


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
) -> None:
    """Check RLJob YAML offline with the messages the apiserver gives."""
    import sys

    from .api.validation import check_text

    bad = 0
    for path in files:
        if str(path) == "-":
            source, text = "<stdin>", sys.stdin.read()
        else:
            source = str(path)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                typer.echo(f"{source}: cannot read: {getattr(exc, 'strerror', None) or exc}", err=True)
                bad += 1
                continue
        problems = check_text(text, source)
        for p in problems:
            typer.echo(f"{source}: {p.text}", err=True)
        if problems:
            bad += 1
        else:
            typer.echo(f"{source}: valid")
    if bad:
        raise typer.Exit(1)


worker_app = typer.Typer(help="Pod entrypoints of the job's components.", no_args_is_help=True)
app.add_typer(worker_app, name="worker")


@worker_app.command("transferqueue")
def worker_transferqueue(
    listen: str = typer.Option("0.0.0.0:50051", help="gRPC listen address."),
    job: str = typer.Option("rljob", help="Job name: prefixes every storage key."),
    redis: list[str] = typer.Option(
        [], "--redis", help="Redis URL of a storage unit, once per unit; none = memory units."),
    memory_units: int = typer.Option(1, help="In-process memory units when no --redis is given."),
    password_env: str = typer.Option(
        "RLJOB_TQ_PASSWORD", help="Environment variable holding the Redis password."),
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
    from .transferqueue.service import TransferQueueService, UnitConfig, serve

    tune_allocator()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    password = os.environ.get(password_env) or None
    if redis:
        units = [UnitConfig("redis", url, password) for url in redis]
    else:
        units = [UnitConfig("memory") for _ in range(memory_units)]
    try:
        service = TransferQueueService(job, units, lease_seconds, max_row_bytes)
    except Exception as exc:  # bad URL, unreachable config: one clear line
        typer.echo(f"transferqueue: {exc}", err=True)
        raise typer.Exit(2) from None
    asyncio.run(serve(service, listen, metrics_port))


bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@bench_app.command("transferqueue")
def bench_transferqueue(
    redis: str = typer.Option(None, help="Use this Redis URL instead of starting a redis-server."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    quick: bool = typer.Option(False, help="A quarter of the data: a faster, noisier run."),
) -> None:
    """put+get MB/s and claim latency of TransferQueue next to raw Redis."""
    import json

    from .bench import transferqueue as bench

    results = bench.run(redis, quick=quick)
    if json_out:
        typer.echo(json.dumps(results, indent=2))
    else:
        bench.render(results)


def main() -> None:
    app()
