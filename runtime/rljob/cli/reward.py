"""`rljob reward serve`: a reward function served on reward.url's protocol."""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app

reward_app = typer.Typer(help="Rewards: serve one on reward.url's protocol.",
                         no_args_is_help=True)
app.add_typer(reward_app, name="reward")


@reward_app.command("serve")
def reward_serve(
    name: str = typer.Argument(..., help="The reward, as reward.name takes it: a built-in "
                               "name, module:function or path/to/reward.py:function."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every "
                             "interface)."),
    port: int = typer.Option(8000, help="Port to listen on."),
) -> None:
    """Score POSTs of {prompt, response, answer, ...} with a reward function, answering
    {"score": x}: a service reward.url can call. With RLJOB_REWARD_API_KEY set, calls
    must carry it ('Authorization: Bearer KEY')."""
    import logging

    from ..reward import get_reward
    from ..reward.server import serve

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        fn = get_reward(name, Path.cwd())
    except ValueError as exc:
        typer.echo(f"reward serve: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        serve(fn, host, port)
    except OSError as exc:
        typer.echo(f"reward serve: cannot listen on {host}:{port} ({exc.strerror})", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        pass
