"""`rljob bench offpolicy`'s pure parts: the runs it makes of a job and the figures
it prints of each."""

from __future__ import annotations

import pytest

from rljob.api.validation import load_rljob
from rljob_bench.offpolicy import configurations, summarise, variant
from tests.unit.test_cli import REPO


def test_the_runs_are_sync_then_each_staleness_under_each_correction():
    assert configurations() == [("sync", None, "none"), ("async", 1, "none"), ("async", 1, "tis"),
                                ("async", 1, "mis"), ("async", 2, "none"), ("async", 2, "tis"),
                                ("async", 2, "mis")]


def test_a_variant_changes_what_it_names_and_nothing_else():
    job = load_rljob(str(REPO / "examples/quickstart.yaml"))
    v = variant(job, "async", 2, "mis", 50, 7, 0.8, 0.9)
    assert (v.spec.workflow.mode, v.spec.workflow.max_staleness) == ("async", 2)
    assert (v.spec.algorithm.off_policy_correction, v.spec.algorithm.max_steps,
            v.spec.algorithm.seed) == ("mis", 50, 7)
    assert (v.spec.rollout.temperature, v.spec.rollout.top_p) == (0.8, 0.9)
    assert v.spec.algorithm.lr == job.spec.algorithm.lr and v.spec.model == job.spec.model
    sync = variant(job, "sync", None, "none", None, 0, None, None)
    assert sync.spec.workflow.mode == "sync" and sync.spec.workflow.max_staleness is None
    assert sync.spec.rollout.temperature == job.spec.rollout.temperature


def test_a_runs_figures():
    ms = [{"reward_mean": r, "clip": 0.1, "is_weight_mean": 1.0, "is_weight_max": w,
           "is_capped": 0.0, "is_ess": 1.0, "logp_mismatch_mean": None}
          for r, w in ((0.1, 3.0), (0.2, 1.5), (0.4, 1.2))]
    out = summarise(ms, last=2)
    assert out["reward_last"] == pytest.approx(0.3) and out["is_weight_max"] == 3.0
    assert out["logp_mismatch_mean"] is None and out["steps"] == 3

