"""How a job learns: the RL algorithm and its batch sizes (`AlgorithmSpec`) and
how generation and training interleave (`WorkflowSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..base import ApiModel, Rule


# the critic's fields (wire name, attribute, default): their defaults are the fields'
# and the only values a grpo job may carry (the rule below, CEL and Python)
CRITIC_FIELDS = (("gamma", "gamma", 1.0), ("lambda", "lam", 0.95),
                 ("valueClip", "value_clip", 0.2), ("criticLr", "critic_lr", 1e-5))
_CRITIC_DEFAULT = {attr: default for _, attr, default in CRITIC_FIELDS}


def _cel_number(x: float) -> str:
    """A CEL double literal without an exponent (0.00001, not 1e-05)."""
    text = f"{x:.12f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


# algorithm.name → its advantage estimator (trainer/algorithms.py registers them), and
# whether a critic scores every sample before the trainer may take it (the job's
# tasks follow from it: workflow/tasks.py)
ALGORITHMS = {"grpo": ("grpo", False), "ppo": ("gae", True)}


class AlgorithmSpec(ApiModel):
    """The RL objective: algorithm, group size, losses and optimizer."""

    name: Literal["grpo", "ppo"] = Field("grpo", description="RL algorithm.")
    group_size: int | None = Field(
        None, ge=1, le=1024,
        description="Responses sampled per prompt (G in GRPO; default 8 for grpo, 1 for ppo).",
    )
    lr: float = Field(1e-6, gt=0, le=1, description="Actor learning rate.")
    gamma: float = Field(
        _CRITIC_DEFAULT["gamma"], ge=0, le=1, description="ppo: discount of GAE (per response token)."
    )
    lam: float = Field(
        _CRITIC_DEFAULT["lam"], ge=0, le=1, alias="lambda",
        description="ppo: λ of GAE (1: Monte-Carlo returns, 0: one-step TD).",
    )
    value_clip: float = Field(
        _CRITIC_DEFAULT["value_clip"], gt=0, description="ppo: the critic's values move at most this far from the "
        "values that scored the sample (clipped value loss).",
    )
    critic_lr: float = Field(
        _CRITIC_DEFAULT["critic_lr"], gt=0, le=1, description="ppo: the critic's learning rate.",
    )
    kl_coef: float = Field(
        0.001, ge=0, description="Weight of the k3 KL estimate to the reference policy."
    )
    clip_ratio: float = Field(0.2, gt=0, lt=1, description="PPO/GRPO ratio clip epsilon.")
    off_policy_correction: Literal["none", "tis", "mis"] = Field(
        "none",
        description="How the loss treats samples the trainer's weights did not make (stale "
        "async samples, and the rollout engine's numerics). none: PPO against the "
        "rollout's own log-probs, its ratio the importance weight and its clip the trust "
        "region; tis: decoupled PPO, the clip taken against the trainer's log-probs at "
        "the start of the step and each token weighted by the rollout-to-trainer "
        "importance weight, truncated at importanceCap; mis: the same, a token whose "
        "weight is above importanceCap left out.",
    )
    importance_cap: float | None = Field(
        None, gt=1, le=1000,
        description="tis/mis: the cap on a token's importance weight (default 2).",
    )
    filter_groups: bool = Field(
        False,
        description="grpo, dynamic sampling (DAPO): a group whose rewards are all equal "
        "(no signal: its advantages are all zero) is not trained; a replacement prompt is "
        "drawn for it, so a step still trains promptsPerStep groups.",
    )
    max_prompts_per_step: int | None = Field(
        None, ge=1, le=1 << 20,
        description="filterGroups: prompts drawn for a step at most, its own and the "
        "replacements (default 4 × promptsPerStep); past it a step trains the filtered "
        "groups it has.",
    )
    max_grad_norm: float = Field(
        1.0, ge=0, le=1e6,
        description="Gradients are scaled down to this global L2 norm before each optimizer "
        "step; 0 turns clipping off.",
    )
    prompts_per_step: int | None = Field(
        None, ge=1, le=65536,
        description="Prompts per optimizer step, each sampled groupSize times (default 32).",
    )
    samples_per_micro_batch: int | None = Field(
        None, ge=1, le=65536,
        description="Samples (responses) per forward/backward micro-step (default 8).",
    )
    global_batch_size: int | None = Field(
        None, ge=1, le=65536,
        description="Deprecated name of promptsPerStep (it counts prompts).",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, le=65536,
        description="Deprecated name of samplesPerMicroBatch (it counts samples).",
    )
    max_steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps to run.")
    seed: int = Field(0, ge=0, description="Seed for sampling and initialisation.")

    @model_validator(mode="before")
    @classmethod
    def _default_group_size(cls, data):
        """GRPO needs a group (8); PPO's baseline is the critic (1)."""
        if isinstance(data, dict) and data.get("groupSize", data.get("group_size")) is None:
            data = {k: v for k, v in data.items() if k != "group_size"}
            data["groupSize"] = 1 if data.get("name") == "ppo" else 8
        return data

    @property
    def cap(self) -> float:
        """The importance-weight cap of tis/mis (importanceCap, or 2)."""
        return self.importance_cap or 2.0

    @property
    def prompt_cap(self) -> int:
        """filterGroups: prompts drawn for a step at most (maxPromptsPerStep, or 4 ×
        promptsPerStep)."""
        return self.max_prompts_per_step or 4 * self.step_prompts

    @property
    def advantage_estimator(self) -> str:
        """The advantage estimator `name` means (trainer/algorithms.py): grpo's
        group-relative one, ppo's GAE over a critic."""
        return ALGORITHMS[self.name][0]

    @property
    def critic(self) -> bool:
        """Whether a critic scores each sample (its advantages come with the row)."""
        return ALGORITHMS[self.name][1]

    @property
    def step_prompts(self) -> int:
        """Prompts per step (promptsPerStep, or its old name globalBatchSize; 32)."""
        return self.prompts_per_step or self.global_batch_size or 32

    @property
    def micro_samples(self) -> int:
        """Samples per micro-step (samplesPerMicroBatch, or its old name microBatchSize; 8)."""
        return self.samples_per_micro_batch or self.micro_batch_size or 8

    @property
    def samples_per_step(self) -> int:
        return self.step_prompts * self.group_size

    rules = (
        Rule(
            cel="self.name == 'ppo' || (" + " && ".join(
                f"self.{wire} == {_cel_number(default)}" for wire, _, default in CRITIC_FIELDS)
            + ")",
            message="algorithm.gamma, lambda, valueClip and criticLr are the critic's: a grpo "
            "job has none and would ignore them; leave them out or set algorithm.name: ppo",
            check=lambda a: a.name == "ppo" or all(
                getattr(a, attr) == default for _, attr, default in CRITIC_FIELDS),
            field_path=".name",
        ),
        Rule(
            cel="!has(self.importanceCap) || self.offPolicyCorrection != 'none'",
            message="algorithm.importanceCap caps the importance weights of "
            "offPolicyCorrection tis or mis; offPolicyCorrection none has none and would "
            "ignore it: leave it out or set offPolicyCorrection: tis",
            check=lambda a: a.importance_cap is None or a.off_policy_correction != "none",
            field_path=".importanceCap",
        ),
        Rule(
            cel="!self.filterGroups || self.name == 'grpo'",
            message="algorithm.filterGroups drops GRPO groups whose rewards are all equal; "
            "a ppo job has no groups to judge: leave it out or set algorithm.name: grpo",
            check=lambda a: not a.filter_groups or a.name == "grpo",
            field_path=".filterGroups",
        ),
        Rule(
            cel="!has(self.maxPromptsPerStep) || self.filterGroups",
            message="algorithm.maxPromptsPerStep bounds the replacement prompts of "
            "filterGroups: set algorithm.filterGroups: true or leave it out",
            check=lambda a: a.max_prompts_per_step is None or a.filter_groups,
            field_path=".maxPromptsPerStep",
        ),
        Rule(
            cel="!has(self.maxPromptsPerStep) || self.maxPromptsPerStep >= "
            "(has(self.promptsPerStep) ? self.promptsPerStep : "
            "(has(self.globalBatchSize) ? self.globalBatchSize : 32))",
            message="algorithm.maxPromptsPerStep counts a step's own prompts too: it must "
            "be at least algorithm.promptsPerStep",
            check=lambda a: a.max_prompts_per_step is None
            or a.max_prompts_per_step >= a.step_prompts,
            field_path=".maxPromptsPerStep",
        ),
        Rule(
            cel="self.name != 'grpo' || !has(self.groupSize) || self.groupSize >= 2",
            message="algorithm.groupSize must be at least 2 when algorithm.name is grpo "
            "(group-relative advantages need two or more responses per prompt)",
            check=lambda a: a.name != "grpo" or a.group_size >= 2,
            field_path=".groupSize",
        ),
        Rule(
            cel="!has(self.promptsPerStep) || !has(self.globalBatchSize)",
            message="algorithm.globalBatchSize is the old name of algorithm.promptsPerStep: "
            "set promptsPerStep alone",
            check=lambda a: a.prompts_per_step is None or a.global_batch_size is None,
            field_path=".globalBatchSize",
        ),
        Rule(
            cel="!has(self.samplesPerMicroBatch) || !has(self.microBatchSize)",
            message="algorithm.microBatchSize is the old name of "
            "algorithm.samplesPerMicroBatch: set samplesPerMicroBatch alone",
            check=lambda a: a.samples_per_micro_batch is None or a.micro_batch_size is None,
            field_path=".microBatchSize",
        ),
        Rule(
            cel="((has(self.promptsPerStep) ? self.promptsPerStep : "
            "(has(self.globalBatchSize) ? self.globalBatchSize : 32)) * "
            "(has(self.groupSize) ? self.groupSize : (self.name == 'ppo' ? 1 : 8))) % "
            "(has(self.samplesPerMicroBatch) ? self.samplesPerMicroBatch : "
            "(has(self.microBatchSize) ? self.microBatchSize : 8)) == 0",
            message="algorithm.samplesPerMicroBatch must divide algorithm.promptsPerStep × "
            "algorithm.groupSize (the samples trained per step)",
            check=lambda a: a.samples_per_step % a.micro_samples == 0,
            field_path=".samplesPerMicroBatch",
            detail=lambda a: f"{a.step_prompts} prompts × {a.group_size} = "
            f"{a.samples_per_step} samples per step, micro-batches of {a.micro_samples}",
        ),
    )


class WorkflowSpec(ApiModel):
    """How rollout and training overlap: the mode, the staleness bound and weight updates."""

    mode: Literal["sync", "periodic", "async"] = Field(
        "async",
        description="sync: generate then train; periodic: on-policy producer/consumer "
        "(staleness 0); async: rollouts run up to maxStaleness steps ahead.",
    )
    max_staleness: int | None = Field(
        None,
        ge=1,
        le=64,
        description="async only: how many optimizer steps a sample's weights may lag "
        "the trainer (default 1).",
    )
    weight_sync: Literal["sync", "async"] = Field(
        "async",
        description="async: rollouts receive new weights into host memory while generating "
        "and swap at an iteration boundary; sync: generation waits for the new weights.",
    )
    weight_update: Literal["drain", "interrupt"] | None = Field(
        None,
        description="async only: what a weight update does to generation in flight. "
        "drain: it waits until the generation in progress (and its episodes' tool calls) "
        "has finished; interrupt: it stops generation at the next token boundary, loads "
        "the new weights and generation goes on from each sample's tokens so far, which "
        "then record the version of each token (staleness is the oldest token's). "
        "Default: drain.",
    )
    interrupt_cache: Literal["recompute", "keep"] = Field(
        "recompute",
        description="weightUpdate interrupt only: what becomes of the interrupted "
        "samples' KV cache. recompute: they go on with their prefix (prompt and tokens "
        "so far) computed again by the new weights (vLLM: their requests aborted and "
        "submitted again); keep: they go on from the cache the old weights computed "
        "(vLLM pauses the requests with their cache, loads the weights and resumes them; "
        "the hf engine goes on from its KV cache), so no prefix is computed twice and the "
        "tokens after the update attend to a context the old weights computed (each "
        "token still records its version).",
    )
    weight_transport: Literal["auto", "grpc", "collective"] = Field(
        "auto",
        description="How weights travel from trainer rank 0 to the rollouts. collective: "
        "broadcast in buckets from device memory in a process group per replica (gloo on "
        "CPU, NCCL on GPU, HCCL on Ascend); grpc: streamed from host memory over gRPC "
        "(any network, across clusters). auto: collective on accelerators, grpc on CPU.",
    )

    def transport(self, trainer: str, rollout: str | None = None) -> str:
        """The weight transport in force between a trainer on accelerator type
        `trainer` and rollouts on `rollout` (default the same; auto resolved:
        collective when both are the same accelerator kind, grpc on CPU or across
        kinds, which share no collective library)."""
        if self.weight_transport != "auto":
            return self.weight_transport
        rollout = rollout or trainer
        return "grpc" if trainer == "cpu" or rollout != trainer else "collective"

    @property
    def update_policy(self) -> str:
        """What a weight update does to generation in flight (drain | interrupt)."""
        return self.weight_update or "drain"

    @property
    def staleness_bound(self) -> int:
        """The bound in force: k in async (default 1), 0 for the on-policy modes."""
        if self.mode != "async":
            return 0
        return 1 if self.max_staleness is None else self.max_staleness

    rules = (
        Rule(
            cel="!has(self.maxStaleness) || self.mode == 'async'",
            message="workflow.maxStaleness is only allowed when workflow.mode is async "
            "(sync and periodic are on-policy: staleness is always 0)",
            check=lambda w: w.max_staleness is None or w.mode == "async",
            field_path=".maxStaleness",
        ),
        Rule(
            cel="!has(self.weightUpdate) || self.weightUpdate == 'drain' || "
            "self.mode == 'async'",
            message="workflow.weightUpdate interrupt is only allowed when workflow.mode is "
            "async (in sync and periodic no update arrives while a step generates)",
            check=lambda w: w.weight_update != "interrupt" or w.mode == "async",
            field_path=".weightUpdate",
        ),
        Rule(
            cel="self.interruptCache == 'recompute' || (has(self.weightUpdate) && "
            "self.weightUpdate == 'interrupt')",
            message="workflow.interruptCache keep applies to weightUpdate interrupt only: "
            "set weightUpdate: interrupt, or remove interruptCache",
            check=lambda w: w.interrupt_cache == "recompute" or w.weight_update == "interrupt",
            field_path=".interruptCache",
        ),
    )
