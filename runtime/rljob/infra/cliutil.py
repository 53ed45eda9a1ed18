"""What the `rljob` and `rljob-operator` command lines share: help in the
conventional form and the --version option's callback."""

from __future__ import annotations

from collections.abc import Callable

import typer


def version_callback(prog: str) -> Callable[[bool], None]:
    """--version's callback: `PROG VERSION`, then exit."""
    def show(value: bool) -> None:
        if value:
            from .. import __version__

            typer.echo(f"{prog} {__version__}")
            raise typer.Exit()

    return show


def plain_metavars(cmd) -> None:
    """Help in the conventional form: `FILE`, `--max-steps N`, `--run-dir PATH`, flags
    bare (instead of type tags such as `<int>`, `{file}`, `<list[str]>`)."""
    names = {"int": "N", "float": "X", "Path": "PATH", "str": "TEXT"}
    for p in cmd.params:
        kind = getattr(p, "param_type_name", "")
        if kind == "argument":
            name = p.name.upper() + ("..." if p.nargs != 1 else "")
            p.metavar = name
            p._usage_display_name = lambda name=name: name
            p.display_type_rich = lambda ctx: None
        elif kind == "option" and not p.is_flag and p.metavar is None:
            desc = getattr(p, "type_descriptor", None)  # typer's; absent from older ones
            if desc is None:
                continue
            if desc.is_choice:
                p.metavar = "|".join(str(c) for c in desc.choices or ())
            else:
                ann = getattr(desc.annotation, "__name__", "")
                p.metavar = names.get(ann) or p.name.upper()
            if desc.is_list:
                p.metavar = p.name.upper()
    for sub in getattr(cmd, "commands", {}).values():
        plain_metavars(sub)
