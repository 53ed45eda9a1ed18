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


def main() -> None:
    app()
