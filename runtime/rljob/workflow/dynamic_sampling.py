"""Dynamic sampling (DAPO): a step trains only GRPO groups that carry a signal.

With `algorithm.filterGroups` a group whose rewards are all equal (every sample
right, or every one wrong: its group-relative advantages are all zero) is not
trained; a replacement prompt is drawn for it and the step waits for that
group instead, so a step always trains promptsPerStep groups.

Which groups a step trains follows from the groups' rewards alone, never from the
order they arrive in (the same in sync, periodic and async, and after a restart).
The step has promptsPerStep lanes; lane i holds the chain of groups i, i + P,
i + 2P, ... (P = promptsPerStep): group i + P is drawn only when group i was
filtered, and the lane trains the first group of its chain that was not. A chain
stops at `maxPromptsPerStep` groups drawn for the step: a lane whose last group
is filtered too trains that group (its advantages are zero, so it adds only the
KL term) and the step counts it as `groups_filled`. The replacement prompt of
group g of step s is a dataset example drawn by (seed, s, g): the same on every
trainer life, uniform over the whole dataset, never exhausted.

`StepLanes` is the pure state of one step (the trainer's StepSource feeds it the
groups it claims and puts the replacements it asks for)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def group_filtered(rewards: list[float]) -> bool:
    """A group without signal: all its rewards equal (GRPO advantages all zero)."""
    return max(rewards) == min(rewards)


def replacement_example(n_examples: int, seed: int, step: int, group: int) -> int:
    """The dataset index of the prompt of replacement group `group` of step `step`."""
    return random.Random(f"{seed}/{step}/{group}").randrange(n_examples)


@dataclass
class StepLanes:
    """Which groups of a step are trained, as groups arrive.

    `arrive(group, rewards)` records a claimed group (an index within the step,
    slot // groupSize) and returns the replacement groups to draw now;
    `chosen[i]` is lane i's trained group once known. Without filtering every
    lane trains its first group."""

    lanes: int  # promptsPerStep
    cap: int  # groups drawn for the step at most (maxPromptsPerStep)
    filtering: bool
    chosen: dict[int, int] = field(default_factory=dict)  # lane -> trained group
    order: list[int] = field(default_factory=list)  # lanes in the order they were chosen
    filtered: set[int] = field(default_factory=set)  # arrived groups without signal
    arrived: set[int] = field(default_factory=set)
    drawn: set[int] = field(default_factory=set)  # replacement groups asked for
    filled: int = 0  # lanes that train a filtered group (the cap was reached)

    def arrive(self, group: int, rewards: list[float]) -> list[int]:
        if group in self.arrived:
            return []  # a second copy (a replacement drawn again after a restart)
        self.arrived.add(group)
        if self.filtering and group_filtered(rewards):
            self.filtered.add(group)
        return self._resolve(group % self.lanes)

    def _resolve(self, lane: int) -> list[int]:
        """Walk lane's chain as far as the arrived groups go."""
        if lane in self.chosen:
            return []
        head = lane
        while head in self.arrived:
            nxt = head + self.lanes
            if head not in self.filtered:
                return self._choose(lane, head)
            if nxt >= self.cap:
                self.filled += 1
                return self._choose(lane, head)
            head = nxt
        if head == lane or head in self.drawn:
            return []  # the step's own group, or a replacement already drawn
        self.drawn.add(head)
        return [head]

    def _choose(self, lane: int, group: int) -> list[int]:
        self.chosen[lane] = group
        self.order.append(lane)
        return []

    @property
    def pending(self) -> int:
        """Lanes not yet chosen."""
        return self.lanes - len(self.chosen)

    def figures(self) -> dict:
        """The step's dynamic-sampling metrics."""
        seen = len(self.arrived)
        return {"groups_filtered": len(self.filtered),
                "filtered_share": len(self.filtered) / seen if seen else 0.0,
                "extra_prompts": len(self.drawn), "groups_filled": self.filled}
