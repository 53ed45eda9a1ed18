"""Which samples a (restored) trainer trains: lineage and staleness (pure logic)."""

from __future__ import annotations

from rljob.trainer.lineage import Lineage


def test_a_fresh_trainer_trains_its_own_samples_within_the_bound():
    life = Lineage(epoch=7)
    assert life.accepts(7, 4, step=5, bound=1) and life.accepts(7, 5, step=5, bound=1)
    assert not life.accepts(7, 3, step=5, bound=1)  # too stale
    assert not life.accepts(7, 6, step=5, bound=1)  # from weights ahead of the step
    assert not life.accepts(8, 5, step=5, bound=1)  # another life's weights


def test_a_restored_trainer_keeps_the_history_up_to_its_checkpoint():
    first = Lineage(epoch=1)
    recorded = first.at(4)  # the checkpoint of version 4
    second = Lineage.restored(2, recorded)
    assert second.accepts(1, 4, step=4, bound=1)  # version 4 of the dead life: same weights
    assert not second.accepts(1, 5, step=5, bound=1)  # version 5 of the dead life: lost
    assert second.accepts(2, 5, step=5, bound=1)
    # restored again, from a checkpoint of the second life
    third = Lineage.restored(3, second.at(6))
    assert third.descends(1, 4) and third.descends(2, 6)
    assert not third.descends(1, 5) and not third.descends(2, 7)
