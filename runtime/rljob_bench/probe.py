"""A short probe of this machine for `rljob bench workflow`: how long one step's
generation and one step's training take, each side alone, with the threads the
benchmark's rollout and trainer get; and the step size where overlap gains most.

Generation of a small model on a CPU is bound by per-token overhead: a batch of
256 sequences costs far less than 16 batches of 16, so Tgen grows slowly with
the prompts of a step. Training is bound by arithmetic and grows in proportion.
So the prompts per step set Tgen/Ttrain, and overlap has the most to hide where
the two are equal. The probe times both sides at two step sizes, fits a line to
each (a fixed part plus a part per prompt) and picks the candidate size where
both overlapping modes' predicted bounds are highest (`choose_prompts`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rljob.planner.cost import overlap_bound

CANDIDATES = (4, 8, 16)  # prompts per step: periodic cuts a step in 4; 16 keeps
# the default benchmark under 5 minutes on 2 cores (32 took 6.6)
PROBED = (4, 16)


@dataclass(frozen=True)
class Probe:
    prompts: tuple[int, ...]  # probed step sizes
    gen_seconds: tuple[float, ...]  # one step's generation, rollout alone
    train_seconds: tuple[float, ...]  # one step's micro-batches + optimizer, trainer alone
    rollout_threads: int
    trainer_threads: int
    seconds: float  # the probe's own wall time


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (fixed, per unit) of y = fixed + per_unit·x, both ≥ 0."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def predict(probe: Probe, prompts: int) -> tuple[float, float]:
    """(Tgen, Ttrain) of a step of `prompts` prompts, from the probe's lines."""
    g0, g1 = line(probe.prompts, probe.gen_seconds)
    t0, t1 = line(probe.prompts, probe.train_seconds)
    return g0 + g1 * prompts, t0 + t1 * prompts


def gen_fixed(probe: Probe) -> float:
    """What one generation batch costs whatever its size (the gen line's fixed part)."""
    return line(probe.prompts, probe.gen_seconds)[0]


def predicted_speedups(probe: Probe, prompts: int, pieces: int) -> dict[str, float]:
    """The overlapping modes' bounds at `prompts` a step, from the probe's lines
    (periodic's batches each paying generation's fixed part)."""
    gen, train = predict(probe, prompts)
    gen, train = max(gen, 1e-9), max(train, 1e-9)
    return {"periodic": overlap_bound("periodic", gen, train, pieces, gen_fixed(probe)),
            "async": overlap_bound("async", gen, train)}


def choose_prompts(probe: Probe, pieces_for: Callable[[int], int] = lambda p: 1,
                   candidates: Sequence[int] = CANDIDATES) -> int:
    """The candidate where both overlapping modes have the most to gain: the largest
    smaller of the two predicted bounds. async gains most where Tgen = Ttrain;
    periodic also pays generation's fixed part once per batch, so it wants batches
    large enough. A near tie (within 1 %) goes to the larger step: less per-step
    overhead that the probe does not see. `pieces_for(prompts)`: periodic's rollout
    batches a step."""
    def worst(p: int) -> float:
        return min(predicted_speedups(probe, p, pieces_for(p)).values())
    best = max(worst(p) for p in candidates)
    return max(p for p in candidates if worst(p) >= best * 0.99)


def run_probe(job_for, rollout_threads: int, trainer_threads: int,
              sizes: Sequence[int] = PROBED, repeats: int = 2) -> Probe:
    """Times generation and training of one step at each size in this process,
    one side at a time (so each is alone), best of `repeats` after a warm-up.
    `job_for(prompts)` gives the benchmark's job with that many prompts a step."""
    import numpy as np
    import torch

    from rljob.inputs.data import load_examples, prompt_ids
    from rljob.infra.device import activate, resolve as resolve_device
    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.rollout.engine import SamplingParams, make_engine
    from rljob.trainer.policy import make_policy
    from rljob.trainer.source import Sample
    from rljob.trainer.step import micro_step

    began = time.perf_counter()
    spec = job_for(max(sizes)).spec
    tok = load_tokenizer(spec.model)
    device = resolve_device("cpu", 0)
    torch_device = activate(device)
    model = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=torch.float32)
    engine = make_engine("hf", spec.model, spec.rollout, tok, model)
    policy = make_policy(spec, tok, device, torch_device, 0, 1)
    policy.freeze_reference()
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.algorithm.lr, weight_decay=0.0)
    examples = load_examples(spec.dataset)
    g = spec.algorithm.group_size
    rng = np.random.default_rng(0)

    def one_step(prompts: int) -> tuple[float, float]:
        s = job_for(prompts).spec
        chosen = [examples[i % len(examples)] for i in range(prompts)]
        ids = [prompt_ids(tok, e.prompt) for e in chosen]
        params = SamplingParams(n=g, max_new_tokens=s.rollout.max_new_tokens,
                                temperature=s.rollout.temperature, top_p=s.rollout.top_p,
                                seeds=tuple(range(prompts)))
        torch.set_num_threads(rollout_threads)
        t0 = time.perf_counter()
        groups = engine.generate(ids, params)
        gen = time.perf_counter() - t0
        samples = [Sample(slot=i * g + j, group=i, version=0, prompt_ids=ids[i],
                          response_ids=x.response_ids, rollout_logp=x.logprobs, reward=0.0,
                          released_at=0.0, started_at=0.0, finished_at=0.0, advantage=float(rng.normal()))
                   for i, group in enumerate(groups) for j, x in enumerate(group)]
        torch.set_num_threads(trainer_threads)
        mb = s.algorithm.micro_samples
        t0 = time.perf_counter()
        opt.zero_grad()
        for k in range(0, len(samples), mb):
            micro_step(policy, samples[k:k + mb], 0, tok, s, last=k + mb >= len(samples))
        opt.step()
        return gen, time.perf_counter() - t0

    one_step(min(sizes))  # warm-up: first calls allocate and pick kernels
    gens, trains = [], []
    for p in sizes:
        runs = [one_step(p) for _ in range(repeats)]
        gens.append(min(r[0] for r in runs))
        trains.append(min(r[1] for r in runs))
    return Probe(tuple(sizes), tuple(gens), tuple(trains), rollout_threads, trainer_threads,
                 time.perf_counter() - began)


def threads_of(job, root: Path) -> tuple[int, int]:
    """The threads the benchmark's rollout and trainer compute with on this machine."""
    from rljob.local import LocalRun

    run = LocalRun(job, root)  # not started: only its placement is asked
    cpus = [run.cpus_for(name) for name in ("rollout-0", "trainer-0")]
    return tuple(len(c) if c else 1 for c in cpus)  # type: ignore[return-value]
