"""The rewards by name: the built-in verifiers, and those an installed package adds
under the entry point group `rljob.rewards` (`reward.name: NAME`)."""

from __future__ import annotations

from collections.abc import Callable

from ..infra.registry import Registry

RewardFn = Callable[..., float]
REWARDS: Registry[RewardFn] = Registry("reward.name", None, "rljob.rewards")
register_reward = REWARDS.register
