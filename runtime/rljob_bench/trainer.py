"""`rljob bench trainer`: the trainer's optimizer step on one device, for each
trainer engine side by side: `torch` (a transformers model, `policy.py`) and
`megatron` (a Megatron-core GPTModel, `mcore.py`).

Each engine's policy is made as the trainer worker makes it (`make_policy`, then
`freeze_reference` and `make_optimizer`: float32 master weights, the passes under
autocast in `model.dtype` on an accelerator, AdamW) from a randomly initialised
Qwen2: `tiny` (the examples' `models/tiny-qwen2`, character vocabulary) or
`qwen2-0.5b` (Qwen2-0.5B's shapes and vocabulary). One process, world 1
(megatron: tp 1 in a 1-rank process group, gloo on CPU, NCCL on GPU).

A step is the worker's: M micro-batches of synthetic GRPO samples (random token
ids, prompt length P, response length R, groups of G with random rewards and
their group-relative advantages, all on-policy) each through `micro_step` (policy
forward and backward, the reference's forward for the KL term, the GRPO loss),
then the gradient clip and the optimizer step. After W warm-up steps, N steps
are timed (device synchronised at both ends). Printed per engine: the median
step seconds, trained tokens per second (prompt + response tokens of the step's
samples over its seconds), the device's peak allocated memory (CUDA; none on
CPU), the optimizer state, the last step's loss and the change of the weights.

On CPU the megatron engine runs with two CUDA-only calls of mcore stepped
around (its rotary embedding moves its frequencies to the current CUDA device,
its dropout forks the CUDA RNG tracker), so the path can be checked without a
GPU; its figures there are not a measure of mcore on an accelerator."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .examples import example
from .weight_memory import RssSampler
from .weights import QWEN2_05B

MODELS = ("tiny", "qwen2-0.5b")
ENGINES = ("torch", "megatron", "torch-lora")  # torch-lora: the torch engine, model.lora
DEFAULT_ENGINES = ("torch", "megatron")
# what Qwen2-0.5B's config adds to its shapes
QWEN2_05B_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                    "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                    "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                    "torch_dtype": "bfloat16", **QWEN2_05B}
QWEN2_EOS = 151643  # <|endoftext|>: Qwen2's pad and eos


class IdTokenizer:
    """The little of a tokenizer the trainer uses for token ids it never decodes:
    the vocabulary's size and the special ids."""

    def __init__(self, vocab_size: int, special: int):
        self.vocab_size = vocab_size
        self.pad_token_id = self.bos_token_id = self.eos_token_id = special

    def __len__(self) -> int:
        return self.vocab_size


def model_config(model: str) -> dict:
    """The Hugging Face config of a bench model (pure but for reading tiny's file)."""
    if model == "tiny":
        return json.loads(example("models/tiny-qwen2/config.json").read_text())
    if model == "qwen2-0.5b":
        return dict(QWEN2_05B_CONFIG)
    raise ValueError(f"model {model!r}: use one of {', '.join(MODELS)}")


def step_shape(group: int, micro_batch: int, micro_batches: int) -> int:
    """Prompts per step of M micro-batches of `micro_batch` samples in groups of
    `group` (pure); a step holds whole groups."""
    samples = micro_batch * micro_batches
    if samples % group:
        raise ValueError(f"{micro_batches} micro-batches of {micro_batch} samples "
                         f"({samples}) do not make whole groups of {group}")
    return samples // group


def bench_spec(engine: str, accelerator: str, model_path: str, tokenizer: str | None,
               group: int, prompts: int, micro_batch: int, lr: float = 1e-6,
               lora_rank: int = 16):
    """The job spec the trainer would run: GRPO with the spec's defaults (clip, KL
    to the reference, gradient clip), `engine`, tp 1, no packing. The megatron
    engine is validated as the torch one and swapped in, since a spec refuses
    megatron on CPU (which the bench runs to check the path)."""
    from rljob.api.spec import RLJobSpec

    lora = {"rank": lora_rank, "alpha": 2 * lora_rank} if engine == "torch-lora" else None
    spec = RLJobSpec.model_validate({
        "model": {"path": f"random:{model_path}", "tokenizer": tokenizer,
                  "dtype": "float32" if accelerator == "cpu" else "bfloat16", "lora": lora},
        "dataset": {"path": "arith.jsonl"},  # not read: the samples are synthetic
        "algorithm": {"groupSize": group, "promptsPerStep": prompts,
                      "samplesPerMicroBatch": micro_batch, "lr": lr},
        "trainer": {"engine": "torch"},
        "accelerator": {"type": accelerator},
    })
    if engine == "megatron":
        spec = spec.model_copy(update={"trainer": spec.trainer.model_copy(
            update={"engine": engine})})
    return spec


def synthetic_step(step: int, prompts: int, group: int, prompt_len: int, response_len: int,
                   vocab: int, rng: np.random.Generator) -> list:
    """One step's samples in slot order, made by this step's weights (on-policy):
    random ids in [3, vocab), random rewards and each group's advantages, as
    `StepSource` hands them to the trainer."""
    from rljob.trainer.algorithms import GroupRelative
    from rljob.trainer.source import Sample

    samples = []
    for p in range(prompts):
        prompt = rng.integers(3, vocab, prompt_len).tolist()
        rewards = rng.random(group)
        adv = GroupRelative.of_group([float(r) for r in rewards])
        for i in range(group):
            samples.append(Sample(
                slot=p * group + i, group=p, version=step, prompt_ids=prompt,
                response_ids=rng.integers(3, vocab, response_len).tolist(),
                rollout_logp=[0.0] * response_len, reward=float(rewards[i]),
                released_at=0.0, started_at=0.0, finished_at=0.0,
                advantage=float(adv[i])))
    return samples


@contextlib.contextmanager
def _mcore_on_cpu(engine: str, device):
    """Megatron-core on CPU: its rotary embedding moves `inv_freq` to
    `torch.cuda.current_device()` and its attention dropout forks the CUDA RNG
    tracker; both are stepped around for the length of the block (the module's
    docstring). Elsewhere: nothing."""
    if engine != "megatron" or device.accelerated:
        yield
        return
    from megatron.core.tensor_parallel import random as mcore_random

    current, fork = torch.cuda.current_device, mcore_random.CudaRNGStatesTracker.fork
    torch.cuda.current_device = lambda: torch.device("cpu")
    mcore_random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.current_device = current
        mcore_random.CudaRNGStatesTracker.fork = fork


@contextlib.contextmanager
def _process_group(device):
    """The 1-rank process group mcore's parallel state needs (kept if one exists);
    torn down, with mcore's groups, if this made it."""
    import torch.distributed as dist

    from rljob.infra.netutil import free_port

    if dist.is_initialized():
        yield
        return
    dist.init_process_group(device.backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        try:
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        except ImportError:
            pass
        dist.destroy_process_group()


def _sync(device) -> None:
    if device.kind == "gpu":
        torch.cuda.synchronize()


def _weights(policy) -> list[torch.Tensor]:
    return [p.detach().to("cpu", torch.float32, copy=True) for p in policy.parameters()]


def _train(policy, opt, batches, tok, spec, device, micro_batch: int, micro_batches: int,
           warmup: int) -> tuple[list[float], dict]:
    """The worker's steps over `batches`: the seconds of each after `warmup`, and the
    last step's figures."""
    from rljob.trainer.step import micro_step, step_figures

    seconds, last = [], {}
    for t, samples in enumerate(batches):
        _sync(device)
        t0 = time.perf_counter()
        figures = []
        opt.zero_grad()
        for j in range(micro_batches):
            chunk = samples[j * micro_batch:(j + 1) * micro_batch]
            figures.append(micro_step(policy, chunk, t, tok, spec,
                                      last=j == micro_batches - 1))
        sums, _ = step_figures(figures, policy.data_world)
        grad_norm = policy.clip_grad_norm(spec.algorithm.max_grad_norm)
        opt.step()
        _sync(device)
        if t >= warmup:
            seconds.append(time.perf_counter() - t0)
        last = {**sums, "grad_norm": grad_norm}
    return seconds, last


def run_engine(engine: str, accelerator: str, model: str, steps: int, warmup: int,
               prompt_len: int, response_len: int, group: int, micro_batch: int,
               micro_batches: int, seed: int = 0, lora_rank: int = 16) -> dict:
    from rljob.infra.device import activate, cores_given, resolve
    from rljob.inputs.models import load_tokenizer
    from rljob.trainer import mcore  # noqa: F401 - registers trainer.engine megatron
    from rljob.trainer.checkpoint import make_optimizer, optimizer_state_bytes
    from rljob.trainer.policy import make_policy

    device = resolve(accelerator)
    torch_device = activate(device)
    if not device.accelerated:
        torch.set_num_threads(cores_given())
    prompts = step_shape(group, micro_batch, micro_batches)
    cfg = model_config(model)
    with contextlib.ExitStack() as stack:
        if model == "tiny":
            model_path, tokenizer = str(example("models/tiny-qwen2")), "builtin:char"
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rljob-bench-")))
            (tmp / "config.json").write_text(json.dumps(cfg))
            model_path, tokenizer = str(tmp), None
        spec = bench_spec(engine, accelerator, model_path, tokenizer, group, prompts,
                          micro_batch, lora_rank=lora_rank)
        tok = (load_tokenizer(spec.model) if tokenizer
               else IdTokenizer(cfg["vocab_size"], QWEN2_EOS))
        if engine == "megatron":
            stack.enter_context(_process_group(device))
        stack.enter_context(_mcore_on_cpu(engine, device))
        if device.kind == "gpu":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        gc.collect()
        host = RssSampler({"trainer": os.getpid()})  # this process's resident memory
        t0 = time.perf_counter()
        policy = make_policy(spec, tok, device, torch_device, 0, 1)
        if spec.model.lora is not None:  # as the worker does, after its warm-up
            policy.add_adapter()
        policy.freeze_reference()
        opt = make_optimizer(policy, spec.algorithm.lr)
        _sync(device)
        build_seconds = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        batches = [synthetic_step(t, prompts, group, prompt_len, response_len, len(tok), rng)
                   for t in range(warmup + steps)]
        before = _weights(policy)
        seconds, last = _train(policy, opt, batches, tok, spec, device, micro_batch,
                               micro_batches, warmup)
        peak = torch.cuda.max_memory_allocated() if device.kind == "gpu" else None
        host_peak = host.stop()["trainer"][1] * 2**20 / 1e9  # VmRSS growth, MiB -> GB
        after = _weights(policy)
        change = math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(after, before)))
        norm = math.sqrt(sum(float((b ** 2).sum()) for b in before))
        step_seconds = statistics.median(seconds)
        tokens = prompts * group * (prompt_len + response_len)
        result = {
            "step_seconds": step_seconds,
            "step_seconds_min": min(seconds),
            "tokens_per_s": tokens / step_seconds,
            "samples_per_s": prompts * group / step_seconds,
            "peak_memory_gb": peak / 1e9 if peak is not None else None,
            "peak_host_gb": host_peak,
            "optimizer_state_mb": optimizer_state_bytes(opt) / 1e6,
            "parameters": sum(p.numel() for p in policy.parameters()),
            "build_seconds": build_seconds,
            "loss": last["loss"], "kl": last["kl"], "grad_norm": last["grad_norm"],
            "weight_change": change / norm,
        }
        del policy, opt, before, after
        gc.collect()
        if device.kind == "gpu":
            torch.cuda.empty_cache()
    return result


def run(engines: tuple[str, ...] = DEFAULT_ENGINES, accelerator: str = "cpu",
        model: str = "tiny", steps: int = 5, warmup: int = 2, prompt_len: int = 16,
        response_len: int = 32, group: int = 8, micro_batch: int = 8, micro_batches: int = 2,
        lora_rank: int = 16) -> dict:
    """Every engine in `engines`, one after the other. An engine that fails (mcore
    missing, a kernel it lacks on this device) is reported with its error; the
    others still run."""
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise ValueError(f"engines {sorted(unknown)}: use {', '.join(ENGINES)}")
    prompts = step_shape(group, micro_batch, micro_batches)
    cfg = model_config(model)
    results = {"job": {"model": model, "accelerator": accelerator, "device": _device_name(
                           accelerator),
                       "dtype": "float32" if accelerator == "cpu" else "bfloat16",
                       "layers": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
                       "vocab": cfg["vocab_size"], "group_size": group, "prompts": prompts,
                       "prompt_len": prompt_len, "response_len": response_len,
                       "micro_batch": micro_batch, "micro_batches": micro_batches,
                       "tokens_per_step": prompts * group * (prompt_len + response_len),
                       "steps": steps, "warmup": warmup, "torch": torch.__version__},
               "engines": {}}
    for engine in engines:
        try:
            results["engines"][engine] = run_engine(
                engine, accelerator, model, steps, warmup, prompt_len, response_len, group,
                micro_batch, micro_batches, lora_rank=lora_rank)
        except Exception as exc:  # noqa: BLE001 - reported in the results, next engine
            results["engines"][engine] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    results["job"]["lora_rank"] = lora_rank if "torch-lora" in engines else None
    e = results["engines"]
    if all("step_seconds" in e.get(n, {}) for n in ("torch", "torch-lora")):
        results["lora_over_torch"] = {
            k: e["torch-lora"][k] / e["torch"][k] if e["torch"][k] else None
            for k in ("step_seconds", "optimizer_state_mb", "peak_host_gb", "peak_memory_gb")
            if e["torch"][k] is not None}
    if all("step_seconds" in e.get(n, {}) for n in DEFAULT_ENGINES):
        results["megatron_over_torch"] = {
            "step_seconds": e["megatron"]["step_seconds"] / e["torch"]["step_seconds"],
            "peak_memory": (e["megatron"]["peak_memory_gb"] / e["torch"]["peak_memory_gb"]
                            if e["torch"]["peak_memory_gb"] else None)}
    return results


def _device_name(accelerator: str) -> str:
    if accelerator == "gpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    import platform

    return platform.processor() or platform.machine()


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    j = results["job"]
    table = Table(title=f"trainer step: {j['model']} on {j['accelerator']} ({j['device']}), "
                  f"{j['dtype']}; medians of {j['steps']} steps after {j['warmup']}")
    for col in ("engine", "step s", "tokens/s", "peak GB", "host peak GB", "optimizer MB",
                "loss", "KL", "grad norm", "weights Δ", "build s"):
        table.add_column(col, justify="right")

    def f(v, fmt="{:.3f}"):
        return "-" if v is None else fmt.format(v)

    errors = []
    for name, e in results["engines"].items():
        if "error" in e:
            table.add_row(name, *["-"] * 10)
            errors.append(f"{name}: {e['error']}")
            continue
        table.add_row(name, f(e["step_seconds"], "{:.4f}"), f(e["tokens_per_s"], "{:.0f}"),
                      f(e["peak_memory_gb"], "{:.2f}"), f(e["peak_host_gb"], "{:.2f}"),
                      f(e["optimizer_state_mb"], "{:.1f}"),
                      f(e["loss"], "{:.2e}"), f(e["kl"], "{:.2e}"), f(e["grad_norm"], "{:.3f}"),
                      f(e["weight_change"], "{:.2e}"), f(e["build_seconds"], "{:.1f}"))
    console = Console(width=max(120, Console().width))
    console.print(f"{j['model']}: {j['layers']} layers, hidden {j['hidden']}, vocab "
                  f"{j['vocab']}; a step: {j['prompts']} prompts x {j['group_size']} samples "
                  f"of {j['prompt_len']}+{j['response_len']} tokens ({j['tokens_per_step']}), "
                  f"{j['micro_batches']} micro-batches of {j['micro_batch']}; torch "
                  f"{j['torch']}", markup=False)
    console.print(table)
    for line in errors:
        console.print(f"failed: {line}", markup=False)
    r = results.get("megatron_over_torch")
    if r:
        mem = f", peak memory {r['peak_memory']:.2f}x" if r["peak_memory"] else ""
        console.print(f"megatron / torch: step seconds {r['step_seconds']:.2f}x{mem}")
    r = results.get("lora_over_torch")
    if r:
        console.print(f"torch-lora (r={j['lora_rank']}) / torch: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.2f}x" for k, v in r.items() if v is not None))
