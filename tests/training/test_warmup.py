"""The warm-up's rows: dataset.warmupPath where a job gives one, else dataset.path. Real
torch steps on a tiny random-init model; what it learned tells which file it read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rljob.api import RLJob
from rljob.infra.device import activate, resolve
from rljob.inputs.data import Example, prompt_ids
from rljob.inputs.models import load_tokenizer
from rljob.sampling import TokenDistribution
from rljob.trainer.batch import make_batch
from rljob.trainer.policy import make_policy
from rljob.trainer.warmup import target_ids, warm_up

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [f"{a}+{b}=" for a in range(3) for b in range(3)]


def _rows(path: Path, answer: str) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": answer}) + "\n"
                            for p in PROMPTS))
    return str(path)


def _spec(dataset: dict, steps: int = 40):
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "w"},
        "spec": {"model": {"path": f"random:{REPO / 'examples/models/tiny-qwen2'}",
                           "tokenizer": "builtin:char", "dtype": "float32",
                           "warmupSteps": steps, "warmupLr": 3e-3},
                 "dataset": dataset, "algorithm": {"seed": 3}}}).spec


def _mean_logprob(policy, tok, answer: str) -> float:
    """The policy's mean log-probability of `answer` (and the end token) after each prompt."""
    examples = [Example(p, answer) for p in PROMPTS]
    prompts = [prompt_ids(tok, e.prompt, None) for e in examples]
    taught = [target_ids(tok, None, e) for e in examples]
    batch = make_batch(prompts, [ids for ids, _ in taught], tok.pad_token_id)
    with torch.no_grad():
        logp = policy.logprobs(batch, TokenDistribution(vocab=len(tok)))
    return float((logp * batch.loss_mask).sum() / batch.loss_mask.sum())


def _warmed(spec):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = load_tokenizer(spec.model)
    device = resolve("cpu", 0)
    policy = make_policy(spec, tok, device, activate(device), 0, 1)
    warm_up(policy, tok, spec)
    return policy, tok


def test_the_warm_up_learns_the_rows_of_its_own_file(tmp_path):
    """dataset.path answers every prompt with 1, dataset.warmupPath with 7: the warmed
    policy says 7 far likelier than 1. Without warmupPath the same steps teach 1."""
    rl = _rows(tmp_path / "rl.jsonl", "1")
    shown = _rows(tmp_path / "shown.jsonl", "7")
    policy, tok = _warmed(_spec({"path": rl, "warmupPath": shown}))
    seven, one = _mean_logprob(policy, tok, "7"), _mean_logprob(policy, tok, "1")
    assert seven > one + 2.0, (seven, one)
    policy, tok = _warmed(_spec({"path": rl}))
    seven, one = _mean_logprob(policy, tok, "7"), _mean_logprob(policy, tok, "1")
    assert one > seven + 2.0, (seven, one)


def test_a_warm_up_file_that_breaks_names_its_field(tmp_path):
    """The warm-up reads its file as the dataset is read; a problem names
    dataset.warmupPath, not the RL's file."""
    rl = _rows(tmp_path / "rl.jsonl", "1")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1="}\n')
    spec = _spec({"path": rl, "warmupPath": str(tmp_path / "bad.jsonl")}, steps=1)
    with pytest.raises(ValueError, match=r"^dataset.warmupPath '.*bad.jsonl': rows have no "
                                         r"key 'answer'"):
        _warmed(spec)
