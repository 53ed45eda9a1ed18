"""`rljob profile JOB.yaml`: a job's profile measured before it runs (StreamRL
bootstraps its profiler so), on this machine or in a pod of the job's image.

- Generation: the job's rollout engine (`rollout.engine`) on the job's model and
  the job's sampling settings, fed the dataset's first prompts at batch sizes 1, 2,
  4, ... up to `rollout.maxNumSeqs` (64 at most), one call each: the seconds of a
  decode step per batch size and the prefill's seconds per prompt token (the hf
  engine times each of its steps; for an engine that does not, the call's seconds
  over its longest response). The responses give the workload: what the starting
  model writes for these prompts, capped by `rollout.maxNewTokens`.
- Training: the job's trainer engine (`trainer.engine`) takes a few GRPO steps of
  the job's micro-batch size on those prompts and responses (the worker's own
  micro-step, gradient clip and AdamW): tokens/s of one rank.

The result is a `Profile` (planner/profile.py) with what it was measured on
(`meta`), for `rljob plan --profile`, `rljob simulate --profile` and the operator.
`--from-run RUN_DIR` reads a run's live profile instead (planner/live.py)."""

from __future__ import annotations

import time
from dataclasses import asdict

SIZES = (1, 2, 4, 8, 16, 32, 64)


def measure(spec, train_steps: int = 3, sizes: tuple[int, ...] = SIZES, log=print):
    """The offline profile of `spec` (paths resolved) on this machine."""
    import numpy as np
    import torch

    from .infra.device import activate, resolve
    from .inputs.data import load_examples, prompt_ids
    from .inputs.models import build_model, load_tokenizer
    from .planner.live import calls_profile
    from .planner.profile import measured_on
    from .planner.profile import Profile, TrainProfile
    from .rollout import vllm_engine  # noqa: F401 - registers rollout.engine vllm
    from .rollout.engine import SamplingParams, make_engine

    tok = load_tokenizer(spec.model)
    accelerator = spec.accelerator_for("rollout").type
    examples = load_examples(spec.dataset)
    top = min(max(spec.rollout.max_num_seqs, 1), max(sizes))
    prompts = [prompt_ids(tok, examples[i % len(examples)].prompt) for i in range(top)]
    model = None
    if spec.rollout.engine == "hf":
        device = activate(resolve(accelerator))
        model = build_model(spec.model, tok, seed=spec.algorithm.seed,
                            dtype=torch.float32 if accelerator == "cpu" else None).to(device)
    engine = make_engine(spec.rollout.engine, spec.model, spec.rollout, tok, model,
                         accelerator, spec.algorithm.seed)
    calls, lengths, responses = [], [], []
    try:
        for bs in [s for s in sizes if s <= top]:
            params = SamplingParams(n=1, max_new_tokens=spec.rollout.max_new_tokens,
                                    temperature=spec.rollout.temperature,
                                    top_p=spec.rollout.top_p, seeds=tuple(range(bs)))
            engine.generate(prompts[:bs], params)  # the first call of a size warms it up
            engine.take_timings()
            t0 = time.perf_counter()
            out = engine.generate(prompts[:bs], params)
            wall = time.perf_counter() - t0
            timed = engine.take_timings()
            got = [g.response_ids for group in out for g in group]
            if timed:
                calls += [asdict(t) for t in timed]
            else:  # an engine that does not time its steps: the call over its longest
                calls.append({"rows": bs, "prompt_tokens": sum(map(len, prompts[:bs])),
                              "output_tokens": sum(map(len, got)),
                              "steps": max(map(len, got), default=0),
                              "prefill_seconds": 0.0, "decode_seconds": wall,
                              "concurrent": True})
            lengths += [len(r) for r in got]
            responses = got
            log(f"generate: batch {bs}, {wall:.3f} s, longest response {max(map(len, got))}")
    finally:
        engine.close()
    gen = calls_profile(calls, spec.rollout.max_num_seqs)
    tokens_per_second = _train(spec, tok, prompts, responses, train_steps, log)
    return Profile(gen, TrainProfile([1.0], [tokens_per_second], "offline"), lengths,
                   float(np.mean([len(p) for p in prompts])),
                   meta=measured_on(spec, "offline: rljob profile"))


def _train(spec, tok, prompts, responses, steps: int, log) -> float:
    """Tokens/s of one trainer rank over `steps` GRPO steps of the job's micro-batch
    on these prompts and responses (random rewards), after one to warm up."""
    import numpy as np
    import torch

    from .infra.device import activate, resolve
    from .trainer.algorithms import GroupRelative
    from .trainer import mcore  # noqa: F401 - registers trainer.engine megatron
    from .trainer.checkpoint import make_optimizer
    from .trainer.policy import make_policy
    from .trainer.source import Sample
    from .trainer.step import micro_step

    device = resolve(spec.accelerator_for("trainer").type)
    torch_device = activate(device)
    policy = make_policy(spec, tok, device, torch_device, 0, 1)
    policy.freeze_reference()
    opt = make_optimizer(policy, spec.algorithm.lr)
    g = spec.algorithm.group_size
    rng = np.random.default_rng(0)
    mb = spec.algorithm.micro_samples
    samples = []
    for i in range(mb):
        r = responses[i % len(responses)] or [tok.eos_token_id]
        samples.append(Sample(i, i // g, 0, prompts[(i // g) % len(prompts)], r,
                              [0.0] * len(r), float(rng.random()), 0.0, 0.0, 0.0))
    for group in range(0, mb, g):
        adv = GroupRelative.of_group([s.reward for s in samples[group:group + g]])
        for s, a in zip(samples[group:group + g], adv):
            s.advantage = float(a)
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    seconds = []
    for k in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        micro_step(policy, samples, 0, tok, spec, last=True)
        policy.clip_grad_norm(1.0)
        opt.step()
        if k:
            seconds.append(time.perf_counter() - t0)
    tps = tokens / float(np.median(seconds))
    log(f"train: {mb} samples, {tokens} tokens a micro-step, {np.median(seconds):.3f} s: "
        f"{tps:.0f} tokens/s")
    return tps
