"""Rollout engines: generate n responses per prompt with their log-probs, load a
weight version. `HFEngine` (transformers, CPU/GPU) and `VLLMEngine`
(vllm / vllm-ascend, imported only when used)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    response_ids: list[int]
    logprobs: list[float]  # per response token, under the sampling distribution


class RolloutEngine(ABC):
    version: int = -1

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """For each prompt (token ids), `params.n` generations."""

    @abstractmethod
    def load_weights(self, state_dict: dict, version: int) -> None:
        """Replace the policy weights with those of `version`."""


class HFEngine(RolloutEngine):
    """transformers `generate` with sampling; left-padded batches."""

    def __init__(self, model, tokenizer):
        import torch

        self.torch = torch
        self.model = model.eval()
        self.tok = tokenizer

    def load_weights(self, state_dict: dict, version: int) -> None:
        self.model.load_state_dict(state_dict)
        self.version = version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        torch = self.torch
        pad = self.tok.pad_token_id
        eos = self.tok.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        if params.seed is not None:
            torch.manual_seed(params.seed)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=True,
                temperature=params.temperature, top_p=params.top_p, top_k=0,
                max_new_tokens=params.max_new_tokens, num_return_sequences=params.n,
                pad_token_id=pad, eos_token_id=eos, return_dict_in_generate=True,
                output_logits=True)
        new = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu() / params.temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        results: list[list[Generation]] = []
        for i in range(len(prompts)):
            group = []
            for j in range(params.n):
                row = i * params.n + j
                toks = new[row].tolist()
                end = toks.index(eos) + 1 if eos in toks else len(toks)
                group.append(Generation(toks[:end], logp[row, :end].tolist()))
            results.append(group)
        return results


def make_engine(kind: str, model_spec, rollout_spec, tokenizer, model=None) -> RolloutEngine:
    if kind == "vllm":
        from .vllm_engine import VLLMEngine

        return VLLMEngine(model_spec, rollout_spec, tokenizer)
    if model is None:
        raise ValueError("the hf engine needs the model")
    return HFEngine(model, tokenizer)
