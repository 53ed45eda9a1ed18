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


def warmed(job, where: Path) -> dict:
    """`model` settings that start `job` (an RLJob) from its supervised warm-up, run
    here once into `where` with the job's own seed, steps and rows (as its trainer
    would run it), the weights and tokenizer saved as `final/` is: the path of that
    directory and warmupSteps 0. The runs a benchmark compares then start from one
    policy and pay its warm-up once. A job without a warm-up: no settings."""
    spec = job.spec
    if not spec.model.warmup_steps:
        return {}
    if not (where / "config.json").exists():
        from rljob.infra.device import activate, resolve
        from rljob.inputs.models import load_tokenizer
        from rljob.trainer.policy import make_policy
        from rljob.trainer.warmup import warm_up

        device = resolve("cpu")
        tok = load_tokenizer(spec.model)
        policy = make_policy(spec, tok, device, activate(device), 0, 1)
        warm_up(policy, tok, spec)
        policy.save_pretrained(where, tok)
    return {"path": str(where), "warmupSteps": 0}
