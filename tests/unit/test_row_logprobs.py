"""`sampling.row_logprobs`: on CPU the rows go in width buckets (a row's bits follow
from the row alone); on an accelerator, where a row's bits depend on its batch
anyway, one forward at the longest row's width. Both give the same log-probs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_one_forward_at_the_longest_width_gives_the_buckets_log_probs():
    from rljob.api.spec import ModelSpec
    from rljob.inputs.models import CharTokenizer, build_model
    from rljob.sampling import PLAIN, WIDTH_BUCKET, row_logprobs
    from tests.unit.test_cli import REPO

    tok = CharTokenizer()
    model = build_model(ModelSpec(path=f"random:{REPO / 'examples/models/tiny-qwen2'}",
                                  tokenizer="builtin:char", dtype="float32"), tok, seed=3)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("1+2=", "30+41=", "7+8=")]
    # rows whose lengths fall in three different buckets
    responses = [[5] * 2, [6] * (WIDTH_BUCKET + 3), [7] * (2 * WIDTH_BUCKET + 1)]
    widths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    bucketed = row_logprobs(model, tok.pad_token_id, prompts, responses, PLAIN)
    assert len(widths) == 3  # on CPU, by default: a forward per bucket
    widths.clear()
    one = row_logprobs(model, tok.pad_token_id, prompts, responses, PLAIN, by_width=False)
    hook.remove()
    assert widths == [max(len(p) + len(r) for p, r in zip(prompts, responses))]
    for a, b, r in zip(bucketed, one, responses):
        assert len(a) == len(b) == len(r)
        assert a == pytest.approx(b, abs=1e-5)
