"""DESIGN's release rule, in one place: when a step's prompts may go out, and so the
staleness a sample can have. A rollout replica's claims carry it (`last_step` of the
weights it holds: the controller hands it prompts of no later step); the driver asks it
with the weight service's versions to put each step's prompts a step ahead of their
release; the simulator (`planner/simulator.py`) asks it with the versions it models.

- sync / periodic: step t goes out to a replica once it holds weights v = t (the
  trainer published them, so it is there too), so every sample of step t is made by
  v = t (staleness 0).
- async(k): step t goes out to a replica once it holds v ≥ t − k, so a sample
  trained at step t was made by v ≥ t − k (staleness ≤ k).

Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MODES = ("sync", "periodic", "async")


@dataclass(frozen=True)
class ReleaseRule:
    mode: str
    k: int = 1  # async's bound; the on-policy modes ignore it

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.k < 0:
            raise ValueError(f"the staleness bound must be >= 0, not {self.k}")

    @classmethod
    def of(cls, spec) -> ReleaseRule:
        """The rule of a job (`spec.workflow`)."""
        w = spec.workflow
        return cls(w.mode, w.staleness_bound)

    @property
    def on_policy(self) -> bool:
        return self.mode != "async"

    @property
    def max_staleness(self) -> int:
        """The most a sample's step can exceed the version that made it."""
        return 0 if self.on_policy else self.k

    def version_needed(self, step: int) -> int:
        """The weights version that must be everywhere before `step`'s prompts go out."""
        return step - self.max_staleness

    def last_step(self, version: int) -> int:
        """The last step whose samples weights `version` may generate (a replica that
        holds them claims prompts of steps up to it)."""
        return version + self.max_staleness

    def verdict(self, step: int, version: int, ahead: int = 0) -> str:
        """What a replica that holds weights `version` does with prompts of `step` it
        claimed, its claims taking up to `ahead` steps past `last_step(version)`: "now"
        (the weights may generate them), "hold" (one of the steps ahead: kept until
        weights that may generate them come) or "back" (beyond even those: the bound
        fell after the claim, a trainer restarted from an older checkpoint)."""
        last = self.last_step(version)
        return "now" if step <= last else "hold" if step <= last + ahead else "back"

    def allows(self, step: int, trainer_version: int, replica_versions: Iterable[int]) -> bool:
        """Whether `step`'s prompts may go out (never without a live replica)."""
        versions = list(replica_versions)
        if not versions:
            return False
        need = self.version_needed(step)
        return trainer_version >= need and min(versions) >= need
