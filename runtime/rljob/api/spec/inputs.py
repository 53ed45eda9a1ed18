"""What a job learns from: the policy model (`ModelSpec`), the prompts
(`DatasetSpec`) and how a response is scored (`RewardSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel, Rule
from .common import DNS_SUBDOMAIN_PATTERN, ComputeResources

# Reward functions: a built-in name or an importable `module:function`.
REWARD_PATTERN = (r"^([a-z][a-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"
                  r"|[^:\s]+\.py:[A-Za-z_][A-Za-z0-9_]*)$")


class LoraSpec(ApiModel):
    """A low-rank adapter trained in place of the policy's weights (PEFT's LoRA): the
    optimizer holds the adapter's parameters only, and the reference is the same model
    with its adapter switched off (no second copy)."""

    rank: int = Field(8, ge=1, le=512, description="The adapter's rank r.")
    alpha: float = Field(16.0, gt=0, le=4096,
                         description="The adapter's scale is alpha / rank.")
    dropout: float = Field(
        0.0, ge=0, lt=1,
        description="Dropout on the adapter's input in the trainer's forwards of the "
        "policy (its log-probs then vary from forward to forward; 0: they are those the "
        "rollouts compute, up to rounding).")
    target_modules: list[str] | None = Field(
        None, min_length=1, max_length=64,
        description="Names of the linear modules that get an adapter (e.g. q_proj, "
        "v_proj), checked against the model's own before the job starts; unset: every "
        "linear module of the transformer layers (PEFT's all-linear: not the output "
        "head).")
    layers: list[int] | None = Field(
        None, min_length=1, max_length=1024,
        description="Indices of the transformer layers whose modules get an adapter "
        "(from 0); unset: every layer.")


class ModelSpec(ApiModel):
    """The policy to train and its tokenizer."""

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
    lora: LoraSpec | None = Field(
        None,
        description="Train a LoRA adapter instead of every weight (trainer.engine torch). "
        "The warm-up, where there is one, trains every weight first; the adapter "
        "starts after it, at zero. Each update sends the rollouts the adapter alone "
        "(the base once a trainer life), which both rollout engines serve.",
    )

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.path


class DatasetSpec(ApiModel):
    """The prompts (and their answers, for the reward)."""

    path: str = Field(
        min_length=1, max_length=512, description="JSONL or Parquet file of prompts."
    )
    format: Literal["auto", "jsonl", "parquet"] = Field(
        "auto", description="File format; auto picks by file extension."
    )
    prompt_key: str = Field("prompt", min_length=1, max_length=128,
                            description="The record's key holding the prompt.")
    answer_key: str = Field("answer", min_length=1, max_length=128,
                            description="The record's key holding the answer the reward "
                            "checks against.")
    pvc: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim holding the dataset, mounted read-only at /data.",
    )
    warmup_path: str | None = Field(
        None, min_length=1, max_length=512,
        description="JSONL or Parquet file the warm-up (model.warmupSteps) learns from: its "
        "rows' demonstrations, else their answers. Read as dataset.path is (format, keys, "
        "PVC); unset: the warm-up learns from dataset.path. Rows apart from the prompts RL "
        "samples let RL meet prompts the warm-up has not shown.",
    )

    def for_warmup(self) -> tuple[DatasetSpec, str]:
        """The file the warm-up reads, as a dataset of its own, and the field naming it."""
        if self.warmup_path is None:
            return self, "dataset.path"
        return self.model_copy(update={"path": self.warmup_path}), "dataset.warmupPath"


class RemoteRewardSpec(ApiModel):
    """A scoring service the user runs, called by the reward replicas for each sample:
    a JSON POST of {prompt, response, answer} and the dataset row's other keys, whose
    JSON answer holds the score (rljob/reward/remote.py; `rljob reward serve` serves a
    reward function this way)."""

    endpoint: str = Field(
        min_length=8, max_length=2048, pattern=r"^https?://[^\s/?#]+[^\s]*$",
        description="The service's URL (http:// or https://).")
    api_key_secret: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="A Secret of the job's namespace whose key apiKey the reward pods send "
        "as 'Authorization: Bearer KEY' (a local run sends RLJOB_REWARD_API_KEY from its "
        "environment); unset: no key (the environment variable's, where set).")
    score_key: str = Field(
        "score", min_length=1, max_length=128,
        description="The field of the answer's JSON object that holds the score (a number).")
    concurrency: int = Field(
        16, ge=1, le=1024,
        description="Requests each reward replica has in flight at most.")
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600,
        description="Wall-clock limit of one attempt: connecting, sending and reading the "
        "answer.")
    max_retries: int = Field(
        3, ge=0, le=10,
        description="Attempts after the first for a call that failed in a way another try "
        "may mend: no connection, the timeout, a 5xx or 429 answer (never another 4xx, "
        "nor an answer without a number).")
    backoff_seconds: float = Field(
        1.0, ge=0, le=60,
        description="The wait before the first retry, doubled for each next one (30 s at "
        "most), with up to as much again at random.")
    failure_score: float = Field(
        0.0, ge=-1e6, le=1e6,
        description="The score of a sample whose call failed for good; the error is kept "
        "with the sample (reward_error) and counted (rljob_reward_failures_total).")


class RewardModelSpec(ApiModel):
    """A reward model the reward replicas serve: a sequence classifier (transformers'
    AutoModelForSequenceClassification) whose output is the score."""

    kind: Literal["classifier"] = Field(
        "classifier",
        description="classifier: the score is the model's logit (one label) or its "
        "probability of reward.model.label (several).")
    path: str = Field(
        min_length=1, max_length=512,
        description="The model: a local or PVC directory (reward.model.pvc mounts at "
        "/reward-models) or a hub name.")
    tokenizer: str | None = Field(
        None, max_length=512,
        description="Tokenizer path or name; defaults to reward.model.path. 'builtin:char' "
        "is the character tokenizer built in code.")
    pvc: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim holding the model, mounted read-only at "
        "/reward-models in the reward pods.")
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Parameter dtype on the accelerator (CPU: float32).")
    template: str = Field(
        "{prompt}{response}", min_length=1, max_length=16384,
        description="The text the model scores, from {prompt}, {response}, {answer} and "
        "the dataset row's other keys; the tokenizer's chat template is not applied.")
    max_length: int = Field(
        1024, ge=8, le=131072,
        description="Tokens of that text scored at most: a longer one keeps its last.")
    label: int = Field(
        1, ge=0, le=1023,
        description="With several labels, the one whose probability is the score (e.g. 1: "
        "'right' of wrong/right); with one label the score is its logit.")
    npus_per_replica: int = Field(
        1, ge=0, le=64,
        description="Accelerators of each reward pod (the job's accelerator.type; none on "
        "CPU).")

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.path


class RewardSpec(ApiModel):
    """How a response is scored: by a function the rollout replicas call
    (`name`, the rule), and, where `url` is set, by a scoring service the job's reward
    replicas call, a task of its own in the TransferQueue."""

    name: str = Field(
        "exact_match",
        max_length=1024,
        pattern=REWARD_PATTERN,
        description="A built-in verifier name, a custom 'module:function' on the image, or "
        "'path/to/reward.py:function' (relative to the job file on this machine; in the "
        "pods, a path on the dataset's PVC such as /data/reward.py:score). Called as "
        "fn(prompt, response, answer, **row) with the dataset row's other keys it names. "
        "With reward.url it is the rule that reward.combine weighs or gates with the "
        "service's score (combine none: computed and logged, rule_reward_mean, not trained on).",
    )
    url: RemoteRewardSpec | None = Field(
        None,
        description="Score with a remote service: the reward replicas (reward.replicas) "
        "claim each finished sample from the TransferQueue, call the service and write "
        "its reward, which the trainer waits for.")
    model: RewardModelSpec | None = Field(
        None,
        description="Score with a reward model the reward replicas serve: they claim each "
        "finished sample from the TransferQueue, score reward.batchSize at a time and "
        "write the rewards, which the trainer waits for.")
    combine: Literal["none", "weighted", "gate"] = Field(
        "none",
        description="How the rule (reward.name) and the scorer's score (reward.url's or "
        "reward.model's) make the reward: none, the score alone; weighted, ruleWeight x "
        "rule + scoreWeight x score; gate, the rule's score where it is below "
        "gateThreshold (the scorer is not asked for that sample), else the score.")
    rule_weight: float = Field(1.0, ge=-1e6, le=1e6,
                               description="The rule's weight (combine weighted).")
    score_weight: float = Field(1.0, ge=-1e6, le=1e6,
                                description="The scorer's score's weight (combine weighted).")
    gate_threshold: float = Field(
        1.0, ge=-1e6, le=1e6,
        description="combine gate: the least rule score for which the scorer is asked.")
    replicas: int = Field(
        1, ge=1, le=256,
        description="Reward replicas (with reward.url or reward.model): each a consumer of "
        "the reward task, scoring the batches it claims.")
    batch_size: int = Field(
        64, ge=1, le=4096,
        description="Rows a reward replica claims at most at once: it "
        "takes the rows that are ready, from one on, scores them and writes their rewards "
        "together.")
    resources: ComputeResources = Field(
        default_factory=ComputeResources,
        description="CPU and memory of each reward container, as requests and limits (a CPU "
        "limit also caps a reward model's compute threads); unset: none.")

    rules = (
        Rule(
            cel="self.combine == 'none' || has(self.url) || has(self.model)",
            message="reward.combine weighs or gates a scorer's score with the rule: set "
            "reward.url or reward.model, or combine none",
            check=lambda r: r.combine == "none" or r.streamed,
            field_path=".combine",
        ),
        Rule(
            cel="!(has(self.url) && has(self.model))",
            message="reward.url and reward.model are two scorers: give one of them",
            check=lambda r: r.url is None or r.model is None,
            field_path=".model",
        ),
    )

    @property
    def streamed(self) -> bool:
        """Whether the reward is a task of its own, scored by the reward replicas."""
        return self.url is not None or self.model is not None
