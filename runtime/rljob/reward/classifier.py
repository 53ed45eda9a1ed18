"""reward.model kind classifier: a sequence classifier the reward replicas serve
(transformers' AutoModelForSequenceClassification, e.g. a Qwen2ForSequenceClassification
reward model). Each sample's text is reward.model.template filled from its prompt,
response, answer and dataset row; the score is the model's logit where it has one
label, else its probability of reward.model.label. A batch is one forward, its rows
padded on the right (the model reads each row's last real token)."""

from __future__ import annotations

import string
import time
from collections.abc import Mapping, Sequence

from . import Scored, _one_line
from .remote import CallStats


def fields(template: str) -> set[str]:
    """The names a template's placeholders use (pure)."""
    return {name.split(".")[0].split("[")[0]
            for _, name, _, _ in string.Formatter().parse(template) if name}


def render(template: str, payload: Mapping) -> str:
    """reward.model.template filled from a sample (pure); KeyError names a missing key."""
    return template.format_map(dict(payload))


class ClassifierScorer:
    """`score(payloads)`: each payload's score, one forward for them all."""

    def __init__(self, spec, accelerator: str = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification

        from ..infra.device import activate, resolve
        from ..inputs.models import load_tokenizer

        self.spec = spec
        self.device = activate(resolve(accelerator))
        self.tok = load_tokenizer(spec)
        dtype = torch.float32 if self.device.type == "cpu" else getattr(torch, spec.dtype)
        path = spec.path
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
        self.model.config.pad_token_id = self.tok.pad_token_id  # the last real token's
        self.model.to(self.device).eval()
        self.labels = self.model.config.num_labels
        if self.labels > 1 and spec.label >= self.labels:
            raise ValueError(f"reward.model.label {spec.label}: {path} has "
                             f"{self.labels} labels (0 to {self.labels - 1})")
        self.stats = CallStats()

    def encode(self, payload: Mapping) -> list[int]:
        ids = self.tok.encode(render(self.spec.template, payload))
        return ids[-self.spec.max_length:]

    def score(self, payloads: Sequence[Mapping]) -> list[Scored]:
        out: list[Scored | None] = [None] * len(payloads)
        rows, ids = [], []
        for i, p in enumerate(payloads):
            try:
                ids.append(self.encode(p))
                rows.append(i)
            except (KeyError, ValueError) as exc:  # a template key the row lacks, a text
                # the tokenizer refuses
                out[i] = Scored(0.0, f"reward.model: {_one_line(exc)}")
                self.stats.failures += 1
        for i, value in zip(rows, self._forward(ids) if ids else []):
            out[i] = Scored(value)
        return out

    def _forward(self, ids: list[list[int]]) -> list[float]:
        import torch

        t0 = time.monotonic()
        width = max(len(x) for x in ids)
        pad = self.tok.pad_token_id
        batch = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=self.device)
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids],
                            device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=batch, attention_mask=mask).logits.float()
        scores = logits[:, 0] if self.labels == 1 else \
            torch.softmax(logits, dim=-1)[:, self.spec.label]
        values = scores.cpu().tolist()
        self.stats.calls += 1
        self.stats.seconds.append(time.monotonic() - t0)
        return values

    def take_stats(self) -> CallStats:
        stats, self.stats = self.stats, CallStats()
        return stats

    def close(self) -> None:
        self.model = None
