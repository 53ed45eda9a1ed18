"""Rank 0's samples of a step: `StepSource` claims the step's rows from
TransferQueue while the trainer computes and hands them out micro-batch by
micro-batch (`Sample` each); `data_parallel_shard` is a rank's share of a
micro-batch and `prompts_digest` what a step trained on, as one hash."""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from ..api.spec import RLJobSpec
from ..transferqueue import Batch, TransferQueueClient
from ..transferqueue.dataplane import TransferQueueError
from ..transferqueue.consumer import ride_out, warn
from ..transferqueue.samplers import balance_over_ranks
from ..workflow.dynamic_sampling import StepLanes
from ..workflow.tasks import train_reads
from .algorithms import advantage_estimator
from .lineage import Lineage

log = logging.getLogger("rljob.trainer")
# seconds the idle work's claim waits at most: arrivals of either kind end it sooner,
# a stop is seen after it
IDLE_WAIT = 0.5


@dataclass
class Sample:
    slot: int
    group: int
    version: int
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logp: list[float]
    reward: float
    released_at: float
    started_at: float
    finished_at: float
    epoch: int = 0
    advantage: float = 0.0  # grpo: the response's group-relative advantage
    token_advantages: list[float] | None = None  # ppo: the critic's GAE, per token
    critic_version: int = -1
    ref_logp: list[float] | None = None  # the reference task's, per response token
    gen_calls: list[dict] = field(default_factory=list)  # rollout engine calls (first row)
    # 1 for each response token the model wrote, 0 for one its environment wrote (an
    # episode's observations); None: every token is the model's
    loss_mask: list[int] | None = None
    episode: dict | None = None  # its turns, tool calls, errors and seconds (episodes)
    # the weights its tokens came from: (position, version, epoch) change points
    # (workflow.weightUpdate interrupt; workflow/versions.py); None: all `version`'s
    versions: list[tuple[int, int, int]] | None = None
    # reward.url, reward.model: (the rule's score, the scorer's error or "", the reward
    # replica's batch span start, end); None: the rollout scored it
    scoring: tuple[float, str, float, float] | None = None

    @property
    def changes(self) -> list[tuple[int, int, int]]:
        return self.versions or [(0, self.version, self.epoch)]


class Stopped(Exception):
    """SIGTERM arrived mid-step: the step is abandoned, its rows go back."""


class StepSource:
    """Rank 0's view of a step, micro-batch by micro-batch.

    A background thread claims the step's rows while the trainer computes, so no
    claim round trip sits between two micro-steps. sync: it waits for the whole
    step at once. periodic/async: it claims whole groups as they become ready.
    In slot order (`trainer.microBatchOrder`) micro-batch j is handed out once
    the step's samples [j·mb, (j+1)·mb) have all arrived; in arrival order it is
    the next mb samples to arrive, so a slow early group holds up nothing but
    itself (the samples of a step: see the lanes below). Groups
    made by weights outside the trainer's lineage or the staleness bound (after a
    trainer restart) are sent back to the rollouts. While it waits, the trainer
    computes the reference's log-probs: the reference task's rows (`idle`), or,
    where the reference is not a task, those of the samples that arrived
    (`reference`, a `LocalReference`: every sample handed out has them).

    The step trains one group per lane (workflow/dynamic_sampling.py): lane i trains
    group i, or with `algorithm.filterGroups` the first group with a signal of its
    chain of replacements, which `draw(step, groups)` puts into the step's partition
    as they are needed. Micro-batches take the lanes' samples in lane order (slot
    order) or in the order lanes settle (arrival order)."""

    def __init__(self, spec: RLJobSpec, tq: TransferQueueClient, step: int, keeper,
                 stop: threading.Event | None = None, lineage: Lineage | None = None,
                 health=None, draw=None, idle=None, spans=None, reference=None,
                 claimers: ThreadPoolExecutor | None = None):
        self.spec, self.tq, self.step = spec, tq, step
        self.spans = spans  # the trainer's SpanLog: each claim and read
        # work done while the next micro-batch is not there (the reference task's
        # ReferenceWork: its claim waits until rows of either kind arrive)
        self.idle = idle
        # reference.LocalReference where the reference is not a task: the arrived
        # samples' log-probs, computed while the rest of the micro-batch comes
        self.reference = reference
        self._unreferenced: list[Sample] = []
        self.lineage = lineage
        self.health = health  # raises if a producer in this process (the critic) failed
        self.reads = train_reads(spec)
        self.stopping = stop or threading.Event()
        self.rows_claimed = 0  # distinct rows of the step
        self.rows_reclaimed = 0  # rows claimed again after their lease expired
        self.rows_regenerated = 0
        self.keeper = keeper  # keeps the step's leases alive until it is trained
        algo = spec.algorithm
        self.n, self.mb, self.g = algo.samples_per_step, algo.micro_samples, algo.group_size
        self.groups: dict[int, list[Sample]] = {}  # group of the step -> its samples
        self.lanes = StepLanes(algo.step_prompts, algo.prompt_cap, algo.filter_groups)
        self.draw = draw
        self.by_arrival = spec.trainer.micro_batch_order_in(
            spec.workflow.mode, spec.rollout.dispatch) == "arrival"
        self.leases = []
        self.next_slot = 0  # of the step's trained samples, the first not handed out
        self.scored: set[int] = set()  # groups whose advantages are set
        self.estimator = advantage_estimator(algo)
        self._arrived = threading.Condition()
        self._idle_claim = None  # the idle work's claim in flight (a Future)
        self._idle_since = 0  # the wakes its claim counts from
        self._error: BaseException | None = None
        self._stop = threading.Event()
        # the step's claims from `claimers` (the trainer's thread, started once: a new
        # thread's start waits until it runs, 0.25 ms median and 1.4 ms p90 on 2 busy
        # cores, before the step's first claim), else from a thread of its own
        self._thread: threading.Thread | None = None
        self._claiming: Future | None = None
        if claimers is not None:
            self._claiming = claimers.submit(self._claimer)
        else:
            self._thread = threading.Thread(target=self._claimer, name="rljob-step-claimer",
                                            daemon=True)
            self._thread.start()

    def _claimer(self) -> None:
        # sync with the reference computed here: whole groups as they come too, so their
        # reference log-probs overlap the rest of the step's generation
        streaming = self.spec.workflow.mode != "sync" or self.reference is not None
        try:
            while not self._stop.is_set():
                with self._arrived:
                    missing = self.lanes.pending * self.g  # a group in flight per lane
                if missing <= 0:
                    return
                # sync: the whole step at once; streaming: whatever whole groups are ready
                self._claim(missing, min(self.g, missing) if streaming else missing)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            with self._arrived:
                self._error = exc
                self._arrived.notify_all()
            self._wake_idle()

    def _notify(self, _=None) -> None:
        with self._arrived:
            self._arrived.notify_all()

    def _wake_idle(self) -> None:
        """The idle work's claim in flight ends on the controller: arrivals (or an
        error) came, and the training thread goes on without it."""
        if self.idle is not None:
            self.idle.wake()

    def _claim(self, count: int, min_count: int) -> None:
        batch = ride_out(lambda: self.tq.claim_get("train", count, self.reads, policy="group",
                                                   partition=self.step, wait=1.0,
                                                   min_count=min_count),
                         away=warn(log), stop=self._stop, once=True)
        if batch is None or not batch.rows:  # None: the controller was away
            return
        if self.spans is not None:
            self.spans.claimed(batch, self.step)
        d = batch.data
        # column by column (a claim brings hundreds of rows, each step's on the path
        # from their write to training)
        samples = [Sample(int(slot), row.group, row.version, p.tolist(), r.tolist(), lp.tolist(),
                          float(reward), released_at=float(released), started_at=float(started),
                          finished_at=float(finished), epoch=int(epoch),
                          gen_calls=list(calls or []))
                   for row, slot, p, r, lp, reward, released, started, finished, epoch, calls
                   in zip(batch.rows, d["slot"], d["prompt_ids"], d["response_ids"],
                          d["rollout_logp"], d["reward"], d["released_at"], d["started_at"],
                          d["finished_at"], d["weights_epoch"], d["gen_calls"])]
        if "ref_logp" in d:  # the reference task's
            for s, x in zip(samples, d["ref_logp"]):
                s.ref_logp = x.tolist()
        if "advantages" in d:  # ppo
            for i, s in enumerate(samples):
                s.token_advantages = d["advantages"][i].tolist()
                s.critic_version = int(d["critic_version"][i])
        if "weight_versions" in d:  # weightUpdate interrupt: each token's weights
            for i, s in enumerate(samples):
                s.versions = [tuple(int(x) for x in c) for c in d["weight_versions"][i] or []]
        if "rule_reward" in d:  # reward.url, .model: the reward replicas scored them
            for s, rule, error, t0, t1 in zip(samples, d["rule_reward"], d["reward_error"],
                                              d["reward_started_at"], d["reward_finished_at"]):
                s.scoring = (float(rule), error or "", float(t0), float(t1))
        if "loss_mask" in d:  # episodes: the model's tokens 1, the observations' 0
            for i, s in enumerate(samples):
                s.loss_mask = d["loss_mask"][i].tolist()
                s.episode = dict(d["episode"][i] or {})
        batch, samples = self._refuse_foreign(batch, samples)
        if not batch.rows:
            return
        self.keeper.hold(batch)
        draws: list[int] = []
        with self._arrived:
            self._supersede(set(batch.indices))
            self.leases.append(batch)
            by_group: dict[int, list[Sample]] = {}
            for s in sorted(samples, key=lambda s: s.slot):
                by_group.setdefault(s.slot // self.g, []).append(s)
            for group, members in by_group.items():
                if group in self.groups:  # its lease expired and this claim brought it
                    self.rows_reclaimed += len(members)  # back, or a second copy
                    continue
                self.rows_claimed += len(members)
                self.groups[group] = members
                if self.reference is not None:
                    self._unreferenced += members
                draws += self.lanes.arrive(group, [m.reward for m in members])
            self._arrived.notify_all()
            idle_waits = self._idle_claim is not None
        if idle_waits:  # the training thread waits on it: it has its rows now
            self._wake_idle()
        if draws:
            self.draw(self.step, draws)

    def _supersede(self, indices: set[int]) -> None:
        """Take rows claimed again out of the older leases that held them. Those leases
        expired (the controller or its storage was away longer than a lease term), so
        the rows came back to `train`; the new lease is the one that acks them."""
        kept = []
        for old in self.leases:
            rows = [r for r in old.rows if r.index not in indices]
            if len(rows) == len(old.rows):
                kept.append(old)
                continue
            self.keeper.drop(old)
            if rows:
                old = Batch(old.task, old.lease, rows, {}, old.lease_seconds)
                self.keeper.hold(old)
                kept.append(old)
        self.leases = kept

    def _refuse_foreign(self, batch, samples: list[Sample]):
        """Send back the groups this trainer may not train at this step; keep the rest."""
        if self.lineage is None:
            return batch, samples
        bound = self.spec.workflow.staleness_bound
        verdicts: dict[tuple, bool] = {}  # a claim's samples share a few weights
        bad = set()
        for s in samples:
            key = (s.version, s.epoch) if s.versions is None else tuple(s.versions)
            ok = verdicts.get(key)
            if ok is None:
                ok = verdicts[key] = self.lineage.accepts_tokens(s.changes, self.step, bound)
            if not ok:
                bad.add(s.group)
        if not bad:
            return batch, samples
        refused = [row.index for row in batch.rows if row.group in bad]
        versions = sorted({(e, v) for s in samples if s.group in bad for _, v, e in s.changes})
        log.warning("step %d: %d samples were made by weights %s that this trainer does not "
                    "descend from or that are too stale: the rollouts make them again",
                    self.step + 1, len(refused), [v for _, v in versions])
        self.tq.regenerate(batch, refused, "rollout")
        self.rows_regenerated += len(refused)
        rows = [row for row in batch.rows if row.group not in bad]
        return (Batch(batch.task, batch.lease, rows, {}, batch.lease_seconds),
                [s for s in samples if s.group not in bad])

    def _ready(self, start: int, end: int) -> bool:
        """Whether the lanes of trained samples [start, end) are settled."""
        if self.by_arrival:
            return len(self.lanes.order) * self.g >= end
        return all(lane in self.lanes.chosen
                   for lane in range(start // self.g, (end - 1) // self.g + 1))

    def _trained(self, position: int) -> Sample:
        """The step's trained sample at `position` (lane by lane, a group's members in
        slot order)."""
        lane = position // self.g
        if self.by_arrival:
            lane = self.lanes.order[lane]
        return self.groups[self.lanes.chosen[lane]][position % self.g]

    def next_micro_batch(self) -> list[Sample] | None:
        if self.next_slot >= self.n:
            return None
        start, end = self.next_slot, self.next_slot + self.mb
        quiet = False
        with self._arrived:
            while True:
                # before looking: arrivals from here on wake the idle work's claim
                since = self.idle.mark() if self.idle is not None else 0
                if self._ready(start, end):
                    break
                if self._error is not None:
                    raise self._error
                if self.stopping.is_set():
                    raise Stopped
                if self.health is not None:
                    self.health()
                if self._unreferenced:  # arrived samples' reference log-probs meanwhile
                    todo, self._unreferenced = self._unreferenced, []
                    self._arrived.release()  # the claimer adds arrivals meanwhile
                    try:
                        self.reference(todo, self.step)
                    finally:
                        self._arrived.acquire()
                    continue
                if self.idle is not None and self._idle_claim is None:
                    if quiet:  # its last claim found nothing, unwoken: not at once again
                        quiet = False
                        self._arrived.wait(0.01)
                        continue
                    # the reference's rows of this step: a claim of its own waits for
                    # them while this thread waits for arrivals, whichever comes first
                    claim = self._idle_claim = self.idle.claim(self.step, IDLE_WAIT, since)
                    self._idle_since = since
                    claim.add_done_callback(self._notify)
                if self._idle_claim is not None and self._idle_claim.done():
                    claim, self._idle_claim = self._idle_claim, None
                    self._arrived.release()  # the claimer adds arrivals meanwhile
                    try:
                        worked = self.idle.work(claim.result())
                    finally:
                        self._arrived.acquire()
                    # nothing within its wait, or the controller away (not woken)
                    quiet = not worked and self.idle.mark() == self._idle_since
                    continue
                self._arrived.wait(0.2)
            chunk = [self._trained(p) for p in range(start, end)]
        self.next_slot = end
        if self.reference is not None:  # those that came last
            self.reference(chunk, self.step)
        if self.spec.algorithm.critic:
            return chunk  # the critic's advantages came with the samples
        # claims bring whole groups, so each sample's group is complete
        for group in sorted({s.slot // self.g for s in chunk}):
            if group in self.scored:
                continue
            self.scored.add(group)
            members = self.groups[group]
            for m, a in zip(members, self.estimator.of_group([m.reward for m in members])):
                m.advantage = a
        return chunk

    def take_leases(self) -> list:
        """The step's batches (all of them: the step was trained whole)."""
        self.close()
        with self._arrived:
            leases, self.leases = self.leases, []
        return leases

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        else:
            wait([self._claiming])  # its errors went to the training thread
        if self._idle_claim is not None:  # what it brings back goes back
            self.idle.abandon(self._idle_claim)
            self._idle_claim = None

    def give_back(self) -> None:
        """An abandoned step: its rows go back to the queue at once."""
        for batch in self.take_leases():
            self.keeper.drop(batch)
            try:
                self.tq.release(batch)
            except TransferQueueError as exc:  # its lease expires instead
                log.warning("could not release a batch of step %d: %s", self.step, exc)


def data_parallel_shard(chunk: list[Sample], rank: int, world: int, split: str) -> list[Sample]:
    """This data-parallel rank's samples of a micro-batch (`trainer.dataParallelSplit`).
    Every rank computes the same split of the same broadcast chunk."""
    if world == 1:
        return chunk
    if split == "token_balanced":
        ranks = balance_over_ranks([len(s.prompt_ids) + len(s.response_ids) for s in chunk],
                                   world)
        return [s for s, r in zip(chunk, ranks) if r == rank]
    return chunk[rank::world]


def prompts_digest(prompt_ids_in_slot_order) -> str:
    """What a step trained on, as one hash: equal steps of two runs trained the same prompts."""
    h = hashlib.sha1()
    for ids in prompt_ids_in_slot_order:
        h.update(np.asarray(ids, np.int32).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]
