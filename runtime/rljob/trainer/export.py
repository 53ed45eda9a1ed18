"""`rljob export`: a checkpoint of a run (the torch engine's `trainer.pt`) written as
Hugging Face loads it. A job that trains every weight: the model and its tokenizer. A
LoRA job (model.lora): its adapter alone in PEFT's format, or with `merge` the model
with the adapter merged in, which transformers and vLLM load as they are."""

from __future__ import annotations

from pathlib import Path

import torch

from ..infra.rundir import RunDir


class ExportError(Exception):
    """What keeps a run's checkpoint from being exported, in one line."""


def pick_step(run: RunDir, step: int | None) -> int:
    """The checkpoint to export: `step`, or the newest (pure but for listing the run)."""
    steps = run.checkpoint_steps("trainer.pt")
    if not steps:
        raise ExportError(f"{run.root}: no checkpoint of the torch engine (checkpoints/"
                          "step-N/trainer.pt); a megatron job's model is in final/")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ExportError(f"--step {step}: {run.root} has checkpoints of steps "
                          f"{', '.join(map(str, steps))}")
    return step


def export(run_dir: Path, out: Path, step: int | None = None, merge: bool = False) -> str:
    """Write checkpoint `step` (default the newest) of `run_dir` to `out`; returns what
    was written, in words."""
    from ..api.validation import RLJobError, load_rljob
    from ..inputs.models import build_model, load_tokenizer

    run = RunDir(Path(run_dir))
    try:
        spec = load_rljob(str(run.job_file)).spec
    except RLJobError as exc:
        raise ExportError(f"{run_dir}: not a run directory of `rljob run` ({exc})") from None
    step = pick_step(run, step)
    ck = torch.load(run.checkpoint(step) / "trainer.pt", map_location="cpu",
                    weights_only=True)
    if merge and not ck.get("lora"):
        raise ExportError("--merge merges a LoRA job's adapter into its base; this job "
                          "trains every weight: export without --merge")
    tok = load_tokenizer(spec.model)
    model = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    if not ck.get("lora"):
        model.load_state_dict(ck["model"])
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return f"step {step}: the model and its tokenizer"
    from peft import get_peft_model

    from .lora import lora_config, save_merged

    model = get_peft_model(model, lora_config(spec.model.lora, model))
    model.load_state_dict(ck["model"])
    if merge:
        save_merged(model, out)
        tok.save_pretrained(out)
        return f"step {step}: the model with its adapter merged in, and its tokenizer"
    model.save_pretrained(out)
    return f"step {step}: the adapter in PEFT's format"
