"""The workers: rollout replicas (`RolloutSpec`, with their autoscaler) and the
trainer gang (`TrainerSpec`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..base import ApiModel, Rule
from .common import DNS_SUBDOMAIN_PATTERN, AcceleratorSpec, ComputeResources


class AutoscalingSpec(ApiModel):
    """Elastic rollout replicas: scale out when generation lags training by more than one more replica would save."""

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
        "the job's live profile, which its trainer reports from its 4th step on; the "
        "autoscaler holds until then (ProfileTrusted False, LiveProfilePending) and "
        "acts on the analytic model of the model's config.json, or Tgen ∝ 1/replicas, "
        "only when none came 3 steps after it was due.",
    )


class McpServerSpec(ApiModel):
    """An MCP server whose tools the episodes may call (over stdio)."""

    name: str = Field(..., min_length=1, max_length=63,
                      description="The server's name, for messages and metrics.")
    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        ..., min_length=1, max_length=64,
        description="The program and its arguments that start the server over stdio "
        "(e.g. [python, -m, my_tools.server]); in pods it must be in the rollout image.")
    env: dict[str, str] = Field(default_factory=dict,
                                description="Environment variables the server gets.")
    working_dir: str | None = Field(
        None, max_length=4096,
        description="The server's working directory, where a relative path in command is "
        "read from. Relative: from the job file's directory; unset: that directory (rljob "
        "run) or the container's working directory (pods).")
    tools: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64,
        description="The server's tools the model may call (empty: every tool it lists).")
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600,
        description="A call (and the server's start) longer than this ends the episode "
        "that made it with an error.")
    max_concurrent_calls: int = Field(
        8, ge=1, le=1024,
        description="Calls in flight to the server at most (per rollout process); more "
        "wait their turn.")


class RolloutSpec(ApiModel):
    """The rollout replicas: engine, sampling, episodes and scaling."""

    replicas: int = Field(1, ge=1, le=1024, description="Rollout replicas (scale subresource).")
    min_replicas: int = Field(1, ge=1, le=1024,
                              description="Lower bound for the autoscaler's scale-in.")
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
        "(rollout/memory.py; 0.94 for Qwen2.5-7B with tensorParallel 4 on a 64 GB 910B). "
        "Not used on CPU.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature; the "
                               "trainer's log-probs use the same distribution.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: the smallest set "
                         "of tokens whose probability reaches topP.")
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
    length_predictor: str = Field(
        "online", min_length=1,
        description="dispatch skew_aware: what predicts each prompt's output length. "
        "online: a ranker that learns from the finished samples; else a predictor an "
        "installed package adds (entry point group rljob.length_predictors), an "
        "importable module:Class or a path/to/file.py:Class (a "
        "rljob.workflow.lengths.LengthPredictor).")
    environment: str = Field(
        "single_turn", min_length=1, max_length=253,
        description="What answers the model's turns of an episode. single_turn: one "
        "prompt, one response. calculator: the model may call <calc>EXPRESSION</calc> and "
        "reads <res>VALUE</res> before it goes on; python: it may run <py>CODE</py> in the "
        "tool sandbox and reads <out>OUTPUT</out>. Else an installed package's (entry "
        "point group rljob.environments), an importable module:Class or a "
        "path/to/file.py:Class (a rljob.environments.Environment; a relative file is read "
        "from the job file's directory). tools: the model calls rollout.tools in its own "
        "format (rollout.toolParser), each call answered by a tool message as its chat "
        "template writes one. An episode's observation tokens are never trained on; "
        "maxNewTokens caps its whole response.")
    tools: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=64,
        description="The tools the model may call, announced to it as OpenAI-style "
        "function schemas through the chat template's tools= (environment tools, or a "
        "user's environment, reads them as self.tools). Each: a built-in (calculator: "
        "{expression}; python: {code}, run in the tool sandbox), one an installed package "
        "adds (entry point group rljob.function_tools), or a Python function "
        "(module:function or path/to/file.py:function) whose schema comes from its type "
        "hints and docstring (Args:), called with the model's arguments; what it returns "
        "is the tool message, what it raises an error message to the model.")
    mcp_servers: list[McpServerSpec] = Field(
        default_factory=list, max_length=16,
        description="MCP servers whose tools the model may call beside rollout.tools "
        "(stdio; needs the mcp extra: pip install 'rljob[mcp]'). Each rollout process "
        "starts each server once, lists its tools (announced like the others) and calls "
        "them through a bounded pool of their own, apart from the generation slots.")
    tool_parser: str = Field(
        "hermes", min_length=1, max_length=253,
        description="How the model writes its tool calls. hermes: <tool_call>{\"name\": "
        "..., \"arguments\": {...}}</tool_call> blocks (Qwen2.5, Qwen3); llama3_json: a "
        "JSON object {\"name\": ..., \"parameters\": {...}} (Llama 3.1/3.2), several "
        "separated by ;. Else an installed package's (entry point group "
        "rljob.tool_parsers), module:Class or path/to/file.py:Class (a "
        "rljob.tools.parsers.ToolParser). A call it cannot read is answered with an "
        "error message and counted (malformed_calls).")
    max_turns: int = Field(
        4, ge=1, le=64,
        description="The model's turns an episode takes at most (single_turn: one).")
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
            cel="self.environment != 'tools' || size(self.tools) > 0 || "
            "size(self.mcpServers) > 0",
            message="rollout.environment tools answers the calls of rollout.tools: list "
            "the tools the model may call (calculator, python, module:function) or "
            "rollout.mcpServers",
            check=lambda r: r.environment != "tools" or bool(r.tools or r.mcp_servers),
            field_path=".tools",
        ),
        Rule(
            cel="self.npusPerReplica % self.tensorParallel == 0",
            message="rollout.npusPerReplica must be a multiple of rollout.tensorParallel",
            check=lambda r: r.npus_per_replica % r.tensor_parallel == 0,
            field_path=".npusPerReplica",
        ),
    )

    @property
    def episodic(self) -> bool:
        """Whether an environment answers the model's turns (episodes of turns)."""
        return self.environment != "single_turn"


class ParallelismSpec(ApiModel):
    """Model parallelism of the trainer (megatron engine)."""

    tp: int = Field(1, ge=1, le=64, description="Tensor-parallel size.")
    pp: int = Field(1, ge=1, le=64, description="Pipeline-parallel size.")


class TrainerSpec(ApiModel):
    """The trainer gang: engine, size, checkpoints and micro-batching."""

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
        periodic mode with skew-aware dispatch; the figure is in docs/benchmarks/workflow.md)."""
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
