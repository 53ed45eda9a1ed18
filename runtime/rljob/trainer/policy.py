"""The trainer's model behind one small interface, so the GRPO step in the
worker is the same for `trainer.engine: torch` (a transformers model, DDP over
every rank) and `trainer.engine: megatron` (a Megatron-core GPTModel under
tensor parallelism, DDP over the data-parallel group; `mcore.py`).
Engines join `TRAINER_ENGINES` by decorator; this module imports none of them.

Every method that says "collective" must be called on every rank.

Precision: the trainable weights are float32 (the master copy the optimizer
updates) whatever `model.dtype` says; the forward and backward passes compute in
`model.dtype` under autocast on an accelerator, and the weights rollouts load are
cast to it. An optimizer stepping bfloat16 weights directly loses almost every
update at RL learning rates (1e-6 is below bfloat16's resolution of a weight).
CPU runs compute in float32."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch

from ..api.spec import RLJobSpec
from ..infra.device import Device
from ..inputs.models import build_model
from ..infra.registry import Registry
from ..sampling import PLAIN, TokenDistribution
from .batch import TokenBatch, token_logprobs


def compute_dtype(spec: RLJobSpec, device: Device) -> torch.dtype:
    """What the passes compute in (and rollouts receive): `model.dtype` on an
    accelerator, float32 on CPU (pure)."""
    return torch.float32 if device.kind == "cpu" else getattr(torch, spec.model.dtype)


def matmul_weights_to(model: torch.nn.Module, dtype: torch.dtype,
                      kinds: tuple[type, ...] = (torch.nn.Linear,)) -> None:
    """The weights of `model`'s matrix products (modules of `kinds`) in `dtype`, in
    place: autocast to `dtype` casts them so before every product anyway, so the
    model computes the same bits in about half the memory (a frozen reference in
    the compute dtype). Embeddings, norms and biases keep their dtype (autocast
    leaves them be), and so does a weight shared with another module (a head tied
    to the embedding)."""
    if dtype == torch.float32:
        return
    other = {id(p) for m in model.modules() if not isinstance(m, kinds)
             for p in m.parameters(recurse=False)}
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, kinds) and isinstance(w, torch.nn.Parameter) and id(w) not in other:
            w.data = w.data.to(dtype)


class Policy:
    """What both engines share: `model` (this rank's trainable module, float32
    weights), `wrapped` (it under DDP, or itself), `ref` (the frozen reference),
    `device`, `compute` (the dtype passes run in), `data_rank` / `data_world` /
    `data_group` (this rank's place among the data-parallel ranks, and their
    process group; None: the default group)."""

    model: torch.nn.Module
    wrapped: torch.nn.Module
    ref: torch.nn.Module | None
    device: torch.device
    compute: torch.dtype = torch.float32
    data_rank: int
    data_world: int
    data_group = None

    def _logprobs(self, model, batch: TokenBatch, dist: TokenDistribution) -> torch.Tensor:
        raise NotImplementedError

    def parameters(self):
        """What the optimizer steps: every weight, or a LoRA policy's adapter alone."""
        return (p for p in self.model.parameters() if p.requires_grad)

    def autocast(self):
        """Passes in the compute dtype (float32 weights stay the master copy)."""
        if self.compute == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute)

    def logprobs(self, batch: TokenBatch, dist: TokenDistribution = PLAIN) -> torch.Tensor:
        """Each response token's log-prob under `dist` (the job's sampling distribution;
        PLAIN, the model's softmax, for supervised steps)."""
        with self.autocast():
            return self._logprobs(self.wrapped, batch, dist).float()

    @torch.no_grad()
    def ref_logprobs(self, batch: TokenBatch, dist: TokenDistribution = PLAIN) -> torch.Tensor:
        with self.autocast():
            return self._logprobs(self.ref, batch, dist).float()

    def _grad_sumsq(self) -> torch.Tensor:
        """This rank's sum of squared gradients (its contribution to the norm)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        return sum((g.float() ** 2).sum() for g in grads)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Collective for tensor-parallel engines: the gradient norm over the whole
        model; if `max_norm` > 0 and the norm exceeds it, gradients are scaled to it."""
        norm = float(self._grad_sumsq()) ** 0.5
        if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
            scale = max_norm / (norm + 1e-6)
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return norm

    def no_sync(self, last: bool):
        """Skip the gradient all-reduce on all but a step's last micro-batch."""
        if self.wrapped is self.model or last:
            return nullcontext()
        return self.wrapped.no_sync()

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: the weights rollouts load, under Hugging Face names in the
        compute dtype, one at a time on the sending rank; nothing on the others
        (which still take their part)."""
        raise NotImplementedError

    def base_tensors(self) -> Iterator[tuple[str, torch.Tensor]] | None:
        """The weights under an adapter whose updates are the adapter alone, sent once
        a trainer life; None where `hf_tensors` are the whole model (here)."""
        return None

    def hf_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: `hf_tensors` on the host, on the sending rank; None elsewhere."""
        return {k: v.to("cpu") for k, v in self.hf_tensors()} or None

    def checkpoint_state(self) -> dict:
        return {"model": self.model.state_dict(), "ref": self.ref.state_dict()}

    def load_checkpoint(self, ck: dict) -> dict | None:
        """Load the policy; return the reference's state (for freeze_reference)."""
        self.model.load_state_dict(ck["model"])
        return ck["ref"]


TRAINER_ENGINES: Registry[type[Policy]] = Registry("trainer.engine", Policy, "rljob.trainer_engines")
register_trainer_engine = TRAINER_ENGINES.register


@register_trainer_engine("torch")
class TorchPolicy(Policy):
    """trainer.engine torch: policy and frozen reference as transformers models."""

    def __init__(self, spec: RLJobSpec, tok, device: Device, torch_device, rank: int,
                 world: int, compute: torch.dtype | None = None):
        self.device = torch_device
        self.compute = compute or compute_dtype(spec, device)
        # float32 master weights; the passes compute in `self.compute`
        self.model = build_model(spec.model, tok, seed=spec.algorithm.seed,
                                 dtype=torch.float32).to(torch_device)
        self.rank = rank
        self.data_rank, self.data_world = rank, world  # every rank trains its own shard
        self.data_group = None  # the default group: every trainer rank
        self._ddp_ids = [torch_device] if device.accelerated else None
        self._wrap()
        self.ref = None
        self.lora = spec.model.lora  # None: every weight trains

    def _wrap(self) -> None:
        """`wrapped`: the model under DDP over the data-parallel ranks (which takes the
        parameters that train at its making), or the model itself on one rank."""
        self.wrapped = self.model
        if self.data_world > 1:
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=self._ddp_ids)

    @property
    def adapted(self) -> bool:
        """Whether the model carries its LoRA adapter yet (`add_adapter`)."""
        return self.lora is not None and hasattr(self.model, "disable_adapter")

    def add_adapter(self) -> None:
        """model.lora: the adapter added (at zero: the model computes as before) and
        every other weight frozen; after the warm-up, before the optimizer is made."""
        from peft import get_peft_model

        from .lora import dropout_on, lora_config

        self.model = get_peft_model(self.model, lora_config(self.lora, self.model))
        dropout_on(self.model)  # model.lora.dropout, in eval mode too
        self._wrap()  # again: DDP over the adapter's parameters

    def freeze_reference(self, state: dict | None = None) -> None:
        """The reference is the policy as it is now (or `state`), frozen, its matrix
        weights in the compute dtype (`matmul_weights_to`). A LoRA policy's is the
        same model with its adapter off (`lora.AdapterOff`): no copy."""
        if self.adapted:
            from .lora import AdapterOff

            self.ref = AdapterOff(self.model).eval()
            return
        self.ref = copy.deepcopy(self.model).eval()
        if state is not None:
            self.ref.load_state_dict(state)
        for p in self.ref.parameters():
            p.requires_grad_(False)
        matmul_weights_to(self.ref, self.compute)

    def _logprobs(self, model, batch: TokenBatch, dist: TokenDistribution) -> torch.Tensor:
        return token_logprobs(model, batch, dist)

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Weights under Hugging Face names in the compute dtype (what rollouts load),
        on this rank's device, one at a time (a cast makes one tensor at a time, not
        a second model); only rank 0 sends them, the others yield nothing. A LoRA
        policy's are its adapter alone, under PEFT's names (`base_tensors` the rest,
        sent once a trainer life: `weights/adapter.py`)."""
        if self.rank != 0:
            return
        if self.adapted:
            from .lora import adapter_tensors

            for k, v in adapter_tensors(self.model):
                yield k, v.to(self.compute)
            return
        for k, v in self.model.state_dict().items():
            yield k, v.detach().to(self.compute)

    def base_tensors(self) -> Iterator[tuple[str, torch.Tensor]] | None:
        """A LoRA policy's weights under its adapter (they do not change while it
        trains), under Hugging Face names in the compute dtype, one at a time on rank
        0; None for every other policy (its `hf_tensors` are whole)."""
        if not self.adapted:
            return None
        from .lora import base_tensors

        return ((k, v.to(self.compute)) for k, v in base_tensors(self.model)
                if self.rank == 0)

    def hf_state(self) -> dict[str, torch.Tensor] | None:
        """The whole model under Hugging Face names on the host (the critic's start), a
        LoRA policy's with its adapter merged in; None on ranks but 0."""
        if not self.adapted:
            return super().hf_state()
        from .lora import merged_tensors

        return {k: v.to("cpu") for k, v in merged_tensors(self.model)} if self.rank == 0 \
            else None

    def saves_checkpoint(self, rank: int) -> bool:
        return rank == 0  # every rank holds the same weights

    def checkpoint_name(self) -> str:
        return "trainer.pt"

    def checkpoint_state(self) -> dict:
        if self.adapted:  # the base and the adapter in one; the reference is the base
            return {"model": self.model.state_dict(), "lora": True}
        return super().checkpoint_state()

    def load_checkpoint(self, ck: dict) -> dict | None:
        if not ck.get("lora"):
            return super().load_checkpoint(ck)
        if not self.adapted:  # a LoRA life's: its adapter first
            self.add_adapter()
        self.model.load_state_dict(ck["model"])
        return {}  # the reference is the base, in the model: nothing of its own

    def save_pretrained(self, path: Path, tok) -> None:
        """`path` holds the model as transformers loads it (a LoRA policy's with its
        adapter merged in) and its tokenizer; a LoRA policy's adapter alone, in PEFT's
        format, in `path`/adapter."""
        if self.rank != 0:
            return
        if self.adapted:
            from .lora import save_merged

            self.model.save_pretrained(path / "adapter")
            save_merged(self.model, path, self.compute)
        else:
            self.model.save_pretrained(path)
        tok.save_pretrained(path)


def make_policy(spec: RLJobSpec, tok, device: Device, torch_device, rank: int, world: int):
    """The trained model under `trainer.engine` (a class registered with
    `register_trainer_engine`; the trainer worker imports the backends it offers)."""
    return TRAINER_ENGINES.get(spec.trainer.engine)(spec, tok, device, torch_device, rank,
                                                    world)
