"""reward.model: the classifier the example trains, served by the reward replicas'
scorer, and `rljob validate`'s checks of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rljob.api.spec import RewardModelSpec
from rljob.reward.classifier import ClassifierScorer, fields, render
from tests import zoo

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples/quickstart-reward-model.yaml"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    """A classifier of the example's shape (tests/zoo.py)."""
    return zoo.reward_classifier(tmp_path_factory.mktemp("rm") / "classifier")


def test_the_example_s_script_trains_and_saves_a_classifier(tmp_path):
    out = tmp_path / "classifier"
    done = subprocess.run([sys.executable, str(REPO / "examples/reward-model/train_classifier.py"),
                           str(out), "--steps", "5"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    accuracy = json.loads((out / "accuracy.json").read_text())
    assert accuracy["steps"] == 5 and 0.0 <= accuracy["held_out_accuracy"] <= 1.0
    spec = RewardModelSpec(path=str(out), tokenizer="builtin:char", dtype="float32")
    assert not ClassifierScorer(spec).score(rows(("2+3=", "5")))[0].error


def rows(*pairs):
    return [{"prompt": p, "response": r, "answer": "", "source": "x"} for p, r in pairs]


def test_a_batch_scores_each_row_as_it_scores_alone(classifier):
    import torch
    from transformers import AutoModelForSequenceClassification

    from rljob.inputs.models import CharTokenizer

    spec = RewardModelSpec(path=str(classifier), tokenizer="builtin:char", dtype="float32")
    scorer = ClassifierScorer(spec)
    batch = rows(("2+3=", "5"), ("12+30=", "42"), ("49+49=", "981234"), ("1+1=", ""))
    got = scorer.score(batch)
    model = AutoModelForSequenceClassification.from_pretrained(classifier).eval()
    tok = CharTokenizer()
    for row, scored in zip(batch, got):
        ids = torch.tensor([tok.encode(row["prompt"] + row["response"])])
        with torch.inference_mode():
            alone = torch.softmax(model(input_ids=ids).logits, -1)[0, 1].item()
        assert not scored.error and 0.0 <= scored.score <= 1.0
        assert scored.score == pytest.approx(alone, abs=1e-5)
    stats = scorer.take_stats()
    assert stats.calls == 1 and len(stats.seconds) == 1  # one forward for the batch
    logit = ClassifierScorer(spec.model_copy(update={"label": 0}))
    assert logit.score(batch[:1])[0].score == pytest.approx(1 - got[0].score, abs=1e-5)


def test_a_row_the_template_cannot_fill_scores_zero_with_its_error(classifier):
    spec = RewardModelSpec(path=str(classifier), tokenizer="builtin:char", dtype="float32",
                           template="{prompt}{response} from {origin}")
    got = ClassifierScorer(spec).score(rows(("1+1=", "2")))[0]
    assert got.score == 0.0 and got.error == "reward.model: KeyError: 'origin'"
    long = RewardModelSpec(path=str(classifier), tokenizer="builtin:char", dtype="float32",
                           max_length=8, template="{source}{prompt}{response}")
    scorer = ClassifierScorer(long)
    assert len(scorer.encode(rows(("12+30=", "42"))[0])) == 8  # the last 8 tokens
    assert fields("{prompt} {row[a]} {x.y} {{z}}") == {"prompt", "row", "x"}
    assert render("{prompt}{response}", {"prompt": "a", "response": "b"}) == "ab"


def _job(tmp_path, name, **model) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    doc["spec"]["dataset"]["path"] = str(REPO / "examples/data/arith.jsonl")
    doc["spec"]["reward"]["model"].update(model)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_checks_the_reward_model_before_anything_starts(classifier, tmp_path):
    problems = {
        "no config.json": {"path": str(tmp_path / "missing")},
        "not a sequence classifier": {"path": str(REPO / "examples/models/tiny-qwen2")},
        "reward.model.label: 2, but": {"path": str(classifier), "label": 2},
        "reward.model.template: {origin} is not a field": {"path": str(classifier),
                                                           "template": "{origin}{response}"},
    }
    jobs = [_job(tmp_path, f"bad{i}", **m) for i, m in enumerate(problems.values())]
    good = _job(tmp_path, "good", path=str(classifier))
    out = subprocess.run([sys.executable, "-m", "rljob", "validate", str(good), *map(str, jobs)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stdout.strip() == f"{good}: valid", out.stdout
    lines = out.stderr.strip().splitlines()
    assert len(lines) == len(jobs), out.stderr
    for job, expected, line in zip(jobs, problems, lines):
        assert line.startswith(f"{job}: ") and expected in line, line
