"""Dynamic sampling's lanes (workflow/dynamic_sampling.py, pure): which groups a step
trains and which replacements it draws, whatever order the groups arrive in."""

from __future__ import annotations

import itertools

from rljob.workflow.dynamic_sampling import StepLanes, group_filtered, replacement_example

FLAT, SIGNAL = [1.0, 1.0, 1.0], [0.0, 1.0, 0.5]


def feed(lanes: StepLanes, rewards: dict[int, list[float]], order) -> list[int]:
    """Arrive groups in `order`, drawing replacements as asked; returns the draws."""
    drawn, waiting = [], list(order)
    while waiting:
        group = waiting.pop(0)
        new = lanes.arrive(group, rewards[group])
        drawn += new
        waiting += new  # a drawn group arrives later
    return drawn


def test_a_group_without_signal_is_replaced_along_its_lane():
    rewards = {0: SIGNAL, 1: FLAT, 2: SIGNAL, 3: FLAT, 4: SIGNAL, 5: SIGNAL, 7: SIGNAL}
    lanes = StepLanes(lanes=3, cap=12, filtering=True)
    drawn = feed(lanes, rewards, [0, 1, 2])
    # lane 1: group 1 flat → 4 (signal); lane 0 and 2 keep their own
    assert drawn == [4] and lanes.chosen == {0: 0, 1: 4, 2: 2} and lanes.pending == 0
    assert lanes.figures() == {"groups_filtered": 1, "filtered_share": 0.25,
                               "extra_prompts": 1, "groups_filled": 0}


def test_the_chosen_groups_do_not_depend_on_the_arrival_order():
    rewards = {g: (FLAT if g in (0, 2, 4, 6) else SIGNAL) for g in range(16)}
    results = set()
    for order in itertools.permutations(range(4)):
        lanes = StepLanes(lanes=4, cap=16, filtering=True)
        feed(lanes, rewards, order)
        results.add(tuple(sorted(lanes.chosen.items())))
    # lane 0: 0 flat, 4 flat, 8 signal; lane 2: 2 flat, 6 flat, 10 signal
    assert results == {((0, 8), (1, 1), (2, 10), (3, 3))}


def test_at_the_cap_a_lane_trains_its_last_filtered_group():
    rewards = {g: FLAT for g in range(20)}
    lanes = StepLanes(lanes=2, cap=5, filtering=True)
    drawn = feed(lanes, rewards, [0, 1])
    # lane 0: 0, 2, 4 (4 + 2 ≥ 5: stop); lane 1: 1, 3 (3 + 2 ≥ 5)
    assert sorted(drawn) == [2, 3, 4] and lanes.chosen == {0: 4, 1: 3}
    assert lanes.figures()["groups_filled"] == 2


def test_without_filtering_every_lane_trains_its_own_group_and_copies_are_ignored():
    lanes = StepLanes(lanes=2, cap=8, filtering=False)
    assert feed(lanes, {0: FLAT, 1: FLAT}, [1, 0]) == []
    assert lanes.chosen == {1: 1, 0: 0} and lanes.order == [1, 0]
    assert lanes.arrive(1, FLAT) == []  # a second copy of a group changes nothing


def test_replacements_already_in_the_table_are_not_drawn_again():
    """A restarted trainer finds the replacement an earlier life drew: it walks the
    chain through it instead of drawing another."""
    lanes = StepLanes(lanes=2, cap=8, filtering=True)
    assert lanes.arrive(2, SIGNAL) == []  # arrived before the group it replaces
    assert lanes.arrive(0, FLAT) == [] and lanes.chosen == {0: 2}


def test_the_rule_and_the_draws():
    assert group_filtered([0.0, 0.0]) and not group_filtered([0.0, 0.5])
    picks = [replacement_example(10, 0, 3, g) for g in range(200)]
    assert picks == [replacement_example(10, 0, 3, g) for g in range(200)]  # by seed
    assert set(picks) == set(range(10))  # the whole dataset
    assert picks != [replacement_example(10, 1, 3, g) for g in range(200)]
