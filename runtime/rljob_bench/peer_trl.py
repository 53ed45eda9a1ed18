"""The colocated peer for `rljob bench workflow --peer trl`: TRL's `GRPOTrainer` on the
benchmark's job (same random-init model, character vocabulary, prompts, reward, group
size, generation length, micro-batch and learning rate), one process, generating a
whole step (prompts × group size sequences) in one `generate` and stepping the
optimizer once per step. TRL is an optional dependency of this benchmark only
(`pip install trl`).

The peer is configured as its experts would for this job (`trl_settings`, fair): in
everything that changes the computation it does what our trainer does, each setting
for the reason beside it in FAIR. The same peer at TRL's own defaults (only the job's
shape given) is measured beside it and named as such: its defaults recompute
activations and decay the learning rate, which this job neither needs nor asks for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time

from rljob.api import RLJob


def char_tokenizer_fast():
    """The built-in character vocabulary as a transformers tokenizer (what TRL takes),
    with the same ids as `rljob.inputs.models.CharTokenizer`."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rljob.inputs.models import CharTokenizer

    chars = CharTokenizer()
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(chars.vocab)},
                                      unk_token=chars.pad_token))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=chars.pad_token,
                                  bos_token=chars.bos_token, eos_token=chars.eos_token)
    tok.padding_side = "left"
    return tok


# GRPOConfig settings where TRL 1.16's defaults differ from what our trainer computes
# for the job (each: why), given on top of the job's shape
FAIR = {
    # our trainer keeps every activation; TRL (with transformers 5) turns activation
    # checkpointing on by default and recomputes each forward in its backward: a
    # memory saving this tiny job does not need
    "activation_checkpointing": False,
    # our learning rate is constant (no schedule); TRL decays it linearly to 0
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    # our KL term is the plain k3 estimate; TRL's default multiplies it by the
    # importance ratio (bias correction)
    "use_bias_correction_kl": False,
    # rewards normalised by their group's std, as our group-relative advantages
    "scale_rewards": "group",
    # AdamW without weight decay, as ours
    "weight_decay": 0.0,
}


def trl_settings(job: RLJob, steps: int, out: str, fair: bool = True) -> dict:
    """GRPOConfig's arguments for `job` (pure): its shape (model dtype, device, steps,
    learning rate, KL and clip, group size, generation length and sampling, micro-batch,
    accumulation to one optimizer step per step, the seed, gradient clipping at the
    job's `maxGradNorm`, the trainer's device and bfloat16 passes where the job has them),
    plus FAIR unless `fair` is false (TRL's defaults)."""
    spec = job.spec
    algo = spec.algorithm
    per_step = algo.samples_per_step
    on_cpu = spec.accelerator_for("trainer").type == "cpu"
    shape = dict(
        # float32 masters; on an accelerator the passes in bfloat16 under autocast where
        # the job's are (ours: `model.dtype`), as our trainer computes them
        model_init_kwargs={"dtype": "float32"},
        output_dir=out, use_cpu=on_cpu, bf16=not on_cpu and spec.model.dtype == "bfloat16",
        report_to="none", save_strategy="no",
        logging_steps=10_000, max_steps=steps, learning_rate=algo.lr,
        beta=algo.kl_coef, epsilon=algo.clip_ratio, loss_type="grpo",
        num_generations=algo.group_size, max_completion_length=spec.rollout.max_new_tokens,
        temperature=spec.rollout.temperature, top_p=spec.rollout.top_p,
        per_device_train_batch_size=algo.micro_samples,
        gradient_accumulation_steps=per_step // algo.micro_samples,
        generation_batch_size=per_step, seed=algo.seed, disable_tqdm=True,
        max_grad_norm=algo.max_grad_norm)
    return {**shape, **FAIR} if fair else shape


def run_trl(job: RLJob, steps: int, warmup_steps: int = 3, fair: bool = True) -> dict:
    """Tokens/s and step seconds of TRL's GRPO on `job`'s shape, steady state
    (`fair`: configured for the job, else at TRL's defaults)."""
    try:
        import trl
        from datasets import Dataset
        from transformers import TrainerCallback
    except ImportError as exc:
        raise SystemExit(f"--peer trl needs TRL: pip install trl ({exc})") from None
    import tempfile

    import torch

    from rljob.inputs.data import load_examples
    from rljob.inputs.models import CharTokenizer, build_model
    from rljob.reward import get_reward

    spec = job.spec
    if spec.accelerator_for("trainer").type == "cpu":
        torch.set_num_threads(2)  # the peer has the machine to itself
    algo = spec.algorithm
    tok = char_tokenizer_fast()
    model = build_model(spec.model, CharTokenizer(), seed=algo.seed, dtype=torch.float32)
    examples = load_examples(spec.dataset)
    data = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in examples])
    score = get_reward(spec.reward.name)
    generated: list[int] = []

    def reward(prompts, completions, completion_ids, answer, **_):
        generated.append(sum(len(ids) for ids in completion_ids))
        return [score(p, c, a) for p, c, a in zip(prompts, completions, answer)]

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="rljob-trl-") as out:
        # from a directory, so TRL builds its frozen reference from the same weights
        weights = f"{out}/init"
        model.save_pretrained(weights)
        settings = trl_settings(job, steps, out, fair)
        fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
        if "activation_checkpointing" not in fields and "activation_checkpointing" in settings:
            # transformers before 5.18 names it gradient_checkpointing
            settings["gradient_checkpointing"] = settings.pop("activation_checkpointing")
        config = trl.GRPOConfig(**settings)
        trainer = trl.GRPOTrainer(model=weights, reward_funcs=reward, args=config,
                                  train_dataset=data, processing_class=tok,
                                  callbacks=[Clock()])
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its summary: keep --json clean
            trainer.train()
    steady = stamps[warmup_steps - 1:]
    seconds = steady[-1] - steady[0]
    # one reward call per generation batch, i.e. per optimizer step
    tokens = sum(generated[warmup_steps:len(stamps)])
    return {"steps": len(steady) - 1, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "step_seconds": seconds / (len(steady) - 1),
            "trl": trl.__version__}
