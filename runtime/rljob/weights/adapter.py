"""model.lora's updates on the wire: after a trainer life's first version (the base
under Hugging Face names, and the adapter), each version is the adapter alone, under
PEFT's names as it saves them (`...q_proj.lora_A.weight`). An engine that serves an
adapter loads it as it comes (`RolloutEngine.takes_adapter`); for any other,
`AdapterMerge` keeps the base received last and hands the engine whole weights,
each adapted one W + (alpha / rank) B A, as the trainer's PEFT computes it."""

from __future__ import annotations

import re

import torch

ADAPTER = re.compile(r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.")
PEFT_PREFIX = "base_model.model."


def is_adapter(name: str) -> bool:
    """Whether a weight's name is an adapter's (PEFT's `lora_A` / `lora_B`)."""
    return ADAPTER.search(name) is not None


def split_adapter(state: dict) -> tuple[dict, dict]:
    """A received version as (base weights, adapter weights); either may be empty."""
    base, adapter = {}, {}
    for k, v in state.items():
        (adapter if is_adapter(k) else base)[k] = v
    return base, adapter


def adapted_weight(name: str) -> tuple[str, str]:
    """A saved adapter weight's (adapted weight's Hugging Face name, "A" or "B")."""
    module, part = name.removeprefix(PEFT_PREFIX).rsplit(".lora_", 1)
    return f"{module}.weight", part.split(".", 1)[0]


def delta(a: torch.Tensor, b: torch.Tensor, scale: float, shape) -> torch.Tensor:
    """An adapter's update of a weight of `shape`, in float32: scale * B A (transposed
    for a Conv1D-style weight stored in by out)."""
    d = (b.float() @ a.float()) * scale
    return d if tuple(d.shape) == tuple(shape) else d.T


def adapter_config(rank: int, alpha: float, adapter: dict) -> dict:
    """PEFT's adapter_config.json for `adapter` (saved names): its target modules are
    those its weights adapt (what vLLM's and PEFT's loaders read)."""
    modules = sorted({adapted_weight(k)[0].rsplit(".", 2)[-2] for k in adapter})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
            "target_modules": modules, "lora_dropout": 0.0, "bias": "none",
            "use_rslora": False, "use_dora": False, "init_lora_weights": True}


class AdapterMerge:
    """A receiver's merge for an engine that loads whole weights: the base of the
    trainer life it last heard from, merged with each version's adapter."""

    def __init__(self, rank: int, alpha: float):
        self.scale = alpha / rank  # PEFT's and vLLM's scaling (no rsLoRA)
        self.base: dict[str, torch.Tensor] = {}

    def __call__(self, state: dict) -> dict:
        base, adapter = split_adapter(state)
        if base:  # a trainer life's first version: its base
            self.base = base
        if not adapter:
            return state
        if not self.base:
            raise ValueError("an adapter arrived before any base weights to merge it into")
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in adapter.items():
            weight, part = adapted_weight(name)
            pairs.setdefault(weight, {})[part] = t
        merged = dict(self.base)
        for weight, ab in pairs.items():
            w = self.base.get(weight)
            if w is None or set(ab) != {"A", "B"}:
                raise ValueError(f"an adapter for {weight}, which the base lacks or "
                                 "which came without both its matrices")
            merged[weight] = (w.float() + delta(ab["A"], ab["B"], self.scale,
                                                w.shape)).to(w.dtype)
        return merged
