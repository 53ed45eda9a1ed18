"""Which samples a trainer may train: the weights' lineage and the staleness bound.

A sample carries the version of the weights that made it and the epoch (the
trainer life) that published them. A trainer restored from the checkpoint of
version c starts a new epoch; the versions ≤ c of the life that wrote the
checkpoint are its own history, the versions above c are not (that life died
after publishing them, and its later updates are lost). So a sample is trained
at step t only if its weights are in this trainer's history and
t − bound ≤ version ≤ t; anything else is made again. A sample an update
interrupted (workflow.weightUpdate interrupt) came from several versions: each
of them must pass.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lineage:
    epoch: int  # this life's
    # (epoch, last version of it in this history), oldest first
    ancestors: tuple[tuple[int, int], ...] = ()

    def descends(self, epoch: int, version: int) -> bool:
        """Whether weights (epoch, version) are in this trainer's history."""
        if epoch == self.epoch:
            return True
        return any(e == epoch and version <= last for e, last in self.ancestors)

    def accepts(self, epoch: int, version: int, step: int, bound: int) -> bool:
        """Whether a sample of weights (epoch, version) may be trained at `step`."""
        return step - bound <= version <= step and self.descends(epoch, version)

    def accepts_tokens(self, changes, step: int, bound: int) -> bool:
        """Whether a sample whose tokens came from the weights of `changes` (its
        change points: (position, version, epoch), workflow/versions.py) may be
        trained at `step`: every token's weights, not only its first's."""
        return all(self.accepts(epoch, version, step, bound) for _, version, epoch in changes)

    def at(self, version: int) -> list[list[int]]:
        """What a checkpoint of `version` records, for the life restored from it."""
        return [list(a) for a in self.ancestors] + [[self.epoch, version]]

    @classmethod
    def restored(cls, epoch: int, recorded: list[list[int]] | None) -> Lineage:
        return cls(epoch, tuple((int(e), int(v)) for e, v in recorded or ()))
