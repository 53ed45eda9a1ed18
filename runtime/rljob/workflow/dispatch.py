"""Skew-aware dispatch in a running job (StreamRL §5), as the workflow runs it:
the driver's online output-length ranker (`LengthRanker`) writes each prompt's
predicted length as its rows' length, and each rollout replica claims whole
groups under the policy `rollout_claim_policy` gives it (the predicted long tail
on a few replicas, longest first; the rest shortest first). Algorithm 2's offline
search and its benchmark are the planner's (planner/dispatch.py)."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

import numpy as np


class LengthRanker:
    """Predicts log output length from the prompt text; learns online."""

    def __init__(self, dim: int = 1 << 12, lr: float = 0.3, memory_weight: float = 0.7):
        self.dim = dim
        self.lr = lr
        self.memory_weight = memory_weight
        self.w = np.zeros(dim)
        self.g2 = np.full(dim, 1e-8)
        self.bias = 0.0
        self.seen = 0
        self.memory: dict[str, tuple[float, int]] = {}  # prompt -> (mean log length, count)

    def _features(self, prompt: str) -> tuple[np.ndarray, np.ndarray]:
        text = prompt.lower()
        keys = [text[i:i + 3] for i in range(max(len(text) - 2, 1))]
        keys += ["w:" + w for w in re.findall(r"[a-z]+", text)]
        keys.append(f"len:{min(len(text) // 16, 32)}")
        keys.append(f"digits:{min(sum(c.isdigit() for c in text), 32)}")
        idx = np.fromiter((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=4).digest(),
                                          "little") % self.dim for k in keys), dtype=np.int64)
        idx, counts = np.unique(idx, return_counts=True)
        return idx, counts / math.sqrt(len(keys))

    def _model(self, prompt: str) -> float:
        idx, val = self._features(prompt)
        return self.bias + float(self.w[idx] @ val)

    def predict(self, prompts: Sequence[str]) -> np.ndarray:
        """Predicted output length (tokens) of each prompt."""
        out = np.empty(len(prompts))
        for i, p in enumerate(prompts):
            guess = self._model(p)
            if p in self.memory:
                mean, _ = self.memory[p]
                guess = self.memory_weight * mean + (1 - self.memory_weight) * guess
            out[i] = math.expm1(max(guess, 0.0))
        return out

    def observe(self, prompts: Sequence[str], lengths: Sequence[int]) -> None:
        for p, n in zip(prompts, lengths):
            y = math.log1p(n)
            idx, val = self._features(p)
            err = self.bias + float(self.w[idx] @ val) - y
            grad = err * val
            self.g2[idx] += grad * grad
            self.w[idx] -= self.lr * grad / np.sqrt(self.g2[idx])
            self.bias -= 0.05 * err
            mean, count = self.memory.get(p, (0.0, 0))
            self.memory[p] = ((mean * count + y) / (count + 1), count + 1)
            self.seen += 1



def tail_replicas(replicas: int) -> int:
    """Replicas that serve the predicted long tail in a running job: none with one
    replica (it runs longest first), else one in five (StreamRL's tail is the top
    20 % of samples), at least one."""
    return 0 if replicas <= 1 else max(1, replicas // 5)


def rollout_claim_policy(dispatch: str, replica: int, replicas: int) -> str:
    """The claim policy of rollout replica `replica` of `replicas` under
    `rollout.dispatch`: whole groups always (GRPO scores a group together); with
    skew_aware the tail replicas take the longest predicted groups first and the
    others the shortest first, so that each generation batch holds groups of
    similar length (a batch lasts as long as its longest sequence)."""
    if dispatch == "fifo":
        return "group"
    if dispatch != "skew_aware":
        raise ValueError(f"unknown rollout.dispatch {dispatch!r}")
    k = tail_replicas(replicas)
    if k == 0 or replica % replicas < k:
        return "group_longest_first"
    return "group_shortest_first"
