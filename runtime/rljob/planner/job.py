"""From an RLJob spec (and optionally a measured profile) to planner inputs."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..api.spec import RLJobSpec
from ..workflow.tasks import rollout_batch_rows
from .cost import Workload, generation_time, training_time
from ..infra.hardware import HARDWARE, Hardware
from ..inputs.models import model_config
from .profile import MODEL_PRESETS, GenProfile, ModelShape, Profile, TrainProfile
from .simulator import PipelineConfig

PROMPT_TOKENS = 256.0  # assumed prompt length when neither a profile nor the dataset says
PROMPTS_READ = 256  # the dataset's first prompts, whose mean length the workload takes


def model_shape(spec: RLJobSpec) -> ModelShape:
    """The model's size: its config.json when the path is local, else a known preset."""
    config = model_config(spec.model)
    if config is not None:
        return ModelShape.from_config(config, 4 if spec.model.dtype == "float32" else 2)
    name = re.sub(r"[^a-z0-9.]+", "-", spec.model.path.removeprefix("random:").lower())
    for key in sorted(MODEL_PRESETS, key=len, reverse=True):
        if key in name:
            return MODEL_PRESETS[key]
    raise ValueError(f"cannot size model {spec.model.path!r}: no config.json there and no preset "
                     f"matches (known: {', '.join(MODEL_PRESETS)}); pass --profile with a "
                     "measured profile")


@dataclass
class JobModel:
    """Cost-model inputs of one job."""

    spec: RLJobSpec
    hardware: Hardware
    gen: GenProfile
    train: TrainProfile
    workload: Workload
    source: str

    @property
    def npus_per_replica(self) -> int:
        return self.spec.rollout.npus_per_replica

    def trainer_sizes(self, limit: int) -> list[int]:
        """Trainer gangs the job can have: multiples of tp × pp that fit one node
        (trainer.npusPerNode) or fill whole nodes."""
        unit = self.spec.trainer.parallelism.tp * self.spec.trainer.parallelism.pp
        per_node = self.spec.trainer.npus_per_node
        return [n for n in range(unit, limit + 1, unit) if n <= per_node or n % per_node == 0]

    def tgen(self, replicas: int) -> float:
        return generation_time(self.gen, self.workload, replicas)

    def ttrain(self, npus: int) -> float:
        return training_time(self.train, self.workload, npus)


def dataset_prompt_lengths(spec: RLJobSpec) -> list[int] | None:
    """The tokens of the dataset's first prompts as the model sees them (without the
    tool schemas an episodic job's prompts announce: a plan starts no tool server),
    where the dataset and the tokenizer are on this machine (a hub tokenizer is not
    fetched for a plan); None elsewhere."""
    from pathlib import Path

    from ..inputs.data import load_examples, prompt_ids
    from ..inputs.models import BUILTIN_CHAR, load_tokenizer

    name = spec.model.tokenizer_path
    if name != BUILTIN_CHAR and not Path(name.removeprefix("random:")).is_dir():
        return None
    try:
        tok = load_tokenizer(spec.model)
        examples = load_examples(spec.dataset)[:PROMPTS_READ]
        return [len(prompt_ids(tok, e.prompt)) for e in examples] or None
    except (OSError, ValueError, ImportError):
        return None


def dataset_prompt_tokens(spec: RLJobSpec) -> float | None:
    """The mean tokens of the dataset's first prompts (`dataset_prompt_lengths`)."""
    lengths = dataset_prompt_lengths(spec)
    return sum(lengths) / len(lengths) if lengths else None


def width_shares(lengths: list[int]) -> tuple[float, ...]:
    """The prompts' shares by the width the hf engine pads them to on CPU (one
    `generate` a width: `rollout.engine.prompt_width`) (pure)."""
    from ..rollout.engine import prompt_width

    counts: dict[int, int] = {}
    for n in lengths:
        counts[prompt_width(n)] = counts.get(prompt_width(n), 0) + 1
    return tuple(c / len(lengths) for _, c in sorted(counts.items()))


def batching(spec: RLJobSpec, prompts: list[int] | None) -> dict:
    """How the job's replicas batch (the `Workload` fields): the runtime's batch rule,
    static batches on the hf engine, a call a prompt width where it runs on CPU."""
    static = spec.rollout.engine == "hf"
    on_cpu = spec.accelerator_for("rollout").type == "cpu"
    return {"max_num_seqs": spec.rollout.max_num_seqs, "mode": spec.workflow.mode,
            "static": static,
            "widths": width_shares(prompts) if static and on_cpu and prompts else ()}


def job_model(spec: RLJobSpec, profile: Profile | None = None) -> JobModel:
    # rollout and trainer on their own hardware (rollout.accelerator / trainer.accelerator)
    hw = HARDWARE[spec.accelerator_for("trainer").type]
    gen_hw = HARDWARE[spec.accelerator_for("rollout").type]
    samples, g = spec.algorithm.samples_per_step, spec.algorithm.group_size
    prompts = dataset_prompt_lengths(spec)
    how = batching(spec, prompts)
    if profile is not None:
        if profile.output_lengths:
            workload = replace(Workload.from_lengths(profile.output_lengths, samples,
                                                     profile.prompt_tokens, g), **how)
        else:
            workload = Workload.assumed(samples, spec.rollout.max_new_tokens,
                                        profile.prompt_tokens, g, **how)
        return JobModel(spec, hw, profile.gen, profile.train, workload, "measured profile")
    shape = model_shape(spec)
    context = int(PROMPT_TOKENS + spec.rollout.max_new_tokens)
    gen = GenProfile.analytic(gen_hw, shape, spec.rollout.tensor_parallel, context)
    train = TrainProfile.analytic(hw, shape)
    mean_prompt = sum(prompts) / len(prompts) if prompts else PROMPT_TOKENS
    workload = Workload.assumed(samples, spec.rollout.max_new_tokens, mean_prompt, g, **how)
    return JobModel(spec, hw, gen, train, workload, f"analytic, {hw.name}")


def pipeline_config(model: JobModel, mode: str, streaming: bool = True, steps: int = 20,
                    tail_sigma: float = 0.6, weight_sync_seconds: float | None = None,
                    seed: int = 0) -> PipelineConfig:
    """The job's shape as a simulator input: per-sample generation time from the
    cost model at the replica's batch, trainer time per sample from Ttrain."""
    spec = model.spec
    samples = spec.algorithm.samples_per_step
    replicas = spec.rollout.replicas
    # the rows a replica generates together: the runtime's own batch rule (periodic
    # splits a replica's share of a step into pieces, each a generate call)
    slots = max(1, min(model.gen.max_batch_size, rollout_batch_rows(
        samples, spec.algorithm.group_size, replicas, spec.rollout.max_num_seqs, mode)))
    # a sample decodes its tokens at the batch's step time after the batch's prefill
    gen_mean = (model.workload.mean_output * model.gen.ptl(slots)
                + model.gen.prefill_per_token * model.workload.prompt_tokens * slots)
    ttrain = model.ttrain(spec.trainer.world_size)
    if weight_sync_seconds is None:
        # weights over the network at ~10 GB/s, a coarse default
        shape_bytes = _weight_bytes(model)
        weight_sync_seconds = shape_bytes / 10e9
    return PipelineConfig(
        mode=mode, max_staleness=spec.workflow.staleness_bound or 1, streaming=streaming,
        steps=steps, samples_per_step=samples, micro_batch=spec.algorithm.micro_samples,
        replicas=replicas, slots=slots, gen_mean=gen_mean, gen_sigma=tail_sigma,
        gen_max_factor=max(2.0, model.workload.max_output / max(model.workload.mean_output, 1)),
        train_per_sample=ttrain / samples, weight_sync_seconds=weight_sync_seconds,
        weight_sync=spec.workflow.weight_sync, replica_npus=spec.rollout.npus_per_replica,
        trainer_npus=spec.trainer.world_size, seed=seed)


def _weight_bytes(model: JobModel) -> float:
    try:
        shape = model_shape(model.spec)
    except ValueError:
        return 0.0
    return shape.params * shape.bytes_per_param
