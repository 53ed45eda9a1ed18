"""`rljob bench updates`' figures from a run's metrics and timeline (pure)."""

from __future__ import annotations

from types import SimpleNamespace as S

from rljob_bench.updates import _union, figures


def _m(step, t, tokens=100, interrupted=0, by_token=None):
    return {"step": step, "time": t, "tokens": tokens, "samples": 10, "gen_seconds": 1.0,
            "train_seconds": 0.5, "interrupted": interrupted, "staleness_max": 1,
            "staleness_token_mean": 0.5, "staleness_tokens": by_token or {"0": 50, "1": 50},
            "reward_mean": step / 10}


def test_union_counts_overlaps_once():
    assert _union([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    assert _union([]) == 0.0


def test_figures_measure_the_steady_state_updates_and_idle_share():
    ms = [_m(1, 10.0), _m(2, 11.0, interrupted=5), _m(3, 12.0, by_token={"1": 100}),
          _m(4, 14.0)]
    spans = [S(worker="rollout-0", kind="weight-sync", start=11.5, end=11.6, step=2),
             S(worker="rollout-0", kind="weight-sync", start=12.5, end=12.9, step=3),
             S(worker="rollout-0", kind="weight-sync", start=9.0, end=9.5, step=1),  # warm-up
             S(worker="rollout-0", kind="generate", start=10.5, end=12.0, step=2),
             S(worker="rollout-0", kind="generate", start=11.0, end=13.0, step=3),
             S(worker="trainer-0", kind="train", start=10.0, end=14.0, step=3)]
    f = figures(ms, spans, warmup=1, last=2)
    assert f["steps"] == 3 and f["tokens_per_s"] == 300 / 4.0
    assert f["updates"] == 2 and abs(f["update_latency_max"] - 0.4) < 1e-9
    assert abs(f["rollout_idle_share"] - (1 - 2.5 / 4.0)) < 1e-9  # generating 10.5-13 of 10-14
    assert f["interrupted_share"] == 5 / 30
    assert f["staleness_tokens"] == {0: 100 / 300, 1: 200 / 300}
    assert abs(f["reward_last"] - 0.35) < 1e-9
