"""The sampling distribution, defined once for the rollout engines and the trainer.

A token's log-prob means the log-prob of the distribution it was sampled from:
the logits divided by `rollout.temperature`, then cut to the nucleus of
`rollout.topP` and renormalised over it (what vLLM returns with
`logprobs_mode="processed_logprobs"`). The hf engine samples from it
(`seeded_sample`) and reports it, the vLLM engine asks vLLM for it, and the
trainer recomputes it (`sampled_logprobs`), so the ratio of a trainer log-prob
to a rollout log-prob compares one distribution under two sets of weights, never
two distributions.

The nucleus: sorted by probability, a token is kept while the tokens less likely
than it (itself included) hold more than 1 − topP of the mass (vLLM's rule, the
most likely token always kept). The trainer finds the nucleus on its own logits
and always keeps the token that was sampled: where its weights put that token
just outside (a rounding difference at the edge), the token still has a finite
log-prob. Gradients flow through the renormalisation, not through the choice of
the nucleus. With topP 1 nothing is cut and this is the tempered softmax.

An embedding padded past the tokenizer (Qwen2.5: 152,064 rows for 151,665
tokens) has logits for ids no text has: the distribution is over the
tokenizer's `vocab` ids only, so no engine samples a padded id and every side
normalises over the same tokens."""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenDistribution:
    """Temperature and top-p of the distribution tokens are sampled from."""

    temperature: float = 1.0
    top_p: float = 1.0
    vocab: int = 0  # the tokenizer's ids: logits past them are not tokens (0: all are)

    @classmethod
    def of(cls, rollout_spec, vocab: int = 0) -> TokenDistribution:
        """A job's (its `rollout` section's) sampling distribution over `vocab` ids."""
        return cls(float(rollout_spec.temperature), float(rollout_spec.top_p), vocab)

    @property
    def truncated(self) -> bool:
        return self.top_p < 1.0


PLAIN = TokenDistribution()  # the model's own softmax (supervised warm-up, T = 1)


def nucleus(scaled, top_p: float):
    """Boolean mask [..., V] of the tokens inside the top-p nucleus of the
    tempered logits `scaled` (vLLM's rule: ascending sort, cut where the
    cumulative mass is at most 1 − top_p, the most likely token kept)."""
    import torch

    flat = scaled.detach().reshape(-1, scaled.shape[-1]).float()
    sorted_logits, order = flat.sort(dim=-1, descending=False)
    cut = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    cut[:, -1] = False
    keep = torch.ones_like(cut).scatter_(-1, order, ~cut)
    return keep.reshape(scaled.shape)


def tempered(logits, dist: TokenDistribution, keep_tokens=None):
    """Logits of the sampling distribution (float32): divided by the temperature,
    -inf outside the nucleus; `keep_tokens` [...] (the sampled ones) stay inside."""
    import torch

    z = logits.float()
    if dist.vocab and z.shape[-1] > dist.vocab:  # rows past the tokenizer
        z = z[..., :dist.vocab]
    if dist.temperature != 1.0:
        z = z / dist.temperature
    if dist.truncated:
        keep = nucleus(z, dist.top_p)
        if keep_tokens is not None:
            keep = keep.scatter(-1, keep_tokens.unsqueeze(-1), True)
        z = z.masked_fill(~keep, float("-inf"))
    return z


def sampled_logprobs(logits, tokens, dist: TokenDistribution = PLAIN):
    """log p(token) under the sampling distribution: logits [..., V], tokens [...]."""
    z = tempered(logits, dist, keep_tokens=tokens)
    return z.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def seeded_sample(logits, uniforms, dist: TokenDistribution):
    """Sample one token per row by inverse CDF from the sampling distribution: row i
    takes the first token whose cumulative probability exceeds uniforms[i], so a
    row's draw depends on its own uniform only, not on the other rows of the batch."""
    import torch

    probs = tempered(logits, dist).softmax(dim=-1)
    cdf = probs.cumsum(-1)
    target = uniforms.to(cdf.device, cdf.dtype).unsqueeze(-1) * cdf[..., -1:]
    return torch.searchsorted(cdf, target).clamp_(max=probs.shape[-1] - 1).squeeze(-1)


WIDTH_BUCKET = 16  # tokens: `row_logprobs` pads a row to a multiple of this


def right_padded(lengths, tokens, width: int, pad_id: int):
    """Rows of `lengths` tokens each (`tokens`: theirs, one row after the other) in a
    [rows, width] int64 array, right-padded, and the mask of their real tokens (numpy,
    one pass: no step per row)."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    real = np.arange(width)[None, :] < lengths[:, None]
    ids = np.full(real.shape, pad_id, np.int64)
    ids[real] = np.fromiter(tokens, np.int64, int(lengths.sum()))
    return ids, real


def row_logprobs(model, pad_id: int, prompts: list[list[int]], responses: list[list[int]],
                 dist: TokenDistribution, by_width: bool | None = None) -> list[list[float]]:
    """Each response token's log-prob under `dist` from forwards of a transformers
    causal LM over the prompt+response rows, right-padded. A row's bits do not
    depend on the rows beside it, so two processes computing one row with the
    same weights get the same bits whatever else each batched with it (the
    rollout engine's log-probs, and the reference's that either side computes:
    a streamed step must carry the bits a whole-step batch carries). Causal
    attention keeps every real token off the pads, and the number of rows does
    not change a row's bits, but the padded width does (the attention kernel
    blocks by it): the rows go in buckets by their own length (`WIDTH_BUCKET`
    tokens), each bucket one forward at its width.

    That holds on CPU (`by_width` None: the buckets there). On an accelerator a
    row's bits depend on its batch anyway (the kernels are chosen by the batch's
    shape), so the buckets buy nothing and cost a forward each, and the rows go in
    one forward at the longest row's width (on one H200, the reference's log-probs
    of 128 rows of up to 128 new tokens in chunks of 16 took 1.64 s a step in
    buckets, next to 0.92 s for the step's training)."""
    import torch

    device = next(model.parameters()).device
    if by_width is None:
        by_width = device.type == "cpu"
    rows = [p + r for p, r in zip(prompts, responses)]
    buckets: dict[int, list[int]] = {}
    longest = max((len(r) for r in rows), default=0)
    for k, r in enumerate(rows):
        width = -(-len(r) // WIDTH_BUCKET) * WIDTH_BUCKET if by_width else longest
        buckets.setdefault(width, []).append(k)
    out: list[list[float]] = [[] for _ in rows]
    for width, members in sorted(buckets.items()):
        ids, _ = right_padded([len(rows[k]) for k in members],
                              itertools.chain.from_iterable(rows[k] for k in members),
                              width, pad_id)
        ids = torch.from_numpy(ids)
        with torch.no_grad():
            logits = model(input_ids=ids.to(device)).logits[:, :-1]
            logp = sampled_logprobs(logits, ids[:, 1:].to(device), dist).float().cpu().numpy()
        for j, k in enumerate(members):  # from the prompt's last token (numpy: a row's
            # slice and list cost a fifth of a tensor's)
            first = len(prompts[k]) - 1
            out[k] = logp[j, first:first + len(responses[k])].tolist()
    return out
