"""reward.model in a whole `rljob run` (reward.url's whole runs are the chaos tier's,
tests/chaos/test_faults.py)."""

from __future__ import annotations

from tests import zoo

from .test_runtime import job, metrics, rljob_run


def test_a_reward_model_scores_a_whole_run_weighted_with_the_rule(tmp_path):
    """reward.model in `rljob run`: the reward replica serves a classifier, and each
    step's reward is ruleWeight x the rule's mean + scoreWeight x the model's (a
    probability: the reward moves by at most scoreWeight from the rule's share)."""
    model_dir = zoo.reward_classifier(tmp_path / "rm")
    run_dir = tmp_path / "run"
    rljob_run(job(tmp_path, "rm-model", algorithm={"maxSteps": 3},
                  reward={"model": {"path": str(model_dir), "tokenizer": "builtin:char",
                                    "dtype": "float32"}, "combine": "weighted",
                          "ruleWeight": 0.5, "scoreWeight": 0.25, "batchSize": 32}), run_dir)
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3]
    for m in rows:
        assert m["reward_failed"] == 0 and m["reward_seconds"] > 0
        model_mean = (m["reward_mean"] - 0.5 * m["rule_reward_mean"]) / 0.25
        assert 0.0 < model_mean < 1.0, m
    log = (run_dir / "logs" / "reward-0.log").read_text()
    assert "scoring with the classifier" in log and "scored 384 rows (0 dropped)" in log, log[-2000:]
