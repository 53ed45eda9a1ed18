"""Performance profiles: what the cost model knows about hardware and the model.

A `GenProfile` maps a decode batch size to the per-token latency PTL(BS) of
one rollout instance, either measured on live rollout workers (they report
(batch size, per-token latency) samples) or derived analytically from
hardware and model figures. A `TrainProfile` gives trainer tokens/s over NPU
counts. Both serialize to JSON so a job can start from a previous job's
profile.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..infra.hardware import Hardware


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of an LLM."""

    params: float  # parameter count
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @classmethod
    def from_config(cls, config: dict, bytes_per_param: int = 2) -> ModelShape:
        """From a transformers config.json (decoder-only)."""
        hidden = config["hidden_size"]
        layers = config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim", hidden // heads)
        inter = config.get("intermediate_size", 4 * hidden)
        vocab = config.get("vocab_size", 32000)
        attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
        mlp = 3 * hidden * inter
        embed = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
        return cls(layers * (attn + mlp) + embed, layers, kv_heads, head_dim, bytes_per_param)


# Well-known shapes for planning without the weights at hand.
MODEL_PRESETS = {
    "qwen2.5-0.5b": ModelShape(0.49e9, 24, 2, 64),
    "qwen2.5-1.5b": ModelShape(1.54e9, 28, 2, 128),
    "qwen2.5-7b": ModelShape(7.6e9, 28, 4, 128),
    "qwen2.5-14b": ModelShape(14.7e9, 48, 8, 128),
    "qwen2.5-32b": ModelShape(32.5e9, 64, 8, 128),
    "qwen2.5-72b": ModelShape(72.7e9, 80, 8, 128),
    "llama-3-8b": ModelShape(8.0e9, 32, 8, 128),
    "llama-3-70b": ModelShape(70.6e9, 80, 8, 128),
}


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, linear extrapolation past the ends."""
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def non_decreasing(ys: list[float], weights: list[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to `ys` in weighted least squares (pool
    adjacent violators: a run that falls is replaced by its weighted mean) (pure)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for y, w in zip(ys, weights or [1.0] * len(ys)):
        blocks.append([float(y), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [m for m, _, n in blocks for _ in range(n)]


@dataclass
class GenProfile:
    """Per-token latency of one rollout instance versus its decode batch size."""

    batch_sizes: list[float]
    ptl_seconds: list[float]
    max_batch_size: int
    source: str = "measured"
    # seconds of prefill per prompt token (0: not measured; decode dominates)
    prefill_per_token: float = 0.0

    def __post_init__(self):
        if not self.batch_sizes or len(self.batch_sizes) != len(self.ptl_seconds):
            raise ValueError("a generation profile needs matching batch_sizes and ptl_seconds")
        pairs = sorted(zip(self.batch_sizes, self.ptl_seconds))
        self.batch_sizes = [float(b) for b, _ in pairs]
        self.ptl_seconds = [float(p) for _, p in pairs]

    def ptl(self, batch: float) -> float:
        """Seconds per decode step at this (average) batch size; never below the
        smallest measured latency (a step has a floor)."""
        b = min(max(batch, 1.0), float(self.max_batch_size))
        return max(_interp(self.batch_sizes, self.ptl_seconds, b), min(self.ptl_seconds))

    @classmethod
    def from_samples(cls, samples: list[tuple[float, float]], max_batch_size: int) -> GenProfile:
        """From live (batch size, per-token latency) reports: median per batch size,
        then the closest non-decreasing curve (`non_decreasing`): a decode step over
        more rows does no less work, so a larger batch measured faster than a smaller
        one is noise (a busy machine), and left in it would predict that fewer rows
        per replica take longer — one more replica saving nothing, or costing time."""
        by_bs: dict[float, list[float]] = {}
        for bs, lat in samples:
            by_bs.setdefault(float(bs), []).append(float(lat))
        bss = sorted(by_bs)
        meds = [sorted(v)[len(v) // 2] for v in (by_bs[b] for b in bss)]
        fitted = non_decreasing(meds, [len(by_bs[b]) for b in bss])
        return cls(bss, fitted, max_batch_size, "measured")

    @classmethod
    def analytic(cls, hw: Hardware, model: ModelShape, tensor_parallel: int = 1,
                 context_tokens: int = 2048, tp_efficiency: float = 0.85) -> GenProfile:
        """Roofline estimate: a decode step reads the weights once and the batch's
        KV cache, or is compute bound at 2·params FLOPs per token, whichever is
        slower; memory left after the weights bounds the batch size."""
        devices = tensor_parallel
        scale = devices * (tp_efficiency if devices > 1 else 1.0)
        bw = hw.mem_bandwidth * hw.decode_bw_efficiency * scale
        flops = hw.peak_flops * hw.decode_flops_efficiency * scale
        weight_bytes = model.params * model.bytes_per_param
        free = hw.memory * devices * 0.9 - weight_bytes
        if free <= 0:
            raise ValueError(f"{model.params / 1e9:.1f}B parameters do not fit on {devices} × "
                             f"{hw.name}: raise rollout.tensorParallel")
        max_bs = max(1, int(free / (model.kv_bytes_per_token * context_tokens)))
        max_bs = min(max_bs, 512)
        points = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, max_bs})
        points = [b for b in points if b <= max_bs]
        ptl = []
        for b in points:
            memory_time = (weight_bytes + b * model.kv_bytes_per_token * context_tokens / 2) / bw
            compute_time = 2 * model.params * b / flops
            ptl.append(hw.step_overhead + max(memory_time, compute_time))
        return cls([float(b) for b in points], ptl, max_bs, f"analytic ({hw.name}, tp={devices})")


@dataclass
class TrainProfile:
    """Trainer throughput in tokens/s over NPU counts (measured or analytic)."""

    npus: list[float]
    tokens_per_second: list[float]
    source: str = "measured"

    def __post_init__(self):
        pairs = sorted(zip(self.npus, self.tokens_per_second))
        self.npus = [float(n) for n, _ in pairs]
        self.tokens_per_second = [float(t) for _, t in pairs]

    def throughput(self, npus: int) -> float:
        """tokens/s on `npus`, interpolated in log-log space; never decreasing in npus."""
        if npus <= 0:
            return 0.0
        if len(self.npus) == 1:
            n0, t0 = self.npus[0], self.tokens_per_second[0]
            # one point: the analytic shape of scaling from there
            return t0 * (npus / n0) / (1 + 0.05 * math.log2(max(npus / n0, 1.0)))
        lx = [math.log(n) for n in self.npus]
        ly = [math.log(t) for t in self.tokens_per_second]
        best = math.exp(_interp(lx, ly, math.log(npus)))
        # adding devices never makes a well-run job slower: keep it monotone
        below = [t for n, t in zip(self.npus, self.tokens_per_second) if n <= npus]
        return max([best] + below)

    def step_seconds(self, tokens: float, npus: int) -> float:
        return tokens / self.throughput(npus)

    @classmethod
    def analytic(cls, hw: Hardware, model: ModelShape, max_npus: int = 1024) -> TrainProfile:
        """GRPO's tri-model step: policy forward+backward (6·P FLOPs per token) plus
        old-policy and reference forwards (2·P each)."""
        flops_per_token = 10 * model.params
        npus, tps = [], []
        n = 1
        while n <= max_npus:
            eff = hw.train_efficiency / (1 + hw.comm_alpha * math.log2(n))
            npus.append(float(n))
            tps.append(n * hw.peak_flops * eff / flops_per_token)
            n *= 2
        return cls(npus, tps, f"analytic ({hw.name})")


def model_name(path: str) -> str:
    """A model's name for matching profiles to jobs: its directory's (or hub id's)
    last part, whether its weights are loaded or random-initialised from its config
    (the same shapes: the same latencies) and wherever it is mounted (pure)."""
    return path.removeprefix("random:").rstrip("/").rsplit("/", 1)[-1]


# what a job must share with the setup a profile was measured on to use it
SETUP = ("model", "dtype", "engine", "rollout_accelerator", "trainer_accelerator",
         "tensor_parallel")


def measured_on(spec, source: str) -> dict:
    """What a profile was measured on: the `SETUP` fields, the responses' cap, when
    and how."""
    return {"model": model_name(spec.model.path), "dtype": spec.model.dtype,
            "engine": spec.rollout.engine,
            "rollout_accelerator": spec.accelerator_for("rollout").type,
            "trainer_accelerator": spec.accelerator_for("trainer").type,
            "tensor_parallel": spec.rollout.tensor_parallel,
            "max_new_tokens": spec.rollout.max_new_tokens,
            "created": time.time(), "source": source}


@dataclass
class Profile:
    """Everything the planner needs, as one JSON document. `meta`: what it was
    measured on (`measured_on`); empty for a hand-written profile."""

    gen: GenProfile
    train: TrainProfile
    # observed output lengths (tokens) of recent samples; empty = assume from the spec
    output_lengths: list[int] = field(default_factory=list)
    prompt_tokens: float = 256.0
    meta: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            raw = json.loads(text)
            return cls(GenProfile(**raw["gen"]), TrainProfile(**raw["train"]),
                       [int(x) for x in raw.get("output_lengths", [])],
                       float(raw.get("prompt_tokens", 256.0)), dict(raw.get("meta") or {}))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a planner profile: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def fit(self, spec, now: float, max_age_days: float = 30.0
            ) -> tuple[Profile | None, list[str]]:
        """This profile as far as it holds for `spec` (pure): None where it was measured
        on another model, dtype, engine, accelerator or tensor parallelism (its
        latencies say nothing of this job); its workload dropped (the spec's assumed
        instead) where its responses were capped by another rollout.maxNewTokens or
        it is older than `max_age_days`. Each refusal or drop comes with one line
        saying which field and why."""
        if not self.meta:
            return self, []
        job = measured_on(spec, "")
        differ = [f"{k} {self.meta[k]!r} (the job's: {job[k]!r})" for k in SETUP
                  if k in self.meta and self.meta[k] != job[k]]
        if differ:
            return None, [f"profile measured on another setup: {', '.join(differ)}; "
                          "measure this job's (rljob profile JOB.yaml)"]
        notes = []
        cap = self.meta.get("max_new_tokens")
        age = (now - self.meta.get("created", now)) / 86400
        if cap is not None and cap != spec.rollout.max_new_tokens and self.output_lengths:
            notes.append(f"profile's workload dropped: its responses were capped at "
                         f"{cap} tokens, the job's rollout.maxNewTokens is "
                         f"{spec.rollout.max_new_tokens}")
        elif age > max_age_days and self.output_lengths:
            notes.append(f"profile's workload dropped: measured {age:.0f} days ago "
                         f"(older than {max_age_days:.0f})")
        if notes:
            return Profile(self.gen, self.train, [], self.prompt_tokens, self.meta), notes
        return self, []
