"""reward.url in a whole `rljob run`: the reward replicas score every sample with the
scoring service, exactly once, and the trainer trains on their rewards."""

from __future__ import annotations

import os
import re
import threading

from rljob.reward import get_reward
from rljob.reward.remote import API_KEY_ENV
from rljob.reward.server import make_server

from .test_runtime import job, metrics, rljob_run

KEY = "rm-key-5f1c9a"


def test_reward_replicas_score_each_sample_once_with_the_service(tmp_path, monkeypatch):
    """The service scores with the job's own rule (arith_partial), so each step's reward
    (the service's, what the trainer trained on) equals its rule's score, which the
    rollouts computed; two replicas share the task; the API key reaches the service
    and no file of the run."""
    server = make_server(get_reward("arith_partial"), key=KEY)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/score"
    monkeypatch.setenv(API_KEY_ENV, KEY)
    try:
        run_dir = tmp_path / "run"
        rljob_run(job(tmp_path, "rm",
                      algorithm={"maxSteps": 4},
                      reward={"url": {"endpoint": endpoint}, "replicas": 2,
                              "batchSize": 16}), run_dir)
    finally:
        server.shutdown()
        server.server_close()
    rows = metrics(run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    for m in rows:
        assert m["samples"] == 128 and m["reward_failed"] == 0
        assert m["reward_mean"] == m["rule_reward_mean"] and m["reward_seconds"] > 0
    assert len({m["reward_mean"] for m in rows}) > 1  # rewards that move
    scored = []
    for i in (0, 1):
        log = (run_dir / "logs" / f"reward-{i}.log").read_text()
        scored += [int(n) for n in re.findall(r"scored (\d+) rows \(0 dropped\)", log)]
    assert len(scored) == 2 and sum(scored) == 4 * 128 and min(scored) > 0, scored
    for path in run_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 << 20:
            assert KEY.encode() not in path.read_bytes(), path
    assert os.environ[API_KEY_ENV] == KEY


def test_a_reward_model_scores_a_whole_run_weighted_with_the_rule(tmp_path):
    """reward.model in `rljob run`: the reward replica serves a classifier, and each
    step's reward is ruleWeight x the rule's mean + scoreWeight x the model's (a
    probability: the reward moves by at most scoreWeight from the rule's share)."""
    from tests import zoo

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
