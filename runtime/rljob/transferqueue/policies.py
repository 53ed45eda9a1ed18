"""Claim policies: which of a task's ready rows a claim takes.

A claim policy is one class that joins the registry with `@claim_policy` (or, from an
installed package, an entry point in the group `rljob.claim_policies` naming the
class); the controller looks a claim's policy up by name (`ClaimRequest.policy`, on
the wire `ClaimRequest.policy_name`) and nothing else changes to add one:

    @claim_policy
    class Newest(ClaimPolicy):
        name = "newest"

        def pick(self, view, count, token_budget):
            ids = sorted(view.indices(), reverse=True)
            return take_rows(ids, view.rows, count, token_budget)

Contract of `pick`: return at most `count` indices of rows that `view` shows
ready, each once; with `token_budget`, stop before the rows' `length`s pass it
(but always take the first). Policies whose claims are whole groups take a
group's every member or none of it. `ranks` may then spread the picked rows over
`dp_size` data-parallel ranks (default: all on rank 0).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..infra.registry import Registry
from .samplers import balance_over_ranks


@dataclass(frozen=True)
class ReadyView:
    """What a policy sees of one task: its ready rows per candidate partition (in
    partition order, each in the order the rows became ready) and the table's rows
    (`length` is the row's token count: a prompt's predicted output length until
    a rollout writes the real one) and groups."""

    ready: Sequence[Mapping[int, None]]
    rows: Mapping[int, object]
    groups: Mapping[int, list[int]]
    group_ready: Mapping[int, int]

    def indices(self) -> Iterator[int]:
        for part in self.ready:
            yield from part

    def whole_groups(self) -> Iterator[list[int]]:
        """The groups whose every member is ready, in readiness order, once each."""
        seen: set[int] = set()
        for idx in self.indices():
            group = self.rows[idx].group
            members = self.groups[group]
            if group in seen or self.group_ready.get(group, 0) < len(members):
                continue
            seen.add(group)
            yield members

    def length(self, ids: Iterable[int]) -> int:
        return sum(self.rows[i].length for i in ids)


def take_rows(ids: Iterable[int], rows: Mapping[int, object], count: int,
              token_budget: int | None) -> list[int]:
    picked: list[int] = []
    tokens = 0
    for idx in ids:
        length = rows[idx].length
        if token_budget is not None and picked and tokens + length > token_budget:
            break
        picked.append(idx)
        tokens += length
        if len(picked) == count:
            break
    return picked


def take_groups(groups: Iterable[list[int]], view: ReadyView, count: int,
                token_budget: int | None) -> list[int]:
    """Whole groups in the order given, until the next one does not fit."""
    picked: list[int] = []
    tokens = 0
    for members in groups:
        if len(picked) + len(members) > count:
            break
        group_tokens = view.length(members)
        if token_budget is not None and picked and tokens + group_tokens > token_budget:
            break
        picked.extend(members)
        tokens += group_tokens
    return picked


class ClaimPolicy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def pick(self, view: ReadyView, count: int, token_budget: int | None) -> list[int]:
        """The rows to lease (see the module's contract)."""

    def ranks(self, lengths: Sequence[int], dp_size: int) -> list[int]:
        """The data-parallel rank of each picked row."""
        return [0] * len(lengths)


CLAIM_POLICIES: Registry[type[ClaimPolicy]] = Registry("claim policy", ClaimPolicy,
                                                       "rljob.claim_policies")
_INSTANCES: dict[type[ClaimPolicy], ClaimPolicy] = {}  # a policy holds no state: one each


def claim_policy(cls: type[ClaimPolicy]) -> type[ClaimPolicy]:
    """Register a policy class under its `name` (once)."""
    name = getattr(cls, "name", None) if isinstance(cls, type) else None
    if isinstance(cls, type) and not name:
        raise TypeError(f"{cls.__name__} has no name")
    return CLAIM_POLICIES.register(name or repr(cls))(cls)


def get_claim_policy(name: str) -> ClaimPolicy:
    if name not in CLAIM_POLICIES and ":" not in name:
        raise ValueError(f"unknown claim policy {name!r}{CLAIM_POLICIES.suggest(name)}: use one of "
                         f"{', '.join(CLAIM_POLICIES.names())}")
    cls = CLAIM_POLICIES.get(name)
    if cls not in _INSTANCES:
        _INSTANCES[cls] = cls()
    return _INSTANCES[cls]


@claim_policy
class Fifo(ClaimPolicy):
    """Rows in the order they became ready, oldest partition first."""

    name = "fifo"

    def pick(self, view, count, token_budget):
        return take_rows(view.indices(), view.rows, count, token_budget)


@claim_policy
class Group(ClaimPolicy):
    """Whole groups (GRPO's G samples of a prompt) in the order they became ready."""

    name = "group"

    def pick(self, view, count, token_budget):
        return take_groups(view.whole_groups(), view, count, token_budget)


@claim_policy
class TokenBalanced(Fifo):
    """FIFO rows spread over `dp_size` ranks with balanced token sums."""

    name = "token_balanced"

    def ranks(self, lengths, dp_size):
        return balance_over_ranks(lengths, dp_size) if dp_size > 1 else [0] * len(lengths)


@claim_policy
class LongestFirst(ClaimPolicy):
    """The longest ready rows."""

    name = "longest_first"

    def pick(self, view, count, token_budget):
        ids = sorted(view.indices(), key=lambda i: view.rows[i].length, reverse=True)
        return take_rows(ids, view.rows, count, token_budget)


@claim_policy
class ShortestFirst(ClaimPolicy):
    """The shortest ready rows."""

    name = "shortest_first"

    def pick(self, view, count, token_budget):
        ids = sorted(view.indices(), key=lambda i: view.rows[i].length)
        return take_rows(ids, view.rows, count, token_budget)


@claim_policy
class GroupLongestFirst(ClaimPolicy):
    """Whole groups of the oldest partition (step) first and, within it, the longest
    (predicted output length) first: skew-aware dispatch's long-tail replicas
    (StreamRL Algorithm 2), and with one replica the longest processing time first
    order that lets a batch of long groups run together. A newer step's groups wait
    for the older step's (the trainer takes the steps in order)."""

    name = "group_longest_first"

    def pick(self, view, count, token_budget):
        groups = sorted(view.whole_groups(),
                        key=lambda g: (view.rows[g[0]].partition, -view.length(g)))
        return take_groups(groups, view, count, token_budget)


@claim_policy
class GroupShortestFirst(ClaimPolicy):
    """Whole groups of the oldest partition first, the shortest first within it: the
    regular replicas of skew-aware dispatch."""

    name = "group_shortest_first"

    def pick(self, view, count, token_budget):
        groups = sorted(view.whole_groups(),
                        key=lambda g: (view.rows[g[0]].partition, view.length(g)))
        return take_groups(groups, view, count, token_budget)
