"""Where the benchmarks find their inputs: the examples of a checkout of this
repository (the tiny model's config, the datasets, the long-tail and long-prompt
jobs). `rljob bench --examples DIR ...` names the folder; by default it is
./examples, as from the repository's root."""

from __future__ import annotations

from pathlib import Path

_ROOT = {"path": Path("examples")}


class ExamplesMissing(ValueError):
    pass


def use(root: Path) -> None:
    """The folder the benchmarks read (`rljob bench --examples`)."""
    _ROOT["path"] = Path(root)


def example(relative: str) -> Path:
    """An absolute path to `relative` in the examples folder; one line naming the
    folder and the fix when it is not there."""
    path = (_ROOT["path"] / relative).resolve()
    if not path.exists():
        raise ExamplesMissing(
            f"{relative} not found in {_ROOT['path'].resolve()}: run rljob bench from the "
            "repository's root or give the examples folder with `rljob bench --examples DIR`")
    return path


def tiny_model() -> str:
    """The tiny Qwen2 of the examples, randomly initialised (`random:` path)."""
    return f"random:{example('models/tiny-qwen2')}"
