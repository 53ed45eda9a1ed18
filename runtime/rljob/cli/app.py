"""The `rljob` application: its options, the arguments several commands share, the
job loaders every command uses, and `main` (one line for an unexpected error)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..infra.cliutil import plain_metavars, version_callback

app = typer.Typer(
    name="rljob",
    help="RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: NAME metavars, no type tags on flags
    context_settings={"help_option_names": ["-h", "--help"]},
)

# arguments and options that several commands take, declared once
JOB_FILE = typer.Argument(..., help="RLJob YAML.")
PROFILE = typer.Option(None, help="Measured profile JSON (else analytic figures).")
JSON_OUT = typer.Option(False, "--json", help="Print one JSON object.")
DEBUG = {"on": False}


print_version = version_callback("rljob")


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                 help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the whole traceback of an "
                               "unexpected error (default: one line)."),
) -> None:
    """RLJob: disaggregated, asynchronous, streaming RL post-training of LLMs."""
    DEBUG["on"] = debug


def load_job(path: Path):
    from ..api.validation import RLJobError, load_rljob

    try:
        return load_rljob(str(path))
    except RLJobError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


def local_job(path: Path):
    """The job as this machine runs it: relative paths read from the file's directory."""
    from ..preflight import resolve_paths

    return resolve_paths(load_job(path), path.resolve().parent)


def main() -> None:
    """`rljob`: an unexpected error ends in one line and exit 1 (`--debug`: the whole
    traceback); the pods' `rljob worker ...` keep their tracebacks for the logs."""
    import sys

    import typer.main

    cmd = typer.main.get_command(app)
    plain_metavars(cmd)
    worker = sys.argv[1:2] == ["worker"]
    try:
        cmd(prog_name="rljob")
    except SystemExit as exc:
        if not worker:
            raise
        # a worker (a pod's main process; torch imported) ends without Python's
        # finalization: 2.4 s of a core saved at every pod's end and restart
        from ..infra.quickexit import end, exit_code

        end(exit_code(exc))
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, not a traceback
        if DEBUG["on"] or worker:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        typer.echo(f"rljob: error: {type(exc).__name__}: {first} (rljob --debug ... shows "
                   "the traceback)", err=True)
        sys.exit(1)
