"""model.lora: a PEFT LoRA adapter on the torch engine's policy.

Pure parts: `lora_config` (the PEFT config of a spec), `linear_names` and
`lora_problems` (the spec's modules and layers against the model's own, for the
preflight), `hf_name` (a PEFT parameter's name in the plain model). With a model:
`merged_tensors` (the weights rollouts load: each adapted weight W + scale * B A,
computed beside the model, never merged into it, so the base stays exact) and
`AdapterOff` (the reference: the same model with its adapter switched off).
PEFT is imported only here, and only for a job that sets model.lora."""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from ..api.spec import LoraSpec

ADAPTER = "default"  # the one adapter's name in PEFT
PEFT_PREFIX = "base_model.model."


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


_ADAPTER_PARAM = re.compile(r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)\.")


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
        if _ADAPTER_PARAM.search(name):
            continue
        layer = deltas.get(name)
        if layer is not None and not layer.disable_adapters:
            tensor = tensor + layer.get_delta_weight(ADAPTER).to(tensor.dtype)
        yield hf_name(name), tensor.detach()


def base_state(model) -> dict[str, torch.Tensor]:
    """The base model's weights (the adapter left out) under Hugging Face names."""
    return {hf_name(k): v for k, v in model.state_dict().items()
            if not _ADAPTER_PARAM.search(k)}


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
