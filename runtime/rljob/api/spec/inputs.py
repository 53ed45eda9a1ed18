"""What a job learns from: the policy model (`ModelSpec`), the prompts
(`DatasetSpec`) and how a response is scored (`RewardSpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel
from .common import DNS_SUBDOMAIN_PATTERN

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


class RewardSpec(ApiModel):
    """How a response is scored."""

    name: str = Field(
        "exact_match",
        max_length=1024,
        pattern=REWARD_PATTERN,
        description="A built-in verifier name, a custom 'module:function' on the image, or "
        "'path/to/reward.py:function' (relative to the job file on this machine; in the "
        "pods, a path on the dataset's PVC such as /data/reward.py:score). Called as "
        "fn(prompt, response, answer, **row) with the dataset row's other keys it names.",
    )
