"""The cost model: how long one step's generation and training take.

StreamRL eq. 2 gives the generation time of one instance serving M samples of
output length L with decode batch BS as PTL(BS) · L · ⌈M / BS⌉ (`wave_time`).
Rollout engines batch continuously (a finished sequence's slot is refilled at
once), so for lengths that vary the planner uses the continuous form
(`instance_time`): the instance runs max(tokens / BS, L_max) decode steps at
the average batch those steps carry. For equal lengths and M a multiple of BS
both are the same number.

A replica generates its share in batches, by the runtime's own rule
(`workflow.tasks.rollout_batch_rows`: periodic mode in pieces). An engine that
batches statically (the hf engine: transformers `generate` decodes a batch until
its longest row ends) spends each batch's decode steps on the batch's longest row,
the expected longest of that many draws from the workload's lengths
(`Workload.longest_of`); on CPU it runs a batch as one `generate` a prompt width
(`Workload.calls_per_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..workflow.tasks import rollout_batch_rows
from .profile import GenProfile, TrainProfile


def wave_time(gen: GenProfile, output_len: float, samples: int, batch: int | None = None) -> float:
    """StreamRL eq. 2: PTL(BS) · L · ⌈M / BS⌉ for one instance."""
    if samples <= 0:
        return 0.0
    bs = min(batch or gen.max_batch_size, gen.max_batch_size, samples)
    return gen.ptl(bs) * output_len * math.ceil(samples / bs)


def instance_time(gen: GenProfile, tokens: float, longest: float, batch: int | None = None) -> float:
    """Continuous batching: decode steps = max(tokens / BS, longest output), each at
    PTL of the average number of sequences in flight."""
    if tokens <= 0:
        return 0.0
    bs = min(batch or gen.max_batch_size, gen.max_batch_size)
    steps = max(tokens / bs, longest)
    return steps * gen.ptl(tokens / steps)


@dataclass(frozen=True)
class Workload:
    """One training step's generation work."""

    samples: int  # prompts × group size
    mean_output: float  # tokens
    max_output: float  # the longest output (the tail that bounds an instance)
    prompt_tokens: float = 256.0
    group_size: int = 1  # replicas take work in whole groups
    # how a replica batches its share (`rollout_batch_rows`): at most max_num_seqs
    # rows a batch (0: no cap), periodic mode in pieces
    max_num_seqs: int = 0
    mode: str = "async"
    # a batch decodes until its longest row ends (the hf engine), not continuously
    static: bool = False
    # the prompts' shares by padded width, where a batch is one call a width (the
    # hf engine on CPU); empty: one call a batch
    widths: tuple[float, ...] = ()
    # the measured response lengths, sorted; empty: spread evenly up to max_output
    lengths: tuple[int, ...] = ()

    def longest_of(self, rows: float) -> float:
        """The expected longest response of `rows` drawn from the workload (pure):
        E[max] = Σ L(k)·((k/N)^rows − ((k−1)/N)^rows) over the sorted lengths; without
        them, of lengths even up to max_output (never below the mean)."""
        n = max(rows, 1.0)
        if not self.lengths:
            return max(self.mean_output, self.max_output * n / (n + 1))
        size = len(self.lengths)
        return sum(length * ((k / size) ** n - ((k - 1) / size) ** n)
                   for k, length in enumerate(self.lengths, 1))

    def calls_per_batch(self, rows: float) -> float:
        """The engine calls a batch of `rows` takes: the expected number of prompt
        widths among its rows / group_size prompts (pure)."""
        if not self.widths:
            return 1.0
        prompts = max(rows / max(self.group_size, 1), 1.0)
        return max(1.0, sum(1 - (1 - p) ** prompts for p in self.widths))

    @property
    def output_tokens(self) -> float:
        return self.samples * self.mean_output

    @property
    def train_tokens(self) -> float:
        return self.samples * (self.prompt_tokens + self.mean_output)

    @classmethod
    def from_lengths(cls, lengths: Sequence[int], samples: int | None = None,
                     prompt_tokens: float = 256.0, group_size: int = 1) -> Workload:
        if not lengths:
            raise ValueError("no output lengths given")
        n = samples if samples is not None else len(lengths)
        return cls(n, sum(lengths) / len(lengths), float(max(lengths)), prompt_tokens,
                   group_size, lengths=tuple(sorted(lengths)))

    @classmethod
    def assumed(cls, samples: int, max_new_tokens: int, prompt_tokens: float = 256.0,
                group_size: int = 1, **batching) -> Workload:
        """Without measurements: outputs average half the cap and some reach it."""
        return cls(samples, max_new_tokens / 2, float(max_new_tokens), prompt_tokens,
                   group_size, **batching)


def generation_time(gen: GenProfile, workload: Workload, replicas: int) -> float:
    """Tgen: the step's groups over `replicas` instances, whole groups each (a
    rollout claims whole groups), so the busiest holds ⌈groups / replicas⌉ of them;
    it sets the pace. It generates them in batches (`batch_rows`), one after the
    other: a static batch in as many decode steps as its longest row, a call a
    prompt width; a continuous one (one batch, pieces in periodic mode) as
    `instance_time` says. A profile that measured the prefill adds it for that
    instance's prompt tokens."""
    if replicas < 1:
        return math.inf
    g = max(1, workload.group_size)
    share = min(workload.samples, math.ceil(math.ceil(workload.samples / g) / replicas) * g)
    prefill = gen.prefill_per_token * share * workload.prompt_tokens
    rows = batch_rows(workload, share)
    batches = share / rows
    if workload.static:
        calls = workload.calls_per_batch(rows)
        per_call = rows / calls
        return prefill + batches * calls * gen.ptl(per_call) * workload.longest_of(per_call)
    if workload.mode != "periodic":  # one continuous batch of the share
        rows, batches = share, 1.0
    return prefill + batches * instance_time(gen, rows * workload.mean_output,
                                             workload.longest_of(rows))


def batch_rows(workload: Workload, share: int) -> int:
    """The rows a replica generates together out of its `share` of a step: the
    runtime's rule (`rollout_batch_rows`) (pure)."""
    g = max(1, workload.group_size)
    return max(g, rollout_batch_rows(share, g, 1, workload.max_num_seqs or share,
                                     workload.mode))


def training_time(train: TrainProfile, workload: Workload, npus: int) -> float:
    """Ttrain of one step on `npus` trainer NPUs."""
    if npus < 1:
        return math.inf
    return train.step_seconds(workload.train_tokens, npus)


def bound_times(t_train: float, t_ref: float, shared: bool) -> tuple[float, float]:
    """(Ttrain, t_either) for `overlap_bound` from the trainer's training and the
    reference's forwards a step (pure): work either side takes where the reference is
    a task the rollout replicas share (`workflow.tasks.reference_task`), else the
    trainer's own, part of its training."""
    return (t_train, t_ref) if shared else (t_train + t_ref, 0.0)


def overlap_bound(mode: str, t_gen: float, t_train: float, pieces: int = 1,
                  gen_fixed: float = 0.0, t_either: float = 0.0) -> float:
    """The most a mode can speed a step up over sync, from the step's generation and
    training times measured apart (sync runs them one after the other, the step's
    generation in one batch) and `t_either`, the reference's forwards a step, which
    the sides share where it is a task of their own (`workflow.tasks.reference_task`):
    in sync both sides split it between generation and training, so sync's step is
    Tgen + t_either/2 + Ttrain.

    async(k): generation of later steps hides behind training entirely and the
    shared work goes to whichever side waits, so a step takes
    max(Tgen, Ttrain, (Tgen + Ttrain + t_either)/2). periodic: one step is a
    two-stage pipeline of `pieces` pieces (the rollout's batches), and the trainer
    computes each piece's reference itself while the rollout generates the next:
    the first piece's generation (fill) and the last piece's reference and training
    (drain) are not hidden, and each piece in between takes the longer stage:
    g + e + t + (p − 1)·max(g, t + e), where a piece's generation g is `gen_fixed`
    (what a generation batch costs whatever its size: per-token overhead of a small
    model) plus its share of the rest, (Tgen − gen_fixed)/p, and t, e are Ttrain/p
    and t_either/p. sync: 1."""
    if t_gen <= 0 or t_train <= 0:
        raise ValueError("t_gen and t_train must be positive")
    either = max(t_either, 0.0)
    serial = t_gen + t_train + either / 2
    if mode == "sync":
        return 1.0
    if mode == "async":
        return serial / max(t_gen, t_train, (t_gen + t_train + either) / 2)
    if mode == "periodic":
        p = max(int(pieces), 1)
        fixed = min(max(gen_fixed, 0.0), t_gen)
        g, t, e = fixed + (t_gen - fixed) / p, t_train / p, either / p
        return serial / (g + e + t + (p - 1) * max(g, t + e))
    raise ValueError(f"unknown workflow mode {mode!r}")
