"""`RLJob.spec`: what a researcher writes. Defaults make a ten-line YAML valid.

Field descriptions become the CRD's schema descriptions (`kubectl explain`).
Cross-field rules are `Rule`s: they become CEL validations in the CRD and are
enforced by these models with the same messages.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import ApiModel, Rule

# Reward functions: a built-in name or an importable `module:function`.
REWARD_PATTERN = (r"^([a-z][a-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"
                  r"|[^:\s]+\.py:[A-Za-z_][A-Za-z0-9_]*)$")
# Kubernetes resource quantities (cpu "500m", memory "4Gi").
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# DNS-1123 label: names of PVCs, queues, priority classes, schedulers.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DEFAULT_ASCEND_RESOURCE = "huawei.com/Ascend910"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


# the pods' image when an RLJob names none (the operator's runtimeImage replaces it)
DEFAULT_IMAGE = "rljob/runtime:0.1.0"

class ModelSpec(ApiModel):
    path: str = Field(
        min_length=1,
        max_length=512,
        description="Policy model: a local/PVC directory or a hub name; "
        "'random:DIR' builds a randomly initialised model from the transformers config in DIR.",
    )
    tokenizer: str | None = Field(
        None,
        max_length=512,
        description="Tokenizer path or name; defaults to model.path. 'builtin:char' is a "
        "character tokenizer built in code.",
    )
    pvc: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim holding the model, mounted read-only at /models.",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Parameter dtype on the accelerator (CPU runs use float32)."
    )
    warmup_steps: int = Field(
        0, ge=0, le=100000,
        description="Supervised steps on prompt → answer before RL starts (for randomly "
        "initialised models).",
    )
    warmup_lr: float = Field(1e-3, gt=0, le=1, description="Learning rate of the warm-up.")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.path


class DatasetSpec(ApiModel):
    path: str = Field(
        min_length=1, max_length=512, description="JSONL or Parquet file of prompts."
    )
    format: Literal["auto", "jsonl", "parquet"] = Field(
        "auto", description="File format; auto picks by file extension."
    )
    prompt_key: str = Field("prompt", min_length=1, max_length=128)
    answer_key: str = Field("answer", min_length=1, max_length=128)
    pvc: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim holding the dataset, mounted read-only at /data.",
    )


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
    )


class ComputeResources(ApiModel):
    cpu: str | None = Field(None, max_length=32, pattern=QUANTITY_PATTERN)
    memory: str | None = Field(None, max_length=32, pattern=QUANTITY_PATTERN)


class AutoscalingSpec(ApiModel):
    enabled: bool = Field(
        False,
        description="Add a rollout replica when generation lags training by more than "
        "one more replica would save.",
    )
    interval_seconds: int = Field(
        30, ge=1, le=86400,
        description="Least time between two observations of the gap that count towards "
        "consecutiveSteps (the gap is sampled at most this often).",
    )
    cooldown_seconds: int = Field(
        300, ge=0, le=86400, description="Minimum time between two scale decisions."
    )
    consecutive_steps: int = Field(
        3, ge=1, le=1000, description="Steps the gap must persist before scaling."
    )
    allow_scale_in: bool = Field(False, description="Also remove replicas when they idle.")
    profile_config_map: str | None = Field(
        None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="A ConfigMap in the job's namespace whose key profile.json holds a "
        "profile of this job (`rljob profile`; kubectl create configmap NAME "
        "--from-file=profile.json): δ′ comes from its latency model and workload. One "
        "measured on another model, dtype, engine, accelerator or tensor parallelism is "
        "refused, and the autoscaler then holds (condition ProfileTrusted False). Unset: "
        "the analytic model of the model's config.json, or Tgen ∝ 1/replicas.",
    )


class HcclSpec(ApiModel):
    socket_ifname: str | None = Field(
        None, max_length=64, description="HCCL_SOCKET_IFNAME, e.g. eth0."
    )
    connect_timeout_seconds: int = Field(
        1200, ge=1, le=7200, description="HCCL_CONNECT_TIMEOUT."
    )
    exec_timeout_seconds: int = Field(1800, ge=1, le=17340, description="HCCL_EXEC_TIMEOUT.")
    if_base_port: int | None = Field(
        None, ge=1024, le=65000, description="HCCL_IF_BASE_PORT: first of the ports HCCL uses."
    )


class AcceleratorSpec(ApiModel):
    type: Literal["cpu", "ascend", "gpu"] = Field("cpu", description="Device kind.")
    resource_name: str | None = Field(
        None,
        max_length=253,
        description=f"Extended resource to request; default {DEFAULT_ASCEND_RESOURCE} "
        f"for ascend, {DEFAULT_GPU_RESOURCE} for gpu.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the job's pods must match."
    )
    hccl: HcclSpec = Field(default_factory=HcclSpec)

    @property
    def resource(self) -> str | None:
        """The extended resource the pods request, or None on CPU."""
        if self.type == "cpu":
            return None
        if self.resource_name:
            return self.resource_name
        return DEFAULT_ASCEND_RESOURCE if self.type == "ascend" else DEFAULT_GPU_RESOURCE

    rules = (
        Rule(
            cel="self.type != 'cpu' || !has(self.resourceName)",
            message="accelerator.resourceName needs accelerator.type ascend or gpu",
            check=lambda a: a.type != "cpu" or a.resource_name is None,
            field_path=".resourceName",
        ),
    )


class RolloutSpec(ApiModel):
    replicas: int = Field(1, ge=1, le=1024, description="Rollout replicas (scale subresource).")
    min_replicas: int = Field(1, ge=1, le=1024)
    max_replicas: int | None = Field(
        None, ge=1, le=1024, description="Upper bound for kubectl scale and the autoscaler."
    )
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="hf: transformers generate (CPU/tests); vllm: vLLM / vLLM-Ascend."
    )
    tensor_parallel: int = Field(1, ge=1, le=64, description="Tensor-parallel size per replica.")
    npus_per_replica: int = Field(1, ge=1, le=64, description="Accelerators per rollout replica.")
    max_new_tokens: int = Field(256, ge=1, le=262144, description="Generation length cap.")
    max_num_seqs: int = Field(
        256,
        ge=1,
        le=65536,
        description="Sequences a replica generates together: it claims whole groups up to "
        "this many (at most its share of a step; in periodic mode at most a quarter of it, "
        "so generation overlaps training). The hf engine generates them in one call; vllm "
        "keeps that many in flight, claiming more as groups finish (continuous batching).",
    )
    memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="vLLM's share of each rollout accelerator's memory (its "
        "gpu_memory_utilization: weights, activations, KV cache); the rest holds a weight "
        "update's buffers and the runtime's. Unset: computed from the model at start "
        "(planner/memory.py; 0.94 for Qwen2.5-7B with tensorParallel 4 on a 64 GB 910B). "
        "Not used on CPU.",
    )
    temperature: float = Field(1.0, gt=0, le=10)
    top_p: float = Field(1.0, gt=0, le=1)
    accelerator: AcceleratorSpec | None = Field(
        None, description="The rollout replicas' own accelerator (type, resourceName, "
        "nodeSelector, hccl), in place of spec.accelerator: rollout and training on "
        "different hardware or node pools (StreamRL's heterogeneous deployment).")
    dispatch: Literal["fifo", "skew_aware"] = Field(
        "fifo",
        description="Which prompt groups a replica claims next. fifo: in release order. "
        "skew_aware (StreamRL §5): the driver predicts each prompt's output length with an "
        "online ranker that learns from the finished samples; one replica claims the "
        "longest groups first (with several, one in five serves the long tail) and the "
        "others the shortest first, so long generations run together instead of "
        "stretching every batch.",
    )
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    resources: ComputeResources = Field(
        default_factory=ComputeResources,
        description="CPU and memory of each rollout container, as requests and limits (a "
        "CPU limit also caps its compute threads); unset: none.",
    )

    rules = (
        Rule(
            cel="self.minReplicas <= self.replicas",
            message="rollout.replicas must be at least rollout.minReplicas",
            check=lambda r: r.min_replicas <= r.replicas,
            field_path=".replicas",
        ),
        Rule(
            cel="!has(self.maxReplicas) || self.replicas <= self.maxReplicas",
            message="rollout.replicas must be at most rollout.maxReplicas "
            "(raise rollout.maxReplicas to scale further)",
            check=lambda r: r.max_replicas is None or r.replicas <= r.max_replicas,
            field_path=".replicas",
        ),
        Rule(
            cel="!self.autoscaling.enabled || has(self.maxReplicas)",
            message="rollout.maxReplicas is required when rollout.autoscaling.enabled is true",
            check=lambda r: not r.autoscaling.enabled or r.max_replicas is not None,
            field_path=".maxReplicas",
        ),
        Rule(
            cel="self.npusPerReplica % self.tensorParallel == 0",
            message="rollout.npusPerReplica must be a multiple of rollout.tensorParallel",
            check=lambda r: r.npus_per_replica % r.tensor_parallel == 0,
            field_path=".npusPerReplica",
        ),
    )


class ParallelismSpec(ApiModel):
    tp: int = Field(1, ge=1, le=64, description="Tensor-parallel size.")
    pp: int = Field(1, ge=1, le=64, description="Pipeline-parallel size.")


class TrainerSpec(ApiModel):
    num_nodes: int = Field(1, ge=1, le=4096, description="Trainer pods (one per node).")
    npus_per_node: int = Field(
        1, ge=1, le=64, description="Accelerators per trainer pod (processes per node on CPU)."
    )
    engine: Literal["torch", "megatron"] = Field(
        "torch", description="torch: DDP (CPU/gloo, NPU/hccl); megatron: Megatron-core."
    )
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    checkpoint_every: int = Field(
        50, ge=1, description="Save a checkpoint every N optimizer steps."
    )
    checkpoint_pvc: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim (ReadWriteMany across trainer nodes) for "
        "checkpoints and final weights, mounted at /checkpoints; without it a restarted "
        "trainer gang starts from step 0.",
    )
    resources: ComputeResources = Field(
        default_factory=ComputeResources,
        description="CPU and memory of each trainer container, as requests and limits (a "
        "CPU limit also caps its compute threads); unset: none.",
    )
    accelerator: AcceleratorSpec | None = Field(
        None, description="The trainer's own accelerator (type, resourceName, "
        "nodeSelector, hccl), in place of spec.accelerator.")
    micro_batch_order: Literal["auto", "slot", "arrival"] = Field(
        "auto",
        description="Order a step's samples are cut into micro-batches. slot: the step's "
        "own order, so a streamed step makes the update a whole-batch (sync) step makes, "
        "bit for bit; arrival: as groups come in, so a slow group does not hold up the "
        "micro-batches after it (equal to sync within float rounding: the gradient is "
        "summed in another order). auto: arrival in async mode and with skew-aware "
        "dispatch (which generates the longest groups first, not the first slots), slot "
        "otherwise.",
    )

    packing: Literal["none", "sequences", "shared_prompt"] = Field(
        "none",
        description="How a micro-batch goes through the model (torch engine). none: "
        "right-padded rows; sequences: packed into one sequence with a block-diagonal "
        "mask, no compute on padding; shared_prompt: packed, the samples of one prompt "
        "sharing one copy of it (Periodic Asynchrony's shared-prompt attention). The "
        "log-probs equal the padded ones within float rounding.",
    )
    data_parallel_split: Literal["round_robin", "token_balanced"] = Field(
        "round_robin",
        description="How a micro-batch's samples are split over data-parallel ranks. "
        "round_robin: every world-th sample; token_balanced: equal counts with the "
        "ranks' token sums balanced (Karmarkar-Karp), so no rank waits at the gradient "
        "all-reduce for one with the long samples.",
    )

    def micro_batch_order_in(self, mode: str, dispatch: str = "fifo") -> str:
        """The order in force in workflow `mode` with `rollout.dispatch` (auto resolved:
        arrival where `rljob bench optimisations` measures it faster than slot order,
        periodic mode with skew-aware dispatch; the figure is in the README)."""
        if self.micro_batch_order != "auto":
            return self.micro_batch_order
        return "arrival" if mode == "async" or dispatch == "skew_aware" else "slot"

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.npus_per_node

    rules = (
        Rule(
            cel="self.engine == 'megatron' || self.parallelism.tp == 1",
            message="trainer.parallelism.tp above 1 needs trainer.engine: megatron "
            "(the torch engine is data-parallel only)",
            check=lambda t: t.engine == "megatron" or t.parallelism.tp == 1,
            field_path=".parallelism",
        ),
        Rule(
            cel="self.engine == 'torch' || self.packing == 'none'",
            message="trainer.packing needs trainer.engine: torch (the megatron engine "
            "trains right-padded micro-batches); set packing: none",
            check=lambda t: t.engine == "torch" or t.packing == "none",
            field_path=".packing",
        ),
        Rule(
            cel="self.parallelism.pp == 1",
            message="trainer.parallelism.pp above 1 is not supported: the trainer runs "
            "tensor and data parallelism only; set pp: 1",
            check=lambda t: t.parallelism.pp == 1,
            field_path=".parallelism",
        ),
        Rule(
            cel="(self.numNodes * self.npusPerNode) % (self.parallelism.tp * self.parallelism.pp) == 0",
            message="trainer.parallelism.tp × trainer.parallelism.pp must divide "
            "trainer.numNodes × trainer.npusPerNode",
            check=lambda t: t.world_size % (t.parallelism.tp * t.parallelism.pp) == 0,
            field_path=".parallelism",
        ),
    )


class RewardSpec(ApiModel):
    name: str = Field(
        "exact_match",
        max_length=1024,
        pattern=REWARD_PATTERN,
        description="A built-in verifier name, a custom 'module:function' on the image, or "
        "'path/to/reward.py:function' (relative to the job file on this machine; in the "
        "pods, a path on the dataset's PVC such as /data/reward.py:score). Called as "
        "fn(prompt, response, answer, **row) with the dataset row's other keys it names.",
    )


class RedisSpec(ApiModel):
    image: str = Field("redis:7.2", min_length=1, max_length=512)
    resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="1", memory="4Gi"),
        description="Requests and limits of each storage unit.",
    )
    persistence: bool = Field(
        False,
        description="Keep each unit's append-only file on a PVC, so it survives the pod "
        "being deleted or rescheduled; without, it lives in an emptyDir and survives "
        "restarts of redis within the pod.",
    )
    storage_size: str = Field(
        "20Gi", max_length=32, pattern=QUANTITY_PATTERN,
        description="Size of each unit's PVC when persistence is on.",
    )


class TransferQueueSpec(ApiModel):
    storage_units: int = Field(
        1, ge=1, le=64, description="Redis storage units; rows shard over them by index."
    )
    lease_seconds: int = Field(
        60,
        ge=1,
        le=86400,
        description="A claimed row returns to its task if not acked within this time.",
    )
    redis: RedisSpec = Field(default_factory=RedisSpec)
    resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="1", memory="2Gi"),
        description="Requests of the TransferQueue controller's container (its memory "
        "limit is 8Gi or the request, if larger).",
    )
    driver_resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="500m", memory="1Gi"),
        description="Requests of the workflow driver's container, beside the controller, "
        "and of trainer rank 0's preflight init container, which reads the same files "
        "(the memory limit is 4Gi or the request, if larger).",
    )


class SchedulingSpec(ApiModel):
    scheduler_name: str | None = Field(
        None, max_length=63, pattern=DNS_LABEL_PATTERN, description="e.g. volcano."
    )
    queue: str | None = Field(
        None, max_length=63, pattern=DNS_LABEL_PATTERN, description="Volcano queue."
    )
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)

    rules = (
        Rule(
            cel="!has(self.queue) || (has(self.schedulerName) && self.schedulerName == 'volcano')",
            message="scheduling.queue needs scheduling.schedulerName: volcano",
            check=lambda s: s.queue is None or s.scheduler_name == "volcano",
            field_path=".queue",
        ),
    )


class RunPolicySpec(ApiModel):
    backoff_limit: int = Field(
        3, ge=0, le=1000, description="Trainer gang restarts before the job fails."
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Fail the job after this many seconds of running."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the finished job's children after this many seconds."
    )


class WandbSpec(ApiModel):
    project: str = Field(..., min_length=1, max_length=128,
                         description="Weights & Biases project of the job's runs.")
    entity: str | None = Field(None, min_length=1, max_length=128,
                               description="W&B team or user (default: the API key's).")
    mode: Literal["online", "offline"] = Field(
        "online", description="online: sent as the job runs (needs WANDB_API_KEY); offline: "
        "written under the run directory's wandb/ for `wandb sync`.")
    api_key_secret: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="Secret whose key 'apiKey' holds the W&B API key, given to the trainer "
        "pods as WANDB_API_KEY (local runs read WANDB_API_KEY from the environment).")


class LoggingSpec(ApiModel):
    tensorboard: bool = Field(
        True, description="TensorBoard event files of every step in the run directory's "
        "tensorboard/ (in the pods: beside the checkpoints, with trainer.checkpointPvc).")
    wandb: WandbSpec | None = Field(
        None, description="Also log every step to Weights & Biases (needs rljob[wandb]).")


class RLJobSpec(ApiModel):
    model: ModelSpec
    dataset: DatasetSpec
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    workflow: WorkflowSpec = Field(default_factory=WorkflowSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    transfer_queue: TransferQueueSpec = Field(default_factory=TransferQueueSpec)
    accelerator: AcceleratorSpec = Field(default_factory=AcceleratorSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    image: str = Field(
        DEFAULT_IMAGE,
        min_length=1,
        max_length=512,
        description="Runtime image of the TransferQueue controller, rollout and trainer pods.",
    )
    suspend: bool = Field(False, description="Delete the job's pods, keeping its data and status.")

    def accelerator_for(self, role: str) -> AcceleratorSpec:
        """The accelerator of `role` (rollout, trainer): its own section, else the job's."""
        own = getattr(self, role).accelerator if role in ("rollout", "trainer") else None
        return own or self.accelerator

    @property
    def weight_transport(self) -> str:
        """The weight transport in force between this job's trainer and rollouts."""
        return self.workflow.transport(self.accelerator_for("trainer").type,
                                       self.accelerator_for("rollout").type)

    rules = (
        Rule(
            cel="(has(self.trainer.accelerator) ? self.trainer.accelerator.type : "
            "self.accelerator.type) != 'cpu' || self.trainer.engine == 'torch'",
            message="trainer.engine megatron needs accelerator.type ascend or gpu (the "
            "trainer's: trainer.accelerator, else accelerator)",
            check=lambda s: s.accelerator_for("trainer").type != "cpu"
            or s.trainer.engine == "torch",
            field_path=".trainer.engine",
        ),
        Rule(
            cel="self.workflow.weightTransport != 'collective' || "
            "(has(self.trainer.accelerator) ? self.trainer.accelerator.type : "
            "self.accelerator.type) == (has(self.rollout.accelerator) ? "
            "self.rollout.accelerator.type : self.accelerator.type)",
            message="workflow.weightTransport collective needs the trainer and the rollouts "
            "on one accelerator kind (a process group spans one collective library); set "
            "weightTransport: grpc or auto",
            check=lambda s: s.workflow.weight_transport != "collective"
            or s.accelerator_for("trainer").type == s.accelerator_for("rollout").type,
            field_path=".workflow.weightTransport",
        ),
    )
