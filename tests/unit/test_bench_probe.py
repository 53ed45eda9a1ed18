"""The benchmark's balance rule: lines through the probe's times, and the step size
whose predicted generation and training times are closest."""

from __future__ import annotations

import pytest

from rljob_bench.probe import (Probe, choose_prompts, gen_fixed, line, predict,
                               predicted_speedups)


def probe(gen, train, prompts=(4, 16)):
    return Probe(prompts, gen, train, 1, 1, 0.0)


def test_line_through_two_points_and_least_squares_through_more():
    assert line((4, 16), (0.11, 0.27)) == pytest.approx((0.0567, 0.01333), rel=1e-3)
    fixed, per = line((1, 2, 3), (1.0, 2.1, 2.9))
    assert per == pytest.approx(0.95) and fixed == pytest.approx(0.1, abs=1e-9)
    assert line((4, 16), (0.5, 0.3)) == (pytest.approx(0.4), 0.0)  # never a negative slope
    assert line((8, 8), (0.2, 0.4)) == (pytest.approx(0.3), 0.0)  # one size: a constant


def test_predicted_times_follow_the_lines():
    p = probe((0.11, 0.27), (0.2, 0.8))
    gen, train = predict(p, 8)
    assert gen == pytest.approx(0.11 + 4 * 0.16 / 12) and train == pytest.approx(0.4)


def test_the_step_size_where_both_overlapping_modes_gain_most_is_chosen():
    # generation with a large fixed part a batch, training in proportion (this kind of
    # machine): async gains most at small steps (Tgen near Ttrain), periodic's four
    # batches each pay the fixed part, so it gains little below 8 prompts
    p = probe((0.11, 0.27), (0.2, 0.8))
    four = lambda prompts: 4  # noqa: E731 - periodic cuts a step in four
    small, large = predicted_speedups(p, 4, 4), predicted_speedups(p, 16, 4)
    assert small["async"] > large["async"] and small["periodic"] < 1 < large["periodic"]
    assert gen_fixed(p) == pytest.approx(0.0567, rel=1e-3)
    assert choose_prompts(p, four) == 16  # 8 and 16 within 1 %: the larger step
    assert choose_prompts(p, four, candidates=(4, 8)) == 8
    # both sides in proportion, no fixed part: every size gains the same: the largest
    assert choose_prompts(probe((0.1, 0.4), (0.2, 0.8)), four) == 16
    # one batch a step: periodic cannot overlap anything (bound 1) at any size
    assert predicted_speedups(p, 16, 1)["periodic"] == 1.0
