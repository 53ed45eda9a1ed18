"""PPO's pieces against hand and direct computations: GAE, the token-level
surrogate, the clipped value loss, and the spec's PPO defaults and rules."""

from __future__ import annotations

import pytest
import torch

from rljob.api.spec import AlgorithmSpec
from rljob.trainer.algorithms import PolicyInputs, gae, outcome_rewards, policy_loss, value_loss
from rljob.workflow.tasks import reference_in_trainer, reference_task, tasks_for, train_reads


def test_gae_equals_a_hand_computed_example():
    # δ2 = 1 − 0.4 = 0.6; δ1 = 0.9·0.4 − 0.2 = 0.16; δ0 = 0.9·0.2 − 0.5 = −0.32
    # A2 = 0.6; A1 = 0.16 + 0.72·0.6 = 0.592; A0 = −0.32 + 0.72·0.592 = 0.10624
    adv, ret = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.2, 0.4]), 0.9, 0.8)
    assert torch.allclose(adv, torch.tensor([0.10624, 0.592, 0.6]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([0.60624, 0.792, 1.0]), atol=1e-6)


def test_gae_with_gamma_and_lambda_one_is_the_return_minus_the_value():
    values = torch.tensor([0.3, -0.1, 0.7, 0.2])
    adv, ret = gae(outcome_rewards(2.0, 4), values, 1.0, 1.0)
    assert torch.allclose(ret, torch.full((4,), 2.0))
    assert torch.allclose(adv, 2.0 - values)
    # λ = 0: one-step TD errors
    adv0, _ = gae(outcome_rewards(2.0, 4), values, 1.0, 0.0)
    assert torch.allclose(adv0, torch.tensor([-0.1 - 0.3, 0.7 + 0.1, 0.2 - 0.7, 2.0 - 0.2]))


def grpo_loss(logp, old, ref, adv, mask, eps, beta, responses_in_step, correction="none",
              cap=None, behaviour=None):
    """The job's policy loss (`algorithm.offPolicyCorrection`) of stale samples whose
    rollout log-probs are `behaviour` (none: also PPO's old policy) and whose
    proximal log-probs are `old`."""
    algo = AlgorithmSpec.model_validate({
        "name": "ppo", "clipRatio": eps, "klCoef": beta, "promptsPerStep": responses_in_step,
        "samplesPerMicroBatch": 1, "offPolicyCorrection": correction, "importanceCap": cap})
    stale = torch.zeros(logp.shape[0], dtype=torch.bool)
    return policy_loss(algo)(PolicyInputs(logp, old, old if behaviour is None else behaviour,
                                          ref, adv, mask, stale))


def _direct_surrogate(logp, old, ref, adv, mask, eps, beta, n, weight=None):
    total = 0.0
    for i in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                ratio = torch.exp(logp[i, t] - old[i, t])
                a = adv[i, t]
                s = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
                if weight is not None:
                    s = weight(i, t) * s
                d = ref[i, t] - logp[i, t]
                terms.append(s + beta * (torch.exp(d) - d - 1))
        total = total + torch.stack(terms).mean()
    return total / n


def test_the_token_level_surrogate_and_its_gradient_equal_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=g).requires_grad_()
    old = (logp.detach() + 0.3 * torch.randn(3, 5, generator=g))
    ref = logp.detach() + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    parts = grpo_loss(logp, old, ref, adv, mask, 0.2, 0.05, responses_in_step=6)
    (grad,) = torch.autograd.grad(parts.loss, logp)
    direct = _direct_surrogate(logp, old, ref, adv, mask, 0.2, 0.05, 6)
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(parts.loss, direct, atol=1e-6)
    assert torch.allclose(grad, direct_grad, atol=1e-6)
    # one advantage per response is the same as that advantage on each of its tokens
    per_response = torch.tensor([0.5, -1.0, 2.0])
    a = grpo_loss(logp, old, ref, per_response, mask, 0.2, 0.05, 6).loss
    b = grpo_loss(logp, old, ref, per_response[:, None].expand(3, 5), mask, 0.2, 0.05, 6).loss
    assert torch.equal(a, b)


@pytest.mark.parametrize("correction", ["tis", "mis"])
def test_decoupled_ppo_clips_against_the_proximal_policy_and_weights_by_the_behaviours(
        correction):
    """tis/mis: r = π/π_prox clipped, each token times w = π_prox/μ, truncated at the
    cap (tis) or left out above it (mis); the figures count the capped tokens."""
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 5, generator=g).requires_grad_()
    prox = logp.detach() + 0.3 * torch.randn(3, 5, generator=g)
    behaviour = prox + torch.randn(3, 5, generator=g)  # some weights far above the cap
    ref = logp.detach() + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    cap = 1.5
    w = torch.exp(prox - behaviour)
    assert ((w > cap) & mask.bool()).any() and ((w <= cap) & mask.bool()).any()
    capped = ((lambda i, t: torch.clamp(w[i, t], max=cap)) if correction == "tis"
              else (lambda i, t: w[i, t] * (w[i, t] <= cap)))
    parts = grpo_loss(logp, prox, ref, adv, mask, 0.2, 0.05, 6, correction, cap, behaviour)
    direct = _direct_surrogate(logp, prox, ref, adv, mask, 0.2, 0.05, 6, weight=capped)
    (grad,) = torch.autograd.grad(parts.loss, logp)
    (direct_grad,) = torch.autograd.grad(direct, logp)
    assert torch.allclose(parts.loss, direct, atol=1e-6)
    assert torch.allclose(grad, direct_grad, atol=1e-6)
    figures = parts.stats.figures()
    on = mask.bool()
    assert figures["is_capped"] == pytest.approx(float((w[on] > cap).float().mean()))
    assert figures["is_weight_max"] == pytest.approx(float(w[on].max()))
    assert figures["is_ess"] == pytest.approx(float(w[on].sum() ** 2 / (on.sum() * (w[on] ** 2).sum())))
    assert figures["logp_mismatch_mean"] is None  # no fresh sample: nothing to compare


def test_the_engine_mismatch_is_measured_on_fresh_samples_only():
    from rljob.trainer.algorithms import off_policy_stats

    prox = torch.zeros(2, 3)
    behaviour = torch.tensor([[0.1, -0.2, 9.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    x = PolicyInputs(prox, prox, behaviour, prox, torch.zeros(2), mask,
                     torch.tensor([True, False]))
    _, stats = off_policy_stats(x, 2.0)
    figures = stats.figures()
    assert figures["logp_mismatch_mean"] == pytest.approx(0.15)  # row 0's two tokens
    assert figures["logp_mismatch_max"] == pytest.approx(0.2)
    assert stats.tokens == 5


def test_a_mismatch_far_out_of_line_says_so_in_one_line():
    from rljob.trainer.report import mismatch_alert

    assert mismatch_alert(None) is None and mismatch_alert(2e-6) is None
    line = mismatch_alert(0.8)
    assert "\n" not in line and "0.8 nats" in line and "tokenizer" in line
    assert mismatch_alert(float("nan")) is not None


def test_off_policy_correction_rules():
    assert AlgorithmSpec().off_policy_correction == "none" and AlgorithmSpec().cap == 2.0
    with pytest.raises(ValueError, match="importanceCap caps the importance weights"):
        AlgorithmSpec.model_validate({"offPolicyCorrection": "none", "importanceCap": 3})
    assert AlgorithmSpec.model_validate({"offPolicyCorrection": "mis", "importanceCap": 3}).cap == 3
    with pytest.raises(ValueError):
        AlgorithmSpec.model_validate({"importanceCap": 1.0})  # a cap must be above 1
    with pytest.raises(ValueError):
        AlgorithmSpec.model_validate({"offPolicyCorrection": "ppo"})


def test_the_clipped_value_loss_equals_a_direct_computation_and_splits_exactly():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(4, 6, generator=g).requires_grad_()
    old = values.detach() + 0.5 * torch.randn(4, 6, generator=g)
    returns = torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    mask[:, 0] = 1
    loss, frac = value_loss(values, old, returns, mask, 0.2, responses_in_step=4)
    direct = 0.0
    for i in range(4):
        terms = []
        for t in range(6):
            if mask[i, t]:
                v = values[i, t]
                clipped = old[i, t] + torch.clamp(v - old[i, t], -0.2, 0.2)
                terms.append(0.5 * torch.maximum((v - returns[i, t]) ** 2,
                                                 (clipped - returns[i, t]) ** 2))
        direct = direct + torch.stack(terms).mean()
    direct = direct / 4
    assert torch.allclose(loss, direct, atol=1e-6)
    (g1,) = torch.autograd.grad(loss, values)
    (g2,) = torch.autograd.grad(direct, values)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert 0.0 < frac < 1.0  # some tokens clipped, some not, with these draws
    halves = sum(value_loss(values[k:k + 2], old[k:k + 2], returns[k:k + 2], mask[k:k + 2],
                            0.2, 4)[0] for k in (0, 2))
    assert torch.allclose(halves, loss, atol=1e-6)


def test_ppo_defaults_to_one_response_per_prompt_and_adds_the_critic_task():
    ppo, grpo = AlgorithmSpec(name="ppo"), AlgorithmSpec()
    assert (ppo.group_size, grpo.group_size) == (1, 8)
    assert AlgorithmSpec.model_validate({"name": "ppo", "groupSize": 4, "lambda": 0.9}).lam == 0.9

    class Spec:  # what tasks_for and train_reads look at
        def __init__(self, algorithm, engine="torch", mode="async", accelerator="cpu"):
            self.algorithm = algorithm
            self.rollout = type("R", (), {"dispatch": "fifo", "episodic": False,
                                          "engine": "hf", "replicas": 1,
                                          "max_replicas": None, "max_num_seqs": 256})()
            self.trainer = type("T", (), {"engine": engine})()
            self.workflow = type("W", (), {"update_policy": "drain", "mode": mode})()
            self.reward = type("Rw", (), {"streamed": False})()
            self.accelerator_for = lambda role: type("A", (), {"type": accelerator})()

    names = {t.name: t for t in tasks_for(Spec(ppo))}
    assert "critic" in names and "advantages" in names["train"].consumes
    assert "critic" not in {t.name for t in tasks_for(Spec(grpo))}
    assert "advantages" in train_reads(Spec(ppo)) and "advantages" not in train_reads(Spec(grpo))
    # a KL term (klCoef 0.001 by default) to a torch trainer's reference: the reference's
    # log-probs are a task the trainer waits for; megatron's and klCoef 0 have none
    for algo in (ppo, grpo):
        names = {t.name: t for t in tasks_for(Spec(algo))}
        assert "ref_logp" in names["train"].consumes and "ref_logp" in train_reads(Spec(algo))
        assert names["reference"].consumes == {"response_ids"}
    # ...only where rollout replicas take it too (hf on CPU, in sync or async): in
    # periodic, or on an accelerator, the trainer computes its samples' own
    for spec in (Spec(grpo, mode="periodic"), Spec(grpo, accelerator="gpu")):
        names = {t.name: t for t in tasks_for(spec)}
        assert "reference" not in names and "ref_logp" not in train_reads(spec)
        assert reference_in_trainer(spec) and not reference_task(spec)
    assert reference_task(Spec(grpo, mode="sync"))  # micro-batches of 8: replicas share
    no_kl = AlgorithmSpec(kl_coef=0.0)
    for spec in (Spec(grpo, "megatron"), Spec(no_kl)):
        assert not reference_in_trainer(spec)
        names = {t.name: t for t in tasks_for(spec)}
        assert "reference" not in names and "ref_logp" not in names["train"].consumes
        assert "ref_logp" not in train_reads(spec)
    with pytest.raises(ValueError, match="groupSize"):
        AlgorithmSpec(name="grpo", group_size=1)


def _value_model(seed: int = 0):
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    from rljob.trainer.critic import ValueModel
    from tests.cases import REPO

    cfg = json.loads((REPO / "examples/models/tiny-qwen2/config.json").read_text())
    torch.manual_seed(seed)
    lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    model = ValueModel(lm)
    torch.nn.init.normal_(model.head.weight, std=0.5)  # values away from zero
    return model


def _scored(model, n: int = 8):
    """Samples as the critic scores them: its own values now, returns of 1."""
    from rljob.trainer.batch import make_batch
    from rljob.trainer.critic import response_values

    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(n):
        prompt = torch.randint(3, 20, (4,), generator=gen).tolist()
        response = torch.randint(3, 20, (3,), generator=gen).tolist()
        mb = make_batch([prompt], [response], 0)
        with torch.no_grad():
            v = response_values(model, mb)[0, mb.mask[0].nonzero().squeeze(1)]
        samples.append({"prompt": prompt, "response": response, "values": v,
                        "returns": torch.ones_like(v)})
    return samples


def test_the_critic_steps_per_micro_batch_so_value_clip_bounds_the_later_ones():
    from rljob.trainer.critic import fit_values

    results = {}
    for clip in (1e-4, 1e9):
        model = _value_model()
        samples = _scored(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        loss, clipped = fit_values(model, opt, samples, 4, 0, "cpu", clip, 0.0)
        results[clip] = (clipped, model.head.weight.detach().clone())
    # the first micro-batch's values are the scored ones (nothing clipped); the second's
    # moved with the first step, and a tight clip holds them back
    assert 0.0 < results[1e-4][0] <= 0.5 and results[1e9][0] == 0.0
    assert not torch.equal(results[1e-4][1], results[1e9][1])


def test_a_resumed_critic_never_restores_past_the_actors_step(tmp_path):
    from rljob.infra.rundir import RunDir
    from rljob.trainer.critic import checkpoint_to_restore, checkpoints_to_drop

    run = RunDir(tmp_path)
    run.critic_checkpoints.mkdir(parents=True)
    for v in (48, 49, 50, 51, 52, 53):
        run.critic_checkpoint(v).write_bytes(b"")
    files = run.critic_checkpoint_files()
    assert checkpoint_to_restore(files, 50).name == "step-50.pt"
    assert checkpoint_to_restore(files, 100).name == "step-53.pt"
    assert checkpoint_to_restore(files, 10) is None
    # saved 53 with the actor's newest checkpoint at 50: back to 50 stays
    assert [f.name for f in checkpoints_to_drop(files, 53, [0, 50])] == ["step-48.pt",
                                                                         "step-49.pt"]
    # a fresh run's version 49 drops what an earlier life left beyond it
    assert [f.name for f in checkpoints_to_drop(files, 49, [50, 100])] == [
        "step-50.pt", "step-51.pt", "step-52.pt", "step-53.pt"]


def _job(mode: str, replicas: int = 1, micro: int = 64, max_num_seqs: int = 256,
         max_replicas: int | None = 1):
    from rljob.api import RLJob

    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"},
        "spec": {"model": {"path": "random:/m", "tokenizer": "builtin:char"},
                 "dataset": {"path": "/d.jsonl"},
                 "algorithm": {"groupSize": 8, "promptsPerStep": 8,
                               "samplesPerMicroBatch": micro},
                 "workflow": {"mode": mode},
                 "rollout": {"replicas": replicas, "maxReplicas": max_replicas, "engine": "hf",
                             "maxNumSeqs": max_num_seqs},
                 "accelerator": {"type": "cpu"}}}).spec


def test_the_reference_is_a_task_only_where_a_parked_replica_can_take_a_share():
    # sync, one replica (maxReplicas 1) generating its step's 64 rows in one batch, and
    # the trainer's reference claim taking 64 rows (a micro-batch): that claim takes the
    # write whole, so the trainer computes its own samples' log-probs (no task, no
    # second claim)
    assert not reference_task(_job("sync"))
    assert "reference" not in {t.name for t in tasks_for(_job("sync"))}
    assert reference_in_trainer(_job("sync"))
    # a replica can take a share: a second replica, smaller reference claims, a step
    # generated in several batches (the trainer computes one while the next comes), or
    # a second replica that a scale may bring (maxReplicas unset: every worker, a later
    # replica's too, registers the same tasks)
    for spec in (_job("sync", replicas=2, max_replicas=2), _job("sync", micro=16),
                 _job("sync", max_num_seqs=32), _job("async"), _job("sync", max_replicas=None)):
        assert reference_task(spec) and "ref_logp" in train_reads(spec)


def test_every_example_job_keeps_its_reference_path():
    """docs/benchmarks/overhead.md: the single-replica sync rule changes no example job's path
    (each is a task exactly where it was before the rule)."""
    from pathlib import Path

    from rljob.api.validation import load_rljob
    from rljob.workflow.tasks import _replicas_share_reference

    files = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
    assert files
    for f in files:
        assert _replicas_share_reference(load_rljob(str(f)).spec), f.name
