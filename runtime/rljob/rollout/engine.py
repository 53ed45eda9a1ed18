"""Rollout engines: generate n responses per prompt with their log-probs, load a
weight version. `HFEngine` (transformers, CPU/GPU) here; other engines live in
modules of their own and join the registry by decorator (`vllm_engine.py`:
`VLLMEngine`, vllm / vllm-ascend imported only when one is made). This module never
imports a backend; the rollout worker imports the backends it offers.

    @register_engine("mine")
    class MyEngine(RolloutEngine):
        @classmethod
        def create(cls, model_spec, rollout_spec, tokenizer, model, accelerator, seed):
            ...
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from ..infra.registry import Registry
from ..sampling import TokenDistribution, sampled_logprobs, seeded_sample
from ..workflow.versions import VersionChanges, changed
from .updates import UpdateGate


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # one seed per prompt: a prompt's n samples depend on its seed only, not on the
    # other prompts generated in the same batch (overrides `seed`)
    seeds: tuple[int, ...] | None = None
    # a text that ends a row (an environment's tool-call close tag): the engine may
    # stop a row once its tokens spell it; the caller cuts at it (episodes.cut_at_stop)
    stop: str | None = None

    @property
    def distribution(self) -> TokenDistribution:
        return TokenDistribution(self.temperature, self.top_p)

    def prompt_seeds(self, count: int) -> list[int | None]:
        if self.seeds is not None:
            if len(self.seeds) != count:
                raise ValueError(f"{len(self.seeds)} seeds for {count} prompts")
            return list(self.seeds)
        return [self.seed] * count


@dataclass
class Generation:
    response_ids: list[int]
    logprobs: list[float]  # per response token, under the sampling distribution (sampling.py)
    # of the prompt, the tokens whose KV the engine's prefix cache held (None: the
    # engine has no such cache)
    cached_tokens: int | None = None
    # the weight version of its tokens (workflow/versions.py): [(0, version, epoch)], and a
    # change point more for each update that interrupted it (None: not recorded)
    versions: VersionChanges | None = None


@dataclass
class GenTiming:
    """One engine call's work and time (a profile's input): `rows` sequences decoded
    together, the prompt tokens its prefill computed, the tokens it generated, its
    decode steps, and the seconds of the prefill (to the first token) and of the
    decode steps after it."""

    rows: int
    prompt_tokens: int
    output_tokens: int
    steps: int
    prefill_seconds: float
    decode_seconds: float


class RolloutEngine(ABC):
    version: int = -1
    epoch: int = 0  # the weight sender's life `version` came from
    # concurrent engines take groups one by one (`submit`) and keep many in flight;
    # the others generate a batch per `generate` call
    concurrent: bool = False
    drain_seconds: float = 0.0  # of the last update: generations in flight finishing
    # the collective weight path (`weights/collective.py`): an engine whose model
    # lives in processes of its own (vLLM) joins the weight group with those
    # processes' ranks and loads each broadcast there; the weights of the others
    # (weight_ranks 0) are received by this process, into `weight_device()`
    weight_ranks: int = 0
    transfer_seconds: float = 0.0  # of the last broadcast loaded by the engine itself
    # workflow.weightUpdate interrupt: engines that stop generation at a token
    # boundary for an update (`gate`, set by `interruptible`) and go on after it
    can_interrupt: bool = False
    gate: UpdateGate | None = None
    keep_cache: bool = False  # interruptCache keep: the rows go on from their KV cache
    # model.lora: an engine that serves the adapter on its base takes each update as
    # it comes, the adapter alone; the others' receivers merge it into the base
    # (`weights.adapter.AdapterMerge`) and hand them whole weights
    takes_adapter: bool = False

    def interruptible(self, keep: bool = False) -> RolloutEngine:
        """From now on an update interrupts generation instead of draining it; with
        `keep` the rows go on on the KV cache the old weights computed
        (workflow.interruptCache keep) rather than computing their prefix again."""
        if not self.can_interrupt:
            raise ValueError(f"{type(self).__name__} cannot interrupt generation for an update")
        self.gate = UpdateGate()
        self.keep_cache = keep
        return self

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        """For each prompt (token ids), `params.n` generations."""

    @abstractmethod
    def load_weights(self, state_dict: dict, version: int, epoch: int = 0) -> None:
        """Replace the policy weights with those of `version` (of sender life `epoch`)."""

    @classmethod
    def create(cls, model_spec, rollout_spec, tokenizer, model, accelerator: str,
               seed: int) -> RolloutEngine:
        """The engine for a job's `model` and `rollout` sections (`model`: the
        transformers model the worker built, for engines that run it in-process)."""
        raise NotImplementedError

    def weight_device(self):
        import torch

        return torch.device("cpu")

    def take_timings(self) -> list[GenTiming]:
        """The calls timed since the last take (engines that time theirs)."""
        timings, self._timings = getattr(self, "_timings", []), []
        return timings

    def join_weight_group(self, backend: str, store: str, prefix: str, first_rank: int,
                          world: int) -> None:
        """Join the engine's ranks (first_rank, first_rank + 1, ...) to a weight group."""
        raise NotImplementedError(f"{type(self).__name__} receives weights in-process")

    def load_broadcast(self, sizes: list[int], slots: list, version: int, epoch: int) -> None:
        """Receive a broadcast version in the engine's own ranks and load it there."""
        raise NotImplementedError(f"{type(self).__name__} receives weights in-process")

    def close(self) -> None:
        """Stop the engine's own processes, if it has any."""


ENGINES: Registry[type[RolloutEngine]] = Registry("rollout.engine", RolloutEngine,
                                                      "rljob.rollout_engines")
register_engine = ENGINES.register


class _SeededSampler:
    """A logits processor that samples itself (per-row uniforms drawn from each
    prompt's seed) and hands `generate` a one-hot choice to take greedily. It keeps
    each chosen token's log-prob under `dist`, from the logits it was drawn from."""

    def __init__(self, uniforms, width: int, dist: TokenDistribution):
        self.uniforms, self.width, self.dist = uniforms, width, dist
        self.logprobs: list = []  # per generated position: [rows]
        self.times: list[float] = []  # when each position's logits came (perf_counter)

    def __call__(self, input_ids, scores):
        import torch

        self.times.append(time.perf_counter())
        t = input_ids.shape[1] - self.width
        tok = seeded_sample(scores, self.uniforms[:, t], self.dist)  # a tokenizer id
        # kept on the device until the call ends: a copy to the host here would wait
        # for every decode step's kernels (a synchronisation a token)
        self.logprobs.append(sampled_logprobs(scores, tok, self.dist).float())
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, tok.unsqueeze(1), 0.0)


class _StopText:
    """A stopping criterion: a row ends once its generated tokens spell `stop` (the
    newest `window` tokens are decoded each step); `ends[row]` is how many tokens
    the row has then."""

    def __init__(self, stop: str, decode, width: int, rows: int):
        self.stop, self.decode, self.width = stop, decode, width
        self.window = 4 * len(stop) + 4  # a token spells at least one character, most
        self.ends: list[int | None] = [None] * rows

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        new = input_ids[:, self.width:]
        t = new.shape[1]
        tails = new[:, max(0, t - self.window):].tolist()
        for r, tail in enumerate(tails):
            if self.ends[r] is None and self.stop in self.decode(tail):
                self.ends[r] = t
        return torch.tensor([e is not None for e in self.ends], dtype=torch.bool,
                            device=input_ids.device)


PROMPT_BUCKET = 8  # tokens: on CPU prompts are left-padded to the next multiple of this
# rows a `generate` computes at least, where the machine's BLAS needs no more
# (`row_floor`): a batch of fewer rows gets copies of its last
MIN_ROWS = 4
# the most rows `row_floor` measures up to: a model whose products differ beyond it
# pads small batches to this many rows
ROW_PROBE = 256


@functools.lru_cache(maxsize=None)
def row_floor(shapes: tuple[tuple[int, int], ...], dtype=None, most: int = ROW_PROBE) -> int:
    """The fewest rows from which a product `x @ W.T` gives each row the same bits
    whatever the number of rows, for every (in, out) shape of `shapes`, as this
    machine's BLAS computes it (measured once per process: at least MIN_ROWS). A BLAS
    runs small row counts on kernels of their own, with other summation orders, and
    where they end depends on the CPU and the shape: on one Xeon with AVX-512, 6 rows
    for 128 inputs, 11 for 256, 113 for 896. A decode step's products have as many
    rows as the batch, so a row's bits follow from the row alone only from this many
    rows up. Counts are tried upwards; one that agrees with `most` rows is taken
    once every count up to twice it, and each power of two up to `most`, agree too."""
    import torch

    floor = MIN_ROWS
    gen = torch.Generator().manual_seed(0)
    for k, n in sorted(set(shapes)):
        w = torch.randn(n, k, generator=gen, dtype=dtype or torch.float32)
        x = torch.randn(most, k, generator=gen, dtype=w.dtype)
        whole = torch.nn.functional.linear(x, w)

        def alike(rows: int) -> bool:
            return torch.equal(torch.nn.functional.linear(x[:rows], w), whole[:rows])

        rows = floor
        while rows < most:
            if not alike(rows):
                rows += 1
                continue
            checks = [*range(rows + 1, min(2 * rows, most)),
                      *(2 ** e for e in range(12) if rows < 2 ** e < most)]
            unlike = next((m for m in checks if not alike(m)), None)
            if unlike is None:
                break
            rows = unlike + 1
        floor = max(floor, rows)
    return floor


def linear_shapes(model) -> list[tuple[int, int]]:
    """The (in, out) shape of every linear layer of `model` (pure)."""
    import torch

    return sorted({(m.in_features, m.out_features) for m in model.modules()
                   if isinstance(m, torch.nn.Linear)})


def prompt_width(length: int) -> int:
    """The width a prompt of `length` tokens is left-padded to on CPU (pure): the
    next multiple of PROMPT_BUCKET above it, so every prompt has at least one pad
    and every row of a batch computes under the padding mask (a batch without any
    pad lets transformers drop the mask and run another attention kernel). Every
    padded token is computed in the prefill: the bucket is small."""
    return (length // PROMPT_BUCKET + 1) * PROMPT_BUCKET


@register_engine("hf")
class HFEngine(RolloutEngine):
    """transformers `generate` on left-padded batches of many prompts; sampling is done
    per row from each prompt's own seed (`seeded_sample`), so a batch of any size
    gives every prompt the samples it would get alone.

    The log-probs reported are those of the logits each token was drawn from. On
    CPU a row's bits follow from the row alone: prompts go in buckets by length
    (`prompt_width`), each bucket one `generate` at its width (on an accelerator,
    whose kernels are chosen by shape, one `generate` at the batch's), the padding mask
    keeps every real token off the pads, the model attends eagerly (torch's
    fused attention splits a one-token query's keys over threads by the batch's
    size), and a `generate` has at least as many rows as the machine's BLAS needs to
    compute each row alike (`row_floor`, measured when the engine is made); the rows
    beside a row, their number and their lengths change none of
    its logits. So a streamed step samples and reports what a whole-step batch
    does, bit for bit, with no second forward.

    With weightUpdate interrupt (`interruptible`), an update stops a `generate` at
    a decode-step boundary and the rows go on under the new weights (`_generate`):
    their tokens so far are computed again as prompt, so the KV of the old weights
    is not reused; with interruptCache keep (`interruptible(keep=True)`) the rows go
    on from the KV cache the stretch before left (transformers' DynamicCache, the
    rows still going selected from it), and only their last token is computed
    anew."""

    can_interrupt = True
    takes_adapter = True  # model.lora: PEFT's adapter on the model, updated in place

    def __init__(self, model, tokenizer):
        import torch

        from ..inputs.models import turn_end_ids

        self.torch = torch
        self.model = model.eval()
        self.tok = tokenizer
        self.ends = turn_end_ids(tokenizer)  # the EOS, and Llama 3.1's <|eom_id|>
        # on CPU a row's bits follow from the row alone (the docstring says how); an
        # accelerator's kernels are chosen by shape anyway
        self.row_exact = self.weight_device().type == "cpu"
        self.min_rows = MIN_ROWS
        if self.row_exact:
            self.model.set_attn_implementation("eager")
            self.min_rows = row_floor(tuple(linear_shapes(self.model)),
                                      next(self.model.parameters()).dtype)

    @classmethod
    def create(cls, model_spec, rollout_spec, tokenizer, model, accelerator: str,
               seed: int) -> HFEngine:
        if model is None:
            raise ValueError("the hf engine needs the model")
        if model_spec.lora is not None:  # the trainer's adapter, computed as it computes it
            from peft import get_peft_model

            from ..trainer.lora import lora_config

            model = get_peft_model(model, lora_config(model_spec.lora, model))
        return cls(model, tokenizer)

    def load_weights(self, state_dict: dict, version: int, epoch: int = 0) -> None:
        """A version in place: every weight, or with model.lora the adapter's (and,
        the first time from a trainer life, the base's under it)."""
        if hasattr(self.model, "disable_adapter"):
            from ..trainer.lora import load_into

            load_into(self.model, state_dict)
        else:
            self.model.load_state_dict(state_dict)
        self.version, self.epoch = version, epoch

    def weight_device(self):
        return next(self.model.parameters()).device

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Generation]]:
        torch = self.torch
        uniforms = []
        for seed in params.prompt_seeds(len(prompts)):
            gen = torch.Generator()
            if seed is None:
                gen.seed()
            else:
                gen.manual_seed(seed)
            uniforms.append(torch.rand(params.n, params.max_new_tokens, generator=gen,
                                       dtype=torch.float64))
        dist = replace(params.distribution, vocab=len(self.tok))
        longest = max(len(p) for p in prompts)
        buckets: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            buckets.setdefault(prompt_width(len(p)) if self.row_exact else longest,
                               []).append(i)
        out: list[list[Generation]] = [[] for _ in prompts]
        for width, members in sorted(buckets.items()):
            groups = self._generate([prompts[i] for i in members],
                                    torch.cat([uniforms[i] for i in members]), width,
                                    params, dist)
            for i, group in zip(members, groups):
                out[i] = group
        return out

    def _generate(self, prompts: list[list[int]], uniforms, width: int,
                  params: SamplingParams, dist: TokenDistribution) -> list[list[Generation]]:
        """One `generate` of `prompts` left-padded to `width`, n rows each. With a
        gate (weightUpdate interrupt) it runs in stretches: an update stops every
        row at a token boundary, the new weights load, and the rows not finished go
        on from their tokens so far (re-read as a longer prompt) under them; their
        later draws come from the same uniforms (position by position), their
        log-probs from the new weights' logits. Weights of a new trainer life
        (epoch) start the batch again."""
        import contextlib

        torch = self.torch
        pad = self.tok.pad_token_id
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        # n rows per prompt (prompt-major), as the uniforms are laid out
        ids, attn = ids.repeat_interleave(params.n, 0), attn.repeat_interleave(params.n, 0)
        rows = len(ids)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        versions: list[list] = [[] for _ in range(rows)]
        live = list(range(rows))
        cache, cached_rows = None, []  # interruptCache keep: the last stretch's KV, its rows
        while live:
            with self.gate.generating() if self.gate else contextlib.nullcontext():
                if versions[0] and versions[0][0][2] != self.epoch:
                    # the trainer restarted (a new epoch): what the dead life's weights
                    # wrote is not in the new one's history, and would be refused; the
                    # whole batch starts again under the new weights
                    tokens, logps = [[] for _ in range(rows)], [[] for _ in range(rows)]
                    versions, live = [[] for _ in range(rows)], list(range(rows))
                    cache = None
                done = len(tokens[live[0]])  # every row still going has as many tokens
                for r in live:
                    versions[r] = changed(versions[r], done, self.version, self.epoch)
                at = torch.tensor(live)
                seg_ids, seg_attn = ids[at], attn[at]
                if done:  # the tokens so far, after the prompt
                    seg_ids = torch.cat([seg_ids, torch.tensor([tokens[r] for r in live])], 1)
                    seg_attn = torch.cat([seg_attn, torch.ones(len(live), done,
                                                               dtype=seg_attn.dtype)], 1)
                past = None
                if cache is not None:  # the rows still going, from the stretch before
                    cache.batch_select_indices(torch.tensor([cached_rows.index(r)
                                                             for r in live]))
                    past = cache
                new, new_logps, ended, cache = self._stretch(
                    seg_ids, seg_attn, uniforms[at], width, params, dist, done, past)
                cached_rows = list(live)
            for k, r in enumerate(live):
                tokens[r] += new[k]
                logps[r] += new_logps[k]
            live = [r for k, r in enumerate(live)
                    if not ended[k] and len(tokens[r]) < params.max_new_tokens]
        return [[Generation(tokens[k], logps[k], versions=versions[k])
                 for k in range(i * params.n, (i + 1) * params.n)]
                for i in range(len(prompts))]

    def _stretch(self, ids, attn, uniforms, width: int, params: SamplingParams,
                 dist: TokenDistribution, done: int, past=None):
        """One transformers `generate` of rows left-padded to `width` that have
        `done` tokens after it already; it stops at the end of every row or, with a
        gate, at the first token boundary after an update is asked for. Returns each
        row's new tokens, their log-probs, whether the row ended (its end token,
        the stop text) and, with interruptCache keep, the KV cache it leaves (`past`:
        the one the stretch before left, of these rows: generation goes on from it)."""
        torch = self.torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        pad, ends = self.tok.pad_token_id, self.ends
        device = self.weight_device()
        real = len(ids)
        if real < self.min_rows:  # copies of the last row, dropped below
            extra = self.min_rows - real
            ids, attn = torch.cat([ids, ids[-1:].expand(extra, -1)]), \
                torch.cat([attn, attn[-1:].expand(extra, -1)])
            uniforms = torch.cat([uniforms, uniforms[-1:].expand(extra, -1)])
            if past is not None:  # the copies' cache too
                past.batch_select_indices(torch.tensor([*range(real), *[real - 1] * extra]))
        cached = past.get_seq_length() if past is not None else 0
        sampler = _SeededSampler(uniforms, width, dist)
        # a row that spells the stop text ends there (the others go on; its bits and
        # theirs are those of a run without the criterion up to its end)
        stop = (_StopText(params.stop, self.tok.decode, width, len(ids)) if params.stop
                else None)
        criteria = [c for c in (stop, _Interrupt(self.gate) if self.gate else None) if c]
        began = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=attn.to(device), do_sample=False,
                logits_processor=LogitsProcessorList([sampler]),
                stopping_criteria=StoppingCriteriaList(criteria),
                max_new_tokens=params.max_new_tokens - done,
                pad_token_id=pad, eos_token_id=list(ends), return_dict_in_generate=True,
                **({_cache_field(): past} if past is not None else {}))
        new = out.sequences[:real, width + done:].cpu().tolist()
        ended = [False] * real
        for k in range(real):
            if stop is not None and stop.ends[k] is not None:
                new[k], ended[k] = new[k][:stop.ends[k] - done], True
            end = next((j for j, t in enumerate(new[k]) if t in ends), None)
            if end is not None:  # its end token (the EOS, or another that ends a turn)
                new[k], ended[k] = new[k][:end + 1], True
        logps = torch.stack(sampler.logprobs, 1).cpu().tolist() if sampler.logprobs else []
        times = sampler.times
        self._timings = getattr(self, "_timings", [])
        self._timings.append(GenTiming(
            len(ids), len(ids) * (width + done - cached), sum(map(len, new)), len(times),
            times[0] - began if times else 0.0, times[-1] - times[0] if times else 0.0))
        kept = getattr(out, _cache_field()) if self.keep_cache else None
        return new, [logps[k][:len(new[k])] for k in range(real)], ended, kept


@functools.cache
def _cache_field() -> str:
    """What transformers calls generate's KV cache, as argument and output field:
    `cache` from 5.25 on (where `past_key_values` is deprecated), `past_key_values`
    before."""
    import dataclasses

    from transformers.generation.utils import GenerateDecoderOnlyOutput

    names = {f.name for f in dataclasses.fields(GenerateDecoderOnlyOutput)}
    return "cache" if "cache" in names else "past_key_values"


class _Interrupt:
    """A stopping criterion: every row stops at the token boundary after an update
    is asked for (weightUpdate interrupt)."""

    def __init__(self, gate: UpdateGate):
        self.gate = gate

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        return torch.full((input_ids.shape[0],), self.gate.requested(), dtype=torch.bool,
                          device=input_ids.device)


def make_engine(kind: str, model_spec, rollout_spec, tokenizer, model=None,
                accelerator: str = "cpu", seed: int = 0) -> RolloutEngine:
    """The `rollout.engine` named `kind`, built by its class's `create`."""
    return ENGINES.get(kind).create(model_spec, rollout_spec, tokenizer, model,
                                    accelerator, seed)
