"""A micro-batch's tensors (`trainer/batch.py`), built for the whole batch at once,
are those of their definition row by row: each row its prompt then its response,
right-padded; the mask on the positions that predict a response token; per-token
values in response order on those positions, a missing row's left at `fill`."""

from __future__ import annotations

import random

import pytest
import torch

from rljob.trainer.batch import make_batch, per_token


def _rows(seed: int):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    prompts = [[rng.randint(0, 50) for _ in range(rng.randint(1, 6))] for _ in range(n)]
    responses = [[rng.randint(0, 50) for _ in range(rng.randint(0, 6))] for _ in range(n)]
    return rng, prompts, responses


@pytest.mark.parametrize("seed", range(40))
def test_a_batch_is_its_rows_padded_and_masked_one_by_one(seed):
    rng, prompts, responses = _rows(seed)
    batch = make_batch(prompts, responses, pad_id=7)
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    assert batch.input_ids.dtype == torch.long and batch.mask.dtype == torch.float32
    for i, (p, r) in enumerate(zip(prompts, responses)):
        n = len(p) + len(r)
        assert batch.input_ids[i].tolist() == p + r + [7] * (width - n)
        assert batch.attention_mask[i].tolist() == [1] * n + [0] * (width - n)
        assert batch.mask[i].tolist() == [float(len(p) - 1 <= k < n - 1)
                                          for k in range(width - 1)]
    # one value per response token (a row may carry more: the first ones go)
    rows = [None if rng.random() < 0.2 else
            [rng.random() for _ in range(len(r) + rng.randint(0, 2))] for r in responses]
    fill = torch.rand(batch.mask.shape) if seed % 2 else None
    for dtype in (torch.float32, torch.bfloat16):
        base = (fill if fill is not None else torch.zeros(batch.mask.shape)).to(dtype)
        got = per_token(batch.mask, rows, base)
        want = base.clone()
        for i, (p, row) in enumerate(zip(prompts, rows)):
            for j in range(len(responses[i]) if row is not None else 0):
                want[i, len(p) - 1 + j] = torch.tensor(row[j], dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, want)
    short = [[0.5] for _ in responses]  # fewer values than tokens: the rest stay fill
    got = per_token(batch.mask, short)
    assert torch.equal(got.sum(1), torch.tensor([0.5 if r else 0.0 for r in responses]))
