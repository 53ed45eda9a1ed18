"""The trainer worker (`rljob worker trainer`): one rank of the trainer gang.

Rank 0 claims each step's samples from TransferQueue and broadcasts them over
the gloo/hccl group; every rank trains its shard of each micro-batch with DDP
(gradients synchronised on the step's last micro-batch only). Micro-batches are
cut in the step's slot order (`trainer.microBatchOrder: slot`), whatever order
samples arrive in, so a streamed step (periodic) makes exactly the update a
whole-batch step (sync) makes from the same samples; or in the order samples
arrive (`arrival`: a slow early group no longer holds up the rest), which sums
the same gradients in another order (equal to sync within float rounding).

A micro-step's log-probs, each of a token under the sampling distribution
(`rljob.sampling`: the job's temperature and top-p): the policy's (with grad);
the proximal policy's, the same detached (one optimizer step per step, so the
weights at the step's start are the current ones: no second forward); the
behaviour policy's, which the rollout engine reported while sampling and the row
carries; the frozen reference's, which the row carries too when the reference
is a task of its own (reference.py: computed by rank 0 while it waits for
samples, or by an idle replica), else (megatron) computed in the micro-step.
The policy loss that combines them is the one
`algorithm.offPolicyCorrection` names (algorithms.py), and each step reports the
importance weights and the engine mismatch they show (`OffPolicyStats`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..api.spec import RLJobSpec
from ..contract import MASTER_PORT, local_address
from ..inputs.data import load_examples, prompt_columns, prompt_ids
from ..infra.cores import CoreShare, computing
from ..infra.device import activate, cores_given, resolve as resolve_device
from ..inputs.models import build_model, load_tokenizer
from ..infra.rundir import PARTIAL, RunDir
from ..infra.timeline import SpanLog
from ..infra.worker_metrics import WorkerMetrics
from ..transferqueue import Batch, TransferQueueClient
from ..transferqueue.client import TransferQueueError
from ..transferqueue.loader import LeaseKeeper, broadcast_object
from ..transferqueue.samplers import balance_over_ranks
from ..weights import WeightSender, new_epoch
from ..workflow.tasks import reference_task, tasks_for, train_reads
from ..workflow.dynamic_sampling import StepLanes, replacement_example
from ..workflow.timing import (generation_queue_seconds, generation_seconds, profile_record,
                               spread, training_seconds)
from ..sampling import TokenDistribution
from .algorithms import OffPolicyStats, PolicyInputs, advantage_estimator, policy_loss
from .batch import make_batch
from .lineage import Lineage
from . import mcore  # noqa: F401 - registers trainer.engine megatron
from .policy import make_policy
from .reference import ReferenceWork, replicas_take_it, save_weights
from .sinks import open_sinks

log = logging.getLogger("rljob.trainer")


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
    trainer restart) are sent back to the rollouts.

    The step trains one group per lane (workflow/dynamic_sampling.py): lane i trains
    group i, or with `algorithm.filterGroups` the first group with a signal of its
    chain of replacements, which `draw(step, groups)` puts into the step's partition
    as they are needed. Micro-batches take the lanes' samples in lane order (slot
    order) or in the order lanes settle (arrival order)."""

    def __init__(self, spec: RLJobSpec, tq: TransferQueueClient, step: int, keeper,
                 stop: threading.Event | None = None, lineage: Lineage | None = None,
                 health=None, draw=None, idle=None):
        self.spec, self.tq, self.step = spec, tq, step
        self.idle = idle  # (step) -> work done while the next micro-batch is not there
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
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._claimer, name="rljob-step-claimer",
                                        daemon=True)
        self._thread.start()

    def _claimer(self) -> None:
        streaming = self.spec.workflow.mode != "sync"
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

    def _claim(self, count: int, min_count: int) -> None:
        try:
            batch = self.tq.claim_get("train", count, self.reads, policy="group",
                                      partition=self.step, wait=1.0, min_count=min_count)
        except TransferQueueError as exc:
            if not exc.unavailable:
                raise
            log.warning("transferqueue unavailable (%s); claiming again", exc.code.name)
            self._stop.wait(0.5)  # it restarts: the session reconnects by itself
            return
        if not batch.rows:
            return
        d = batch.data
        samples = [Sample(int(d["slot"][i]), row.group, row.version, d["prompt_ids"][i].tolist(),
                          d["response_ids"][i].tolist(), d["rollout_logp"][i].tolist(),
                          float(d["reward"][i]), released_at=float(d["released_at"][i]),
                          started_at=float(d["started_at"][i]),
                          finished_at=float(d["finished_at"][i]),
                          epoch=int(d["weights_epoch"][i]),
                          gen_calls=list(d["gen_calls"][i] or []))
                   for i, row in enumerate(batch.rows)]
        if "ref_logp" in d:  # the reference task's
            for i, s in enumerate(samples):
                s.ref_logp = d["ref_logp"][i].tolist()
        if "advantages" in d:  # ppo
            for i, s in enumerate(samples):
                s.token_advantages = d["advantages"][i].tolist()
                s.critic_version = int(d["critic_version"][i])
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
                draws += self.lanes.arrive(group, [m.reward for m in members])
            self._arrived.notify_all()
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
        bad = {s.group for s in samples
               if not self.lineage.accepts(s.epoch, s.version, self.step, bound)}
        if not bad:
            return batch, samples
        refused = [row.index for row in batch.rows if row.group in bad]
        versions = sorted({(s.epoch, s.version) for s in samples if s.group in bad})
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
        with self._arrived:
            while not self._ready(start, end):
                if self._error is not None:
                    raise self._error
                if self.stopping.is_set():
                    raise Stopped
                if self.health is not None:
                    self.health()
                if self.idle is not None:
                    # the reference's log-probs of rows of this step, the lock let go
                    # meanwhile (the claimer adds arrivals)
                    self._arrived.release()
                    try:
                        worked = self.idle(self.step)
                    finally:
                        self._arrived.acquire()
                    if worked:
                        continue
                self._arrived.wait(0.01 if self.idle is not None else 0.2)
            chunk = [self._trained(p) for p in range(start, end)]
        self.next_slot = end
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
        self._thread.join()

    def give_back(self) -> None:
        """An abandoned step: its rows go back to the queue at once."""
        for batch in self.take_leases():
            self.keeper.drop(batch)
            try:
                self.tq.release(batch)
            except TransferQueueError as exc:  # its lease expires instead
                log.warning("could not release a batch of step %d: %s", self.step, exc)


def warm_up(policy, tok, spec: RLJobSpec, report=None) -> float:
    """Supervised steps on prompt → answer (teacher forcing) for random-init models;
    `report(step, steps, loss)` hears every tenth step and the last."""
    steps = spec.model.warmup_steps
    if steps == 0:
        return 0.0
    examples = load_examples(spec.dataset)
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.model.warmup_lr)
    rng = np.random.default_rng(spec.algorithm.seed)
    batch = 64
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        picked = rng.choice(len(examples), size=batch)[policy.data_rank::policy.data_world]
        prompts = [prompt_ids(tok, examples[i].prompt) for i in picked]
        answers = [tok.encode(examples[i].answer, add_special_tokens=False) + [tok.eos_token_id]
                   for i in picked]
        b = make_batch(prompts, answers, tok.pad_token_id).to(policy.device)
        logp = policy.logprobs(b, TokenDistribution(vocab=len(tok)))  # the tokenizer's ids
        loss = -(logp * b.mask).sum() / b.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if report is not None and (step % 10 == 0 or step == steps):
            report(step, steps, float(loss.detach()))
    return float(loss.detach())


def warmup_reporter(run: RunDir | None):
    """`warm_up`'s report as the run directory's warmup.json (None: nowhere)."""
    if run is None:
        return None

    def report(step: int, steps: int, loss: float) -> None:
        tmp = run.warmup_progress.with_name(run.warmup_progress.name + PARTIAL)
        try:
            tmp.write_text(json.dumps({"step": step, "of": steps, "loss": loss}))
            tmp.replace(run.warmup_progress)
        except OSError as exc:  # progress only: the warm-up goes on
            log.debug("warm-up progress not written: %s", exc)

    return report


class TrainerWorker:
    """One trainer rank: `setup()` restores or warms up the policy and publishes its
    first version; `run()` trains `step(t)` after step until maxSteps or SIGTERM and
    then checkpoints and saves; `close()` lets go of everything. Rank 0 also claims
    the samples (StepSource), publishes weights, reports each step's figures to its
    sinks and to the controller, and (ppo) runs the critic."""

    def __init__(self, spec: RLJobSpec, tq_address: str, weights_listen: str, rank: int = 0,
                 world: int = 1, master: str = local_address(MASTER_PORT),
                 run_dir: Path | None = None, resume: bool = False,
                 max_steps: int | None = None, metrics_port: int | None = None,
                 local_rank: int = 0):
        self.spec, self.rank, self.world, self.master = spec, rank, world, master
        self.tq_address, self.weights_listen = tq_address, weights_listen
        self.run_dir, self.resume, self.local_rank = RunDir.of(run_dir), resume, local_rank
        self.metrics_port = metrics_port
        self.steps = max_steps or spec.algorithm.max_steps
        self.name = f"trainer-{rank}"
        self.stop = threading.Event()  # SIGTERM: checkpoint what was trained, then exit
        self.spans = SpanLog(run_dir, self.name)
        self.sender = self.tq = self.keeper = self.critic = self.sinks = self.source = None
        self.reference: ReferenceWork | None = None
        self.examples = None  # the dataset, once filterGroups draws from it
        self.start = self.version = self.checkpointed = 0
        self.uncommitted: list = []  # leases of trained rows not yet in a checkpoint
        # this life's steps after its first PROFILE_SKIP: the live profile's window
        self.recent: deque[dict] = deque(maxlen=PROFILE_STEPS)
        self.reported = 0
        self.distributed = False
        self.cores: CoreShare | None = None

    # ---- life -----------------------------------------------------------------
    def setup(self) -> TrainerWorker:
        spec, rank = self.spec, self.rank
        # the cores this worker was given, shared by the ranks of its node (torchrun)
        torch.set_num_threads(max(1, cores_given()
                                  // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        # the weight service and TransferQueue threads answer while the main thread
        # computes: hand the GIL over sooner than the default 5 ms
        sys.setswitchinterval(0.0005)
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        device = resolve_device(spec.accelerator_for("trainer").type, self.local_rank)
        self.torch_device = activate(device)
        if self.world > 1 or spec.trainer.engine == "megatron":
            dist.init_process_group(device.backend, init_method=f"tcp://{self.master}",
                                    rank=rank, world_size=self.world)
            self.distributed = self.world > 1
        self.prom = WorkerMetrics(self.name, self.metrics_port)
        self.tok = load_tokenizer(spec.model)
        self.policy = make_policy(spec, self.tok, device, self.torch_device, rank, self.world)
        # a local run: the cores of a rollout that waits are lent (the reference, a deep
        # copy made below, keeps the hooks)
        self.cores = CoreShare.open(self.run_dir.root if self.run_dir else None, self.name)
        if self.cores is not None:
            self.cores.hook(self.policy.model)
        ref_state, opt_state, recorded = self._restore()
        # this life's epoch: samples of weights a dead life published after `start` are
        # not in its history and are made again
        self.lineage = Lineage.restored(new_epoch(), recorded)
        if rank == 0:
            self.sender = WeightSender(self.weights_listen, self.lineage.epoch,
                                       spec.weight_transport)
        if self.start == 0 and ref_state is None:
            with self.spans.span("train", -1), computing(self.cores):
                warm_loss = warm_up(self.policy, self.tok, spec,
                                    warmup_reporter(self.run_dir) if rank == 0 else None)
            if rank == 0 and spec.model.warmup_steps:
                log.info("warm-up: %d steps, final loss %.3f", spec.model.warmup_steps,
                         warm_loss)
        self.policy.freeze_reference(ref_state)
        self.opt = make_optimizer(self.policy, spec.algorithm.lr)
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)  # ZeRO: each rank keeps its shard
        # collective (megatron gathers tensor-parallel shards): the critic starts
        # from the policy's weights; the sender copies them a tensor at a time
        if spec.algorithm.critic:  # one collective: rank 0 gets the dict, the rest None
            state = tensors = self.policy.hf_state()
        else:
            state, tensors = None, self.policy.hf_tensors()
            if rank != 0:
                drain(tensors)
        if rank == 0:
            self.sender.publish(self.start, tensors)
            self.tq = TransferQueueClient(self.tq_address)
            self.tq.register(*tasks_for(spec))  # idempotent: whoever comes first declares it
            back = self.tq.release_consumer()  # what an earlier life of this rank held
            if back:
                log.info("gave back %d rows an earlier trainer held", back)
            self.keeper = LeaseKeeper(self.tq)
            if reference_task(spec):
                self.reference = self._reference_work()
            if spec.algorithm.critic:
                self.critic = _start_critic(spec, self.tok, state, self.torch_device,
                                            self.tq_address, self.run_dir, self.start,
                                            self.steps, self.resume)
            self.sinks = open_sinks(spec, self.run_dir, self.start, self.prom)
        self.version = self.checkpointed = self.start
        return self

    def _restore(self) -> tuple[dict | None, dict | None, dict | None]:
        """From the newest complete checkpoint (with --resume): sets `start`; returns
        the reference weights, the optimizer state and the recorded lineage."""
        run, name = self.run_dir, self.policy.checkpoint_name()
        # a checkpoint cut short by a kill has only its .partial file: not counted
        done = run.checkpoint_steps(name) if self.resume and run else []
        if not done:
            return None, None, None
        ck = torch.load(run.checkpoint(done[-1]) / name, weights_only=True,
                        map_location=self.torch_device)
        ref_state = self.policy.load_checkpoint(ck)
        self.start = ck["step"]
        return ref_state, ck["optimizer"], ck.get("lineage")

    def _reference_work(self) -> ReferenceWork:
        """Rank 0's share of the reference task (reference.py); in a local run the
        reference's weights also go into the run directory, for the replicas."""
        policy, tok = self.policy, self.tok
        if self.run_dir is not None and replicas_take_it(self.spec):
            save_weights(self.run_dir.reference, policy.ref)

        @contextmanager
        def compute():
            with computing(self.cores), policy.autocast():
                yield

        return ReferenceWork(self.tq_address, lambda: policy.ref, tok.pad_token_id,
                             TokenDistribution.of(self.spec.rollout, len(tok)),
                             rows=16, compute=compute,
                             spans=self.spans)

    def run(self) -> None:
        for t in range(self.start, self.steps):
            if self.stop.is_set() or not self.step(t):
                break
        finished = self.version == self.steps
        if not finished and self.version > self.checkpointed:
            # asked to stop: keep what was trained since the last checkpoint
            self.checkpoint()
            log.info("stopped after step %d: checkpointed", self.version)
        if self.run_dir and finished:
            self.policy.save_pretrained(self.run_dir.final, self.tok)  # collective

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.reference is not None:
            self.reference.close()
        if self.critic is not None:
            self.critic.close()
        if self.sender is not None:
            # let the replicas pick up the last version before the sender goes away
            self.sender.wait_replicas(self.sender.version, timeout=5.0)
            self.sender.stop(grace=1.0)
        if self.keeper is not None:
            self.keeper.close()
        if self.tq is not None:
            try:
                self.tq.flush()  # surface a refused ack
            except Exception as exc:  # noqa: BLE001 - shutting down: report, do not mask
                log.warning("an ack was refused: %s", exc)
            self.tq.close()
        if self.sinks is not None:
            self.sinks.close()
        self.spans.close()
        if self.distributed:
            dist.destroy_process_group()

    # ---- a step ---------------------------------------------------------------
    def step(self, t: int) -> bool:
        """Train step t: its micro-batches as they come (rank 0 claims them and
        broadcasts them), the optimizer step, the new version published, the figures
        reported, a checkpoint when due. False if asked to stop mid-step (nothing of
        the step is applied and its rows go back)."""
        spec, policy, rank = self.spec, self.policy, self.rank
        algo = spec.algorithm
        n, mb = algo.samples_per_step, algo.micro_samples
        micro_batches = n // mb
        if rank == 0:
            self.source = StepSource(spec, self.tq, t, self.keeper, self.stop, self.lineage,
                                     health=self.critic.check if self.critic else None,
                                     draw=self._draw_replacements,
                                     idle=self._reference_rows if self.reference else None)
        samples: list[Sample] = []
        train_spans: list[tuple[float, float]] = []
        sums = {"loss": 0.0, "kl": 0.0, "clip": 0.0}
        off_policy = OffPolicyStats()
        t_wall = time.time()
        self.opt.zero_grad()
        for j in range(micro_batches):
            chunk = self._next_micro_batch()
            if chunk == "stop":
                break
            t0 = time.time()
            samples += chunk
            shard = data_parallel_shard(chunk, policy.data_rank, policy.data_world,
                                        spec.trainer.data_parallel_split)
            with computing(self.cores):
                parts = _micro_step(policy, shard, t, self.tok, spec,
                                    last=(j == micro_batches - 1))
            for key in sums:
                sums[key] += parts[key] / micro_batches
            off_policy = off_policy.merge(parts["stats"])
            t1 = time.time()
            train_spans.append((t0, t1))
            self.spans.add("train", t0, t1, t, {
                "samples": len(shard),
                "tokens": sum(len(x.prompt_ids) + len(x.response_ids) for x in shard)})
        if len(samples) < n:  # stopped mid-step: nothing of it is applied
            if self.source is not None:
                self.source.give_back()
            self.opt.zero_grad()
            return False
        t0 = time.time()
        with computing(self.cores):
            grad_norm = policy.clip_grad_norm(algo.max_grad_norm)  # collective (tp)
            self.opt.step()
        t1 = time.time()
        self.spans.add("optimizer", t0, t1, t)
        train_spans.append((t0, t1))
        self.version = t + 1
        if t == self.start:
            log.info("optimizer state on this rank: %.2f MB (%s over %d data-parallel "
                     "rank(s))", optimizer_state_bytes(self.opt) / 1e6,
                     "ZeRO-1" if policy.data_world > 1 else "AdamW", policy.data_world)
        tensors = policy.hf_tensors()  # collective: the sender (rank 0) consumes it
        if rank != 0:
            drain(tensors)
        if rank == 0:
            # the step's rows stay leased (kept alive) until a checkpoint holds the
            # update: a trainer that dies before then trains them again
            self.uncommitted += self.source.take_leases()
            with self.spans.span("weight-sync", t):
                self.sender.publish(self.version, tensors)
            m = _step_metrics(t, samples, train_spans, time.time() - t_wall, sums)
            m |= _off_policy_figures(off_policy)
            if spec.algorithm.filter_groups:
                m |= self.source.lanes.figures()
                if m["groups_filled"]:
                    log.warning("step %d: %d of its %d groups are trained without a "
                                "signal (all rewards equal): no group with one came up in "
                                "the %d prompts algorithm.maxPromptsPerStep allows (%d "
                                "replacements drawn)", t + 1, m["groups_filled"],
                                algo.step_prompts, algo.prompt_cap, m["extra_prompts"])
            self._report(m, grad_norm, samples)
        if self.version % spec.trainer.checkpoint_every == 0 or self.version == self.steps:
            self.checkpoint()
        return True

    def _reference_rows(self, step: int) -> int:
        """Waiting for samples: the reference's log-probs of rows of `step`."""
        return self.reference.once(partition=step)

    def _draw_replacements(self, step: int, groups: list[int]) -> None:
        """filterGroups: put the prompts of replacement groups of `step` into its
        partition (workflow/dynamic_sampling.py draws them by seed, step and group)."""
        algo = self.spec.algorithm
        if self.examples is None:
            self.examples = load_examples(self.spec.dataset)
        picks = [self.examples[replacement_example(len(self.examples), algo.seed, step, g)]
                 for g in groups]
        columns = prompt_columns(self.tok, picks, algo.group_size, groups)
        rows = len(columns["slot"])
        columns["released_at"] = [time.time()] * rows
        while True:
            try:
                self.tq.put(step, columns, group_size=algo.group_size,
                            lengths=[len(x) for x in columns["prompt_ids"]])
                return
            except TransferQueueError as exc:
                if not exc.unavailable:
                    raise
                log.warning("drawing replacement prompts: transferqueue unavailable (%s); "
                            "putting them again", exc.code.name)
                time.sleep(0.5)

    def _next_micro_batch(self):
        """Rank 0's next micro-batch of samples ("stop" when asked to stop), the
        same on every rank."""
        try:
            chunk = self.source.next_micro_batch() if self.rank == 0 else None
        except Stopped:
            chunk = "stop"
        return broadcast_object(chunk) if self.world > 1 else chunk

    def _report(self, m: dict, grad_norm: float, samples: list[Sample]) -> None:
        """Rank 0: a step's figures to the sinks (metrics.jsonl, Prometheus,
        TensorBoard, W&B) and the job's to the controller (the operator's status)."""
        m["grad_norm"] = grad_norm
        m["rows_claimed"] = self.source.rows_claimed
        m["rows_regenerated"] = self.source.rows_regenerated
        m["rows_reclaimed"] = self.source.rows_reclaimed
        if self.critic is not None:
            m |= _critic_metrics(samples, self.critic)
        self.reported += 1
        if self.reported > PROFILE_SKIP:  # start-up (compilation, first weights) aside
            self.recent.append(m)
        profile = json.dumps(profile_record(list(self.recent))) if self.recent else ""
        self.tq.report_metrics(step=self.version, source=self.name, profile=profile,
                               **{k: m[k] for k in CONTROLLER_FIGURES})
        self.sinks.write(m, self.version)

    def checkpoint(self) -> None:
        """Checkpoint the current version, then ack the rows it holds."""
        _commit(self.run_dir, self.version, self.policy, self.opt, self.rank, self.world,
                self.tq, self.keeper, self.uncommitted, self.lineage)
        self.uncommitted, self.checkpointed = [], self.version


# the live profile the controller keeps for the operator: the record of this trainer
# life's last PROFILE_STEPS steps, its first PROFILE_SKIP aside
PROFILE_STEPS, PROFILE_SKIP = 20, 3
# the step's figures the controller keeps for the operator's status
CONTROLLER_FIGURES = ("gen_seconds", "train_seconds", "staleness_mean", "staleness_max",
                      "tokens_per_second", "samples_per_second", "reward_mean")


def run_trainer(spec: RLJobSpec, tq_address: str, weights_listen: str, rank: int = 0,
                world: int = 1, master: str = local_address(MASTER_PORT),
                run_dir: Path | None = None,
                resume: bool = False, max_steps: int | None = None,
                metrics_port: int | None = None, local_rank: int = 0) -> None:
    """`rljob worker trainer`: one rank until maxSteps or SIGTERM."""
    worker = TrainerWorker(spec, tq_address, weights_listen, rank, world, master, run_dir,
                           resume, max_steps, metrics_port, local_rank)
    try:
        worker.setup().run()
    finally:
        worker.close()


def drain(tensors) -> None:
    """A non-sending rank's part of a collective `hf_tensors` (its gathers)."""
    for _ in tensors:
        pass


def _start_critic(spec, tok, state, torch_device, tq_address, run, start, steps, resume):
    """ppo: the critic (critic.py) on this rank's device, from the policy's weights
    (`state`: Hugging Face names, after warm-up) or its own checkpoint."""
    from .critic import Critic

    lm = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=torch.float32)
    lm.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    critic = Critic.restore(spec, lm, torch_device, TransferQueueClient(tq_address),
                            tok.pad_token_id, run, start=start, resume=resume)
    log.info("critic: scoring from step %d on %s", critic.version + 1, torch_device)
    return critic.start(steps)


def _critic_metrics(samples: list[Sample], critic) -> dict:
    """A step's critic figures: the critic versions that scored its samples, and the
    critic's latest update (its version, value loss, clipped share, mean value)."""
    versions = [s.critic_version for s in samples]
    last = critic.history[max(critic.history)] if critic.history else {}
    return {"scored_by_critic": [min(versions), max(versions)],
            "critic_version": last.get("step", 0), "value_loss": last.get("value_loss"),
            "value_clip": last.get("value_clip"), "values_mean": last.get("values_mean")}


def make_optimizer(policy, lr: float) -> torch.optim.Optimizer:
    """AdamW on the float32 master weights. Over several data-parallel ranks it is
    ZeRO-1 (`ZeroRedundancyOptimizer`): each rank keeps the optimizer state of its
    share of the parameters only, steps that share and broadcasts it; the update
    is the same as unsharded AdamW's."""
    params = list(policy.parameters())
    if policy.data_world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=policy.data_group, lr=lr,
                                       weight_decay=0.0)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state this rank holds (its shard under ZeRO)."""
    inner = getattr(opt, "optim", opt)
    return sum(v.numel() * v.element_size() for st in inner.state.values()
               for v in st.values() if torch.is_tensor(v))


def _commit(run, version, policy, opt, rank, world, tq, keeper, batches,
            lineage: Lineage) -> None:
    """Checkpoint `version`, then ack the rows it holds: they are consumed for good."""
    if run and hasattr(opt, "consolidate_state_dict"):
        opt.consolidate_state_dict(to=0)  # ZeRO, collective: the whole state to the saver
    if run and policy.saves_checkpoint(rank):
        _checkpoint(run, version, policy, opt, lineage)
    if world > 1:
        dist.barrier()  # every shard is on disk before the rows are acked
    if rank != 0:
        return
    for batch in batches:
        keeper.drop(batch)
        _ack_trained(tq, batch)


def _ack_trained(tq: TransferQueueClient, batch) -> None:
    """Ack rows a checkpoint now holds, riding out a controller restart. A lease that
    expired meanwhile (this process was paused) gave its rows back to `train`: they
    are in the checkpoint, so they are claimed again and acked, never retrained."""
    retried = False
    while True:
        try:
            tq.ack(batch)
            return
        except TransferQueueError as exc:
            if exc.unavailable:
                retried = True
                time.sleep(0.5)
                continue
            if retried and "not held" in exc.message:
                return  # the ack before the controller restarted went through
            if "not held" not in exc.message:
                raise
        step = batch.rows[0].partition
        want = set(batch.indices)
        log.warning("the lease of %d trained rows of step %d expired: acking them again",
                    len(want), step)
        deadline = time.monotonic() + 60
        while want and time.monotonic() < deadline:
            again = tq.claim("train", 1 << 14, partition=step, wait=1.0, min_count=1)
            mine = [i for i in again.indices if i in want]
            if mine:
                tq.ack(again, mine)
                want -= set(mine)
            if len(mine) < len(again.indices):
                tq.release(again)  # rows of another batch of the step
        return


def _micro_step(policy, shard, t, tok, spec, last):
    """Forward and backward of this rank's share of a micro-batch of step t; its loss,
    KL, clipped share and off-policy sums."""
    with policy.no_sync(last):
        if not shard:
            # this rank has nothing in this micro-batch: a zero loss keeps DDP in step
            loss = sum(p.sum() for p in policy.parameters()) * 0.0
            loss.backward()
            return {"loss": 0.0, "kl": 0.0, "clip": 0.0, "stats": OffPolicyStats()}
        batch = make_batch([s.prompt_ids for s in shard], [s.response_ids for s in shard],
                           tok.pad_token_id, spec.trainer.packing).to(policy.device)
        dist = TokenDistribution.of(spec.rollout, len(tok))
        logp = policy.logprobs(batch, dist)
        if not spec.algorithm.kl_coef:
            ref_logp = logp.detach()  # no KL term, no reference forward
        elif shard[0].ref_logp is not None:  # the reference task computed them
            ref_logp = _per_token(batch, [s.ref_logp for s in shard])
        else:
            with torch.no_grad():
                ref_logp = policy.ref_logprobs(batch, dist)
        parts = policy_loss(spec.algorithm)(PolicyInputs(
            logp, logp.detach(), _per_token(batch, [s.rollout_logp for s in shard]), ref_logp,
            _advantages(batch, shard), batch.mask,
            torch.tensor([s.version == t for s in shard], device=logp.device)))
        # DDP averages gradients over the data-parallel ranks; the objective sums
        # over all samples
        (parts.loss * policy.data_world).backward()
    return {"loss": float(parts.loss.detach()) * policy.data_world, "kl": parts.kl,
            "clip": parts.clip_frac, "stats": parts.stats}


def _per_token(batch, values: list[list[float]]) -> torch.Tensor:
    """Per-response-token values (a row's, in response order) in the batch's [B, T]
    layout, zero off the response."""
    out = torch.zeros(batch.mask.shape, device=batch.mask.device)
    for i, row in enumerate(values):
        pos = batch.mask[i].nonzero().squeeze(1)
        out[i, pos] = torch.tensor(row[:len(pos)], dtype=out.dtype, device=out.device)
    return out


def _advantages(batch, shard: list[Sample]) -> torch.Tensor:
    """One advantage per response ([B]: grpo) or the critic's per token ([B, T])."""
    if shard[0].token_advantages is None:
        return torch.tensor([s.advantage for s in shard], device=batch.mask.device)
    return _per_token(batch, [s.token_advantages for s in shard])


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


# mean |rollout − trainer log-prob| of fresh tokens above which a step says so: the
# same weights under two engines differ by ~1e-6 nats in float32 and ~1e-2 in
# bfloat16; a tenth of a nat on average is a different distribution (a tokenizer,
# a chat template, a weight sync or a sampling setting that does not match)
MISMATCH_ALERT = 0.1


def _off_policy_figures(stats: OffPolicyStats) -> dict:
    """A step's importance-weight and mismatch figures; with `off_policy_alert`, one
    line, when the engine mismatch is far out of line (also logged)."""
    raw = stats.figures()
    figures = {k: (v if v is None or math.isfinite(v) else None) for k, v in raw.items()}
    alert = mismatch_alert(raw["logp_mismatch_mean"])
    if alert:
        log.warning(alert)
        figures["off_policy_alert"] = alert
    return figures


def mismatch_alert(mean: float | None) -> str | None:
    """The line a step's engine mismatch (mean |Δ log-prob| on fresh tokens) earns, or
    None when it is in line (pure)."""
    if mean is None or mean <= MISMATCH_ALERT:
        return None
    return (f"rollout and trainer log-probs of the same tokens under the same weights "
            f"differ by {mean:.3g} nats on average (in line: below {MISMATCH_ALERT}): the "
            f"rollouts sample from another distribution than the trainer scores; check the "
            f"tokenizer, the weight sync and the rollout engine's sampling settings")


def _step_metrics(t, samples, train_spans, wall, sums) -> dict:
    """A metrics.jsonl line of step t (Tgen and Ttrain: workflow/timing.py)."""
    versions = [t - s.version for s in samples]
    generating = [(s.started_at, s.finished_at) for s in samples]
    gen_seconds = generation_seconds(generating)
    tokens = sum(len(s.response_ids) for s in samples)
    return {
        "step": t + 1,
        "time": time.time(),
        "samples": len(samples),
        "versions": sorted({s.version for s in samples}),
        "reward_mean": float(np.mean([s.reward for s in samples])),
        "staleness_mean": float(np.mean(versions)),
        "staleness_max": int(max(versions)),
        "gen_seconds": gen_seconds,
        "gen_queue_seconds": generation_queue_seconds([s.released_at for s in samples],
                                                      generating),
        "train_seconds": training_seconds(train_spans),
        "step_seconds": wall,
        "tokens": tokens,
        "tokens_per_second": tokens / gen_seconds if gen_seconds > 0 else 0.0,
        "samples_per_second": len(samples) / wall if wall > 0 else 0.0,
        "response_length": tokens / len(samples),
        # the step's workload (a profile's input, planner/live.py): every response's
        # length (at most 256 of them, evenly over the sorted lengths) and the prompts'
        "response_lengths": spread(sorted(len(s.response_ids) for s in samples), 256),
        "prompt_tokens": float(np.mean([len(s.prompt_ids) for s in samples])),
        # the rollout engine calls that generated them (at most 64) and the tokens the
        # trainer computed on in train_seconds: a live profile's latency model
        # (planner/live.py `profile_from_metrics`)
        "gen_calls": spread([c for s in samples for c in s.gen_calls], 64),
        "train_tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
        "prompts": prompts_digest(s.prompt_ids for s in sorted(samples, key=lambda s: s.slot)),
        **{k: (v if math.isfinite(v) else None) for k, v in sums.items()},
    }


def _checkpoint(run: RunDir, version: int, policy, opt, lineage: Lineage) -> None:
    path = run.checkpoint(version)
    path.mkdir(parents=True, exist_ok=True)
    name = policy.checkpoint_name()
    tmp = path / f"{name}.partial"
    torch.save({**policy.checkpoint_state(), "optimizer": opt.state_dict(), "step": version,
                "lineage": lineage.at(version)}, tmp)
    tmp.rename(path / name)
