"""The trainer's loss mask (trainer/batch.py `loss_mask`): tokens of a response that
its environment wrote (an episode's observations) never reach the policy loss, the
KL, the off-policy figures or the value loss, whatever their log-probs and values;
without a mask every response token counts, as before."""

from __future__ import annotations

import pytest
import torch

from rljob.api.spec import RLJobSpec
from rljob.trainer.algorithms import PolicyInputs, policy_loss, value_loss
from rljob.trainer.batch import make_batch

PROMPTS = [[1, 2, 3], [4, 5]]
RESPONSES = [[6, 7, 8, 9, 10], [11, 12]]
MASKS = [[1, 0, 0, 1, 1], None]  # sample 0: its 2nd and 3rd tokens are an observation


def algorithm(correction: str):
    return RLJobSpec.model_validate({
        "model": {"path": "m"}, "dataset": {"path": "d.jsonl"},
        "algorithm": {"klCoef": 0.1, "offPolicyCorrection": correction, "groupSize": 2,
                      "promptsPerStep": 1, "samplesPerMicroBatch": 2}}).algorithm


def test_the_batch_marks_the_models_tokens():
    b = make_batch(PROMPTS, RESPONSES, 0, loss_masks=MASKS)
    assert b.mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert b.loss_mask[0].tolist() == [0, 0, 1, 0, 0, 1, 1]
    assert b.loss_mask[1].tolist() == b.mask[1].tolist()  # no mask: every response token
    plain = make_batch(PROMPTS, RESPONSES, 0)
    assert plain.loss_mask is plain.mask


@pytest.mark.parametrize("correction", ["none", "tis", "mis"])
def test_observation_tokens_never_reach_the_loss_or_the_kl(correction):
    b = make_batch(PROMPTS, RESPONSES, 0, loss_masks=MASKS)
    observed = (b.mask > 0) & (b.loss_mask == 0)
    assert int(observed.sum()) == 2
    torch.manual_seed(0)
    base = torch.randn(b.mask.shape) * 0.1 - 1.0

    def run(noise: float):
        # anything at the observation positions: the policy's, the rollout's and the
        # reference's log-probs there all changed by `noise`
        logp = (base + noise * observed).requires_grad_()
        behaviour = (base - 0.05 + 3 * noise * observed).detach()
        ref = (base + 0.1 - 2 * noise * observed).detach()
        parts = policy_loss(algorithm(correction))(PolicyInputs(
            logp, logp.detach(), behaviour, ref, torch.tensor([0.5, -1.0]), b.loss_mask,
            torch.tensor([False, True])))
        parts.loss.backward()
        return parts, logp.grad

    quiet, grad = run(0.0)
    loud, _ = run(5.0)
    assert quiet.loss.item() == pytest.approx(loud.loss.item(), abs=1e-7)
    assert (quiet.kl, quiet.clip_frac) == pytest.approx((loud.kl, loud.clip_frac), abs=1e-7)
    assert quiet.stats.figures() == loud.stats.figures()
    assert torch.all(grad[observed] == 0) and torch.all(grad[b.loss_mask > 0] != 0)


def test_the_mean_over_a_response_counts_the_models_tokens_only():
    """A response's loss is the mean over the tokens the model wrote: 3 of sample 0's 5."""
    b = make_batch(PROMPTS, RESPONSES, 0, loss_masks=MASKS)
    ones = torch.zeros(b.mask.shape)
    parts = policy_loss(algorithm("none"))(PolicyInputs(
        ones.clone().requires_grad_(), ones, ones, ones, torch.tensor([1.0, 0.0]),
        b.loss_mask, torch.tensor([True, True])))
    # ratio 1, advantage 1 on sample 0: −1 per counted token, mean −1, over 2 responses
    assert parts.loss.item() == pytest.approx(-1.0 / 2)


def test_the_value_loss_leaves_observation_tokens_out():
    b = make_batch(PROMPTS, RESPONSES, 0, loss_masks=MASKS)
    observed = (b.mask > 0) & (b.loss_mask == 0)
    values = torch.zeros(b.mask.shape, requires_grad=True)
    returns = torch.ones(b.mask.shape) + 10 * observed  # far off only where not trained
    loss, _ = value_loss(values, torch.zeros(b.mask.shape), returns, b.loss_mask, 100.0, 2)
    assert float(loss.detach()) == pytest.approx(0.5)  # ½·1² per counted token, both responses
    loss.backward()
    assert torch.all(values.grad[observed] == 0)


@pytest.mark.parametrize("packing", ["packed", "shared_prompt"])
def test_a_packed_micro_batch_keeps_the_mask_and_the_log_probs(packing):
    """trainer.packing: an episode's micro-batch packed into one sequence (or with
    its group's prompt shared) gives each response token the log-prob the padded
    batch does, in the same layout as its loss mask, so the observation tokens stay
    out of the loss there too."""
    from pathlib import Path

    from rljob.api.spec import ModelSpec
    from rljob.inputs.models import build_model, load_tokenizer
    from rljob.trainer.batch import token_logprobs

    spec = ModelSpec(path="random:" + str(Path(__file__).resolve().parents[2]
                                          / "examples/models/tiny-qwen2"),
                     tokenizer="builtin:char", dtype="float32")
    tok = load_tokenizer(spec)
    model = build_model(spec, tok, seed=0, dtype=torch.float32).eval()
    prompts = [[5, 6, 7], [5, 6, 7]]  # one group: the prompt shared
    padded = make_batch(prompts, RESPONSES, tok.pad_token_id, loss_masks=MASKS)
    packed = make_batch(prompts, RESPONSES, tok.pad_token_id, packing=packing,
                        loss_masks=MASKS)
    assert packed.packed is not None and torch.equal(packed.loss_mask, padded.loss_mask)
    with torch.no_grad():
        a, b = token_logprobs(model, padded), token_logprobs(model, packed)
    on = padded.mask > 0
    torch.testing.assert_close(a[on], b[on], rtol=1e-5, atol=1e-5)
