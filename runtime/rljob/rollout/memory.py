"""What one rollout device holds (pure): a vLLM replica's share of the weights, its
KV cache, and what a weight update needs beside them.

vLLM takes `gpu_memory_utilization` of each device (`rollout.memoryUtilization`)
for the weights, the activations and the KV cache. What is left must hold a weight
update's buffers and what lives outside vLLM's pool:

- the receive: a worker holds one bucket of a broadcast version (or the largest
  tensor, when it is larger than a bucket: a tensor is never split); vLLM's
  in-place reload keeps a layer's pieces until its last one arrives (a layer
  straddling two buckets keeps the earlier one: one bucket more) and rebuilds
  one layer at a time next to the old one (at most the largest tensor's shard);
  over gRPC a worker reads one tensor at a time, less;
- the runtime's own (the NPU/GPU context, the collective libraries' buffers of the
  tensor-parallel group and of the weight group): `RUNTIME_RESERVE`.

The default fraction is what is left after those, rounded down to a hundredth.
Within vLLM's share, the weights' shard, the activations of a step and the KV
cache of one sequence of the model's whole context must fit, or vLLM cannot start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9
RUNTIME_RESERVE = 2 * 1024**3  # device context + collective buffers, outside vLLM's pool
ACTIVATION_RESERVE = 1 * 1024**3  # a step's activations beside the sampler's logits
MAX_FRACTION = 0.95


@dataclass(frozen=True)
class ModelBytes:
    """What the arithmetic needs of a decoder-only model (from its config.json)."""

    params: float
    largest_tensor: float  # bytes of the largest weight under Hugging Face names
    largest_name: str
    kv_per_token: float  # bytes, all layers and KV heads
    vocab: int
    context: int  # max_position_embeddings: vLLM's default max_model_len
    dtype_bytes: int = 2

    @classmethod
    def from_config(cls, cfg: dict, dtype_bytes: int = 2) -> ModelBytes:
        hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads", heads)
        hd = cfg.get("head_dim") or hidden // heads
        inter = cfg.get("intermediate_size", 4 * hidden)
        vocab = cfg.get("vocab_size", 32000)
        tensors = {"model.embed_tokens.weight": vocab * hidden,
                   "mlp.gate_proj.weight": inter * hidden,
                   "self_attn.q_proj.weight": heads * hd * hidden}
        name = max(tensors, key=tensors.get)
        per_layer = hidden * hd * (2 * heads + 2 * kv_heads) + 3 * hidden * inter
        embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
        return cls(layers * per_layer + embed, tensors[name] * dtype_bytes, name,
                   2 * layers * kv_heads * hd * dtype_bytes, vocab,
                   cfg.get("max_position_embeddings", 4096), dtype_bytes)


@dataclass(frozen=True)
class RolloutMemory:
    """One rollout device's budget, in bytes (pure figures; `problems` says what
    does not fit and how to fix it)."""

    device: float
    fraction: float  # vLLM's share: given, or the default
    default: float  # what the arithmetic gives
    weights: float  # this device's shard
    receive: float  # a weight update's buffers on this device
    reserve: float  # the runtime's, outside vLLM's pool
    activations: float
    kv_one_sequence: float  # the KV cache of one sequence of the whole context
    problems: tuple[str, ...]

    @property
    def kv_cache(self) -> float:
        return self.fraction * self.device - self.weights - self.activations

    def lines(self) -> list[str]:
        g = lambda b: f"{b / GB:.2f} GB"  # noqa: E731
        return [f"device {g(self.device)}; vLLM's share {self.fraction:.2f} "
                f"({g(self.fraction * self.device)}; default {self.default:.2f})",
                f"in it: weights' shard {g(self.weights)}, activations {g(self.activations)}, "
                f"KV cache {g(self.kv_cache)} (one whole-context sequence "
                f"{g(self.kv_one_sequence)})",
                f"outside it: weight update {g(self.receive)}, runtime {g(self.reserve)}, "
                f"left {g((1 - self.fraction) * self.device - self.receive - self.reserve)}"]


def rollout_memory(model: ModelBytes, tensor_parallel: int, device_bytes: float,
                   bucket_bytes: float, max_num_seqs: int,
                   fraction: float | None = None) -> RolloutMemory:
    """The budget of one device of a replica with `tensor_parallel` devices (pure)."""
    tp = tensor_parallel
    weights = model.params * model.dtype_bytes / tp
    receive = (max(bucket_bytes, model.largest_tensor) + bucket_bytes
               + model.largest_tensor / tp)
    reserve = RUNTIME_RESERVE
    activations = ACTIVATION_RESERVE + 2 * max_num_seqs * model.vocab * 4 / tp
    kv_one = model.kv_per_token * model.context / tp
    default = math.floor(min(MAX_FRACTION, (device_bytes - receive - reserve)
                             / device_bytes) * 100) / 100
    used = default if fraction is None else fraction
    problems = []
    outside = (1 - used) * device_bytes
    if fraction is not None and outside < receive + reserve:
        problems.append(
            f"rollout.memoryUtilization: {fraction:.2f} leaves {outside / GB:.2f} GB of each "
            f"{device_bytes / GB:.0f} GB device outside vLLM, but a weight update needs "
            f"{receive / GB:.2f} GB ({model.largest_name}: {model.largest_tensor / GB:.2f} GB, "
            f"a bucket {bucket_bytes / GB:.2f} GB) and the runtime {reserve / GB:.2f} GB: set "
            f"it to at most {default:.2f}")
    inside = used * device_bytes - weights - activations
    if inside < kv_one:
        problems.append(
            f"rollout.tensorParallel: {tp} device(s) of {device_bytes / GB:.0f} GB give vLLM "
            f"{used * device_bytes / GB:.2f} GB each, which holds the weights' shard "
            f"({weights / GB:.2f} GB) and a step's activations ({activations / GB:.2f} GB) "
            f"but not the KV cache of one {model.context}-token sequence "
            f"({kv_one / GB:.2f} GB): raise rollout.tensorParallel (and npusPerReplica)")
    return RolloutMemory(device_bytes, used, default, weights, receive, reserve, activations,
                         kv_one, tuple(problems))


def for_rollout(cfg: dict, model_dtype: str, rollout, accelerator: str, bucket_bytes: float,
                device_bytes: float | None = None) -> RolloutMemory:
    """`rollout_memory` for a job: the model's config.json, `model.dtype`, the spec's
    `rollout` section, the accelerator type (its datasheet memory unless
    `device_bytes` is known) and the weight path's bucket size."""
    from ..infra.hardware import HARDWARE

    dtype_bytes = {"float32": 4}.get(model_dtype, 2)
    return rollout_memory(ModelBytes.from_config(cfg, dtype_bytes), rollout.tensor_parallel,
                          device_bytes or HARDWARE[accelerator].memory, bucket_bytes,
                          rollout.max_num_seqs, rollout.memory_utilization)
