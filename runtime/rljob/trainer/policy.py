"""The trainer's model behind one small interface, so the GRPO step in the
worker is the same for `trainer.engine: torch` (a transformers model, DDP over
every rank) and `trainer.engine: megatron` (a Megatron-core GPTModel under
tensor parallelism, DDP over the data-parallel group; `megatron_engine.py`).

Every method that says "collective" must be called on every rank."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from pathlib import Path

import torch

from ..api.spec import RLJobSpec
from ..device import Device
from ..models import build_model
from .algorithms import Batch, token_logprobs


class Policy:
    """What both engines share: `model` (this rank's trainable module), `wrapped`
    (it under DDP, or itself), `ref` (the frozen reference), `device`,
    `data_rank` / `data_world` (this rank's place among the data-parallel ranks)."""

    model: torch.nn.Module
    wrapped: torch.nn.Module
    ref: torch.nn.Module | None
    device: torch.device
    data_rank: int
    data_world: int

    def _logprobs(self, model, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def parameters(self):
        return self.model.parameters()

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return self._logprobs(self.wrapped, batch)

    @torch.no_grad()
    def ref_logprobs(self, batch: Batch) -> torch.Tensor:
        return self._logprobs(self.ref, batch)

    def no_sync(self, last: bool):
        """Skip the gradient all-reduce on all but a step's last micro-batch."""
        if self.wrapped is self.model or last:
            return nullcontext()
        return self.wrapped.no_sync()

    def checkpoint_state(self) -> dict:
        return {"model": self.model.state_dict(), "ref": self.ref.state_dict()}

    def load_checkpoint(self, ck: dict) -> dict | None:
        """Load the policy; return the reference's state (for freeze_reference)."""
        self.model.load_state_dict(ck["model"])
        return ck["ref"]


class TorchPolicy(Policy):
    """trainer.engine torch: policy and frozen reference as transformers models."""

    def __init__(self, spec: RLJobSpec, tok, device: Device, torch_device, rank: int,
                 world: int):
        dtype = torch.float32 if device.kind == "cpu" else None
        self.device = torch_device
        self.model = build_model(spec.model, tok, seed=spec.algorithm.seed,
                                 dtype=dtype).to(torch_device)
        self.wrapped = self.model
        if world > 1:
            ids = [torch_device] if device.accelerated else None
            self.wrapped = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.rank = rank
        self.data_rank, self.data_world = rank, world  # every rank trains its own shard
        self.ref = None

    def freeze_reference(self, state: dict | None = None) -> None:
        """The reference is the policy as it is now (or `state`), frozen."""
        self.ref = copy.deepcopy(self.model).eval()
        if state is not None:
            self.ref.load_state_dict(state)
        for p in self.ref.parameters():
            p.requires_grad_(False)

    def _logprobs(self, model, batch: Batch) -> torch.Tensor:
        return token_logprobs(model, batch)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Weights under Hugging Face names (what rollouts load)."""
        return self.model.state_dict()

    def saves_checkpoint(self, rank: int) -> bool:
        return rank == 0  # every rank holds the same weights

    def checkpoint_name(self) -> str:
        return "trainer.pt"

    def save_pretrained(self, path: Path, tok) -> None:
        if self.rank == 0:
            self.model.save_pretrained(path)
            tok.save_pretrained(path)


def make_policy(spec: RLJobSpec, tok, device: Device, torch_device, rank: int, world: int):
    if spec.trainer.engine == "megatron":
        from .megatron_engine import MegatronPolicy

        return MegatronPolicy(spec, tok, device, torch_device, rank, world)
    return TorchPolicy(spec, tok, device, torch_device, rank, world)
