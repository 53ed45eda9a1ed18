"""model.lora: a PEFT LoRA adapter on the torch engine's policy.

Pure parts: `lora_config` (the PEFT config of a spec), `linear_names` and
`lora_problems` (the spec's modules and layers against the model's own, for the
preflight), `hf_name` (a PEFT parameter's name in the plain model). With a model:
`merged_tensors` (the weights rollouts load: each adapted weight W + scale * B A,
computed beside the model, never merged into it, so the base stays exact) and
`AdapterOff` (the reference: the same model with its adapter switched off).
PEFT is imported only here, and only for a job that sets model.lora."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from ..api.spec import LoraSpec
from ..weights.adapter import PEFT_PREFIX, is_adapter, split_adapter

ADAPTER = "default"  # the one adapter's name in PEFT


def lora_config(spec: LoraSpec, model):
    """PEFT's LoraConfig of `spec` for `model` (its adapter starts at zero: B = 0).
    Unset target modules are the model's linear modules but its output head, by name
    (PEFT's all-linear, which it refuses beside `layers`)."""
    from peft import LoraConfig

    return LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.target_modules or module_names(model)),
                      layers_to_transform=list(spec.layers) if spec.layers else None,
                      bias="none", task_type="CAUSAL_LM")


def dropout_on(model) -> int:
    """The adapter's dropout modules set to drop in the policy's forwards, whichever
    mode the model was loaded in (`from_pretrained` leaves it in eval mode, where PEFT's
    dropout would never act); returns how many."""
    on = 0
    for name, module in model.named_modules():
        if name.endswith(f".lora_dropout.{ADAPTER}") and isinstance(module, torch.nn.Dropout):
            module.train()
            on += 1
    return on


def module_names(model) -> list[str]:
    """The distinct names of `model`'s linear modules, its output head left out."""
    head = model.get_output_embeddings()
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and m is not head})


def linear_names(config: dict) -> tuple[list[str], int | None]:
    """`module_names` of a model of `config` (a config.json's dict; built on the meta
    device, no weights), and its count of layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return module_names(model), getattr(cfg, "num_hidden_layers", None)


def lora_problems(spec: LoraSpec, config: dict) -> list[str]:
    """model.lora's target modules and layers that a model of `config` lacks, each a
    line naming what it has."""
    try:
        names, layers = linear_names(config)
    except (ValueError, KeyError, TypeError) as exc:
        return [f"model.lora: the model's config.json does not build a transformers "
                f"model to check the adapter's modules against: {exc}"]
    problems = []
    missing = [m for m in spec.target_modules or () if m not in names]
    if missing:
        problems.append(f"model.lora.targetModules: {', '.join(missing)} not in the model; "
                        f"its linear modules are {', '.join(names)}")
    if spec.layers and layers is not None:
        out = [i for i in spec.layers if not 0 <= i < layers]
        if out:
            problems.append(f"model.lora.layers: {', '.join(map(str, out))} out of range: "
                            f"the model has layers 0-{layers - 1}")
    return problems


def hf_name(name: str) -> str:
    """A PEFT model's parameter name in the plain transformers model."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def merged_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The plain model's weights, under their Hugging Face names, with each adapter
    merged into its weight (W + scale * B A, computed in float32 beside W: the model
    itself is not touched), one at a time."""
    from peft.tuners.lora import LoraLayer

    deltas = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            deltas[f"{name}.base_layer.weight"] = module
    for name, tensor in model.state_dict().items():
        if is_adapter(name):
            continue
        layer = deltas.get(name)
        if layer is not None and not layer.disable_adapters:
            tensor = tensor + layer.get_delta_weight(ADAPTER).to(tensor.dtype)
        yield hf_name(name), tensor.detach()


def base_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights (the adapter left out) under Hugging Face names, one
    at a time."""
    for k, v in model.state_dict().items():
        if not is_adapter(k):
            yield hf_name(k), v.detach()


def base_state(model) -> dict[str, torch.Tensor]:
    """`base_tensors` in a dict."""
    return dict(base_tensors(model))


def adapter_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's weights under PEFT's names as it saves them (what vLLM's and
    PEFT's loaders read), one at a time."""
    from peft import get_peft_model_state_dict

    for k, v in get_peft_model_state_dict(model, adapter_name=ADAPTER).items():
        yield k, v.detach()


def load_into(model, state: dict) -> None:
    """A received version into a PEFT `model` in place: its base weights (Hugging Face
    names; a receiver's first version) and its adapter's (PEFT's names, every
    update). A weight the model does not have, or an incomplete adapter, is an error."""
    from peft import set_peft_model_state_dict

    base, adapter = split_adapter(state)
    if base:
        names = {hf_name(k): k for k in model.state_dict() if not is_adapter(k)}
        unknown = sorted(set(base) - set(names))
        if unknown:
            raise ValueError(f"weights the adapted model lacks: {', '.join(unknown[:5])}")
        missing = model.load_state_dict({names[k]: v for k, v in base.items()},
                                        strict=False).missing_keys
        if {k for k in missing if not is_adapter(k)}:
            raise ValueError(f"a base of {len(base)} weights misses some of the model's")
    if adapter:
        result = set_peft_model_state_dict(model, adapter, adapter_name=ADAPTER)
        if result.unexpected_keys:
            raise ValueError("adapter weights the model does not have: "
                             + ", ".join(result.unexpected_keys[:5]))
        want = sum(1 for k in model.state_dict() if is_adapter(k))
        if len(adapter) != want:
            raise ValueError(f"an adapter of {len(adapter)} weights for {want} in the model")


def save_merged(model, path, dtype: torch.dtype = torch.float32) -> None:
    """A PEFT `model` with its adapter merged in, at `path` as transformers and vLLM load
    a model (config.json, generation_config.json, model.safetensors in `dtype`)."""
    from safetensors.torch import save_file

    base = model.get_base_model()
    base.config.save_pretrained(path)
    if base.generation_config is not None:
        base.generation_config.save_pretrained(path)
    # a copy each: safetensors refuses tensors that share storage (a tied head)
    save_file({k: v.to(dtype).to("cpu").contiguous().clone()
               for k, v in merged_tensors(model)},
              str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


class AdapterOff(torch.nn.Module):
    """The reference of a LoRA policy: its model with the adapter switched off for
    each forward (PEFT's `disable_adapter`), sharing every weight, trained by none.
    Its `state_dict` is the base model's under Hugging Face names (what a rollout
    replica loads as the reference)."""

    def __init__(self, peft_model):
        super().__init__()
        object.__setattr__(self, "peft", peft_model)  # not a submodule: no second copy

    def forward(self, *args, **kwargs):
        with torch.no_grad(), self.peft.disable_adapter():
            return self.peft(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        return base_state(self.peft)

    def parameters(self, recurse: bool = True):
        """The model's (where a caller asks which device it computes on)."""
        return self.peft.parameters(recurse)
