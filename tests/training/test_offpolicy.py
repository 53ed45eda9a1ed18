"""Async training at the sampling settings recipes use: the trainer scores a token
under the distribution the rollout sampled it from (temperature and top-p), so the
clip and the importance weights of an async run at T=0.8 / top-p 0.9 look as they
do at T=1. Real processes, the hf engine; the vLLM tier runs the same check on vLLM."""

from __future__ import annotations

import statistics

from tests.training.test_runtime import job, metrics, rljob_run


def off_policy_figures(ms: list[dict]) -> dict:
    """Means over the steps after the first two (the first update is the largest)."""
    later = ms[2:]
    mean = lambda key: statistics.fmean(m[key] for m in later)  # noqa: E731
    return {"clip": mean("clip"), "is_weight_mean": mean("is_weight_mean"),
            "is_capped": mean("is_capped"), "is_ess": mean("is_ess"),
            "staleness": mean("staleness_mean")}


def test_async_clip_and_importance_weights_do_not_depend_on_temperature_and_top_p(tmp_path):
    figures = {}
    for name, temperature, top_p in (("t1", 1.0, 1.0), ("t08", 0.8, 0.9)):
        # offPolicyCorrection none: PPO's ratio is taken against the rollout's log-probs,
        # so a log-prob of another distribution shows in the clip
        path = job(tmp_path, name, workflow={"mode": "async", "maxStaleness": 1},
                   rollout={"temperature": temperature, "topP": top_p},
                   algorithm={"offPolicyCorrection": "none"})
        rljob_run(path, tmp_path / name, "--max-steps", "10")
        figures[name] = off_policy_figures(metrics(tmp_path / name))
    print(figures)
    for f in figures.values():
        assert f["staleness"] > 0.5  # async: most samples come from the previous version
        # scoring at T=1 what was sampled at T=0.8 / top-p 0.9 clipped 0.45-0.70 a step
        assert f["clip"] < 0.25
        assert 0.9 < f["is_weight_mean"] < 1.1 and f["is_capped"] < 0.05
        assert f["is_ess"] > 0.8
    assert abs(figures["t1"]["clip"] - figures["t08"]["clip"]) < 0.15
    assert abs(figures["t1"]["is_weight_mean"] - figures["t08"]["is_weight_mean"]) < 0.05
