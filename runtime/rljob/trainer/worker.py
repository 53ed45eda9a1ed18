"""The trainer worker (`rljob worker trainer`): one rank of the trainer gang.

Rank 0 claims each step's samples from TransferQueue (source.py) and broadcasts
them over the gloo/hccl group; every rank trains its shard of each micro-batch
with DDP (step.py; gradients synchronised on the step's last micro-batch only).
Micro-batches are cut in the step's slot order (`trainer.microBatchOrder: slot`),
whatever order samples arrive in, so a streamed step (periodic) makes exactly the
update a whole-batch step (sync) makes from the same samples; or in the order
samples arrive (`arrival`: a slow early group no longer holds up the rest), which
sums the same gradients in another order (equal to sync within float rounding).
Rank 0 also reports each step's figures (report.py); a version is checkpointed
before the rows it trained on are acked (checkpoint.py).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from ..api.spec import RLJobSpec
from ..contract import MASTER_PORT, local_address
from ..inputs.data import load_examples, prompt_columns
from ..infra.cores import CoreShare, computing
from ..infra.device import activate, cores_given, resolve as resolve_device
from ..inputs.models import build_model, load_tokenizer
from ..infra.heap import settle_heap
from ..infra.rundir import RunDir, readable_as_new
from ..infra.timeline import SpanLog
from ..infra.torchprof import StepProfiler
from ..infra.worker_metrics import WorkerMetrics
from ..transferqueue import TransferQueueClient
from ..transferqueue.consumer import Consumer, ride_out, warn
from ..transferqueue.loader import broadcast_object
from ..weights import WeightSender, new_epoch
from ..workflow.tasks import reference_in_trainer, reference_rows, reference_task, tasks_for
from ..workflow.dynamic_sampling import replacement_example
from ..workflow.release import ReleaseRule
from ..sampling import TokenDistribution
from ..tools.catalog import announced
from .algorithms import OffPolicyStats
from .checkpoint import commit, make_optimizer, optimizer_state_bytes, restore
from .lineage import Lineage
from . import mcore  # noqa: F401 - registers trainer.engine megatron
from .policy import make_policy
from .reference import LocalReference, ReferenceWork, replicas_take_it, save_weights
from .report import Reporter, critic_metrics, off_policy_figures, step_metrics
from .sinks import open_sinks
from .source import Sample, StepSource, Stopped, data_parallel_shard
from .step import micro_step, step_figures
from .warmup import WarmupStopped, warm_up, warmup_reporter

log = logging.getLogger("rljob.trainer")

# the longest a step's figures wait for the replicas to hold its weights (a replica
# that died stays live to the release rule for a while; the figures do not wait that)
REPLICAS_WAIT = 2.0


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
        # rank 0: torch's profiler over the steps `rljob run --torch-profile` names
        self.profiler = StepProfiler.from_env(run_dir if rank == 0 else None, self.name)
        self.sender = self.consumer = self.critic = self.reporter = self.source = None
        # rank 0's step claims, one thread for every step (StepSource)
        self.claimers = ThreadPoolExecutor(1, thread_name_prefix="rljob-step-claimer")
        self.reference: ReferenceWork | None = None
        self.local_reference: LocalReference | None = None
        self.examples = None  # the dataset, once filterGroups draws from it
        self.start = self.version = self.checkpointed = 0
        self.published_at: dict[int, float] = {}  # version -> when this life published it
        self.rule = ReleaseRule.of(spec)
        self.uncommitted: list = []  # leases of trained rows not yet in a checkpoint
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
        # from the newest complete checkpoint (with --resume)
        self.start, ref_state, opt_state, recorded = restore(self.run_dir, self.policy,
                                                             self.resume, self.torch_device)
        # this life's epoch: samples of weights a dead life published after `start` are
        # not in its history and are made again
        self.lineage = Lineage.restored(new_epoch(), recorded)
        if rank == 0:
            self.sender = WeightSender(self.weights_listen, self.lineage.epoch,
                                       spec.weight_transport)
        if self.start == 0 and ref_state is None:
            with self.spans.span("train", -1), computing(self.cores):
                warm_loss = warm_up(self.policy, self.tok, spec,
                                    warmup_reporter(self.run_dir) if rank == 0 else None,
                                    self.stop)
            if rank == 0 and spec.model.warmup_steps:
                log.info("warm-up: %d steps, final loss %.3f", spec.model.warmup_steps,
                         warm_loss)
        if spec.model.lora is not None:  # restored with it, or added after the warm-up:
            if not self.policy.adapted:  # from here the adapter trains
                self.policy.add_adapter()
            if self.cores is not None:  # its parameters' gradients too; its layers are
                self.cores.hook(self.policy.model, layers=False)  # hooked already
        self.policy.freeze_reference(ref_state)
        self.opt = make_optimizer(self.policy, spec.algorithm.lr)
        if opt_state is not None:
            self.opt.load_state_dict(opt_state)  # ZeRO: each rank keeps its shard
        # collective (megatron gathers tensor-parallel shards): the critic starts
        # from the policy's weights; the sender copies them a tensor at a time
        state = tensors = None
        base = self.policy.base_tensors()  # model.lora: sent with this life's first version
        if spec.algorithm.critic:  # one collective: rank 0 gets the dict, the rest None
            state = self.policy.hf_state()  # a LoRA policy's merged
        if not spec.algorithm.critic or base is not None:
            tensors = self.policy.hf_tensors()
            if rank != 0:
                drain(tensors)
        if rank == 0:
            self.sender.publish(self.start, state if tensors is None else tensors, base=base)
            self.published_at[self.start] = time.time()
            self.consumer = Consumer.join(self.tq_address, tasks_for(spec))
            if self.consumer.released:  # what an earlier life of this rank held
                log.info("gave back %d rows an earlier trainer held", self.consumer.released)
            if reference_task(spec):
                self.reference = self._reference_work()
            elif reference_in_trainer(spec):
                self.local_reference = self._local_reference()
            if spec.algorithm.critic:
                self.critic = _start_critic(spec, self.tok, state, self.torch_device,
                                            self.tq_address, self.run_dir, self.start,
                                            self.steps, self.resume, self.spans)
            self.reporter = Reporter(self.consumer.tq, self.name,
                                     open_sinks(spec, self.run_dir, self.start, self.prom))
        self.version = self.checkpointed = self.start
        return self

    def _reference_work(self) -> ReferenceWork:
        """Rank 0's share of the reference task (reference.py); in a local run the
        reference's weights also go into the run directory, for the replicas."""
        if self.run_dir is not None and replicas_take_it(self.spec):
            save_weights(self.run_dir.reference, self.policy.ref)
        return ReferenceWork(self.tq_address, **self._reference_forwards())

    def _local_reference(self) -> LocalReference:
        """Rank 0's reference log-probs of its own samples, where they are not a task."""
        return LocalReference(**self._reference_forwards())

    def _reference_forwards(self) -> dict:
        """How rank 0 computes reference log-probs, a task's rows or its own samples':
        the frozen reference in the compute dtype, on its cores, up to a micro-batch
        a forward (each claim, write and ack of the task is a round trip)."""
        policy, tok = self.policy, self.tok

        @contextmanager
        def compute():
            with computing(self.cores), policy.autocast():
                yield

        return {"model": lambda: policy.ref, "pad_id": tok.pad_token_id,
                "dist": TokenDistribution.of(self.spec.rollout, len(tok)),
                "rows": reference_rows(self.spec), "compute": compute,
                "spans": self.spans}

    def run(self) -> None:
        for t in range(self.start, self.steps):
            self.profiler.at(t + 1)  # metrics.jsonl's step
            if self.stop.is_set() or not self.step(t):
                break
        self.profiler.close()
        finished = self.version == self.steps
        if not finished and self.version > self.checkpointed:
            # asked to stop: keep what was trained since the last checkpoint
            self.checkpoint()
            log.info("stopped after step %d: checkpointed", self.version)
        if self.run_dir and finished:
            self.policy.save_pretrained(self.run_dir.final, self.tok)  # collective
            if self.rank == 0:  # the rank that wrote it
                readable_as_new(self.run_dir.final)

    def close(self) -> None:
        self.profiler.close()
        if self.source is not None:
            self.source.close()
        self.claimers.shutdown(wait=False)  # the source's claims ended with it
        if self.reference is not None:
            self.reference.close()
        if self.critic is not None:
            self.critic.close()
        if self.sender is not None:
            # let the replicas pick up the last version before the sender goes away
            self.sender.wait_replicas(self.sender.version, timeout=5.0)
            self.sender.stop(grace=1.0)
        if self.reporter is not None:  # its last figures go out through the consumer
            self.reporter.close()
        if self.consumer is not None:
            self.consumer.close(refused=lambda exc: log.warning("an ack was refused: %s", exc))
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
            self.source = StepSource(spec, self.consumer.tq, t, self.consumer.keeper,
                                     self.stop, self.lineage,
                                     health=self.critic.check if self.critic else None,
                                     draw=self._draw_replacements,
                                     idle=self.reference,
                                     reference=self.local_reference,
                                     spans=self.spans, claimers=self.claimers)
        samples: list[Sample] = []
        train_spans: list[tuple[float, float]] = []
        figures = []  # each micro-step's, on the device: read back once, at the step's end
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
                figures.append(micro_step(policy, shard, t, self.tok, spec,
                                          last=(j == micro_batches - 1)))
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
            self.published_at[self.version] = time.time()
            # what a later step's release can still name (v = t − maxStaleness)
            self.published_at.pop(self.version - self.rule.max_staleness - 2, None)
            sums, off_policy = step_figures(figures, policy.data_world)
            self._report(t, samples, train_spans, time.time() - t_wall, sums, off_policy,
                         grad_norm)
        if self.version % spec.trainer.checkpoint_every == 0 or self.version == self.steps:
            self.checkpoint()
        return True

    @functools.cached_property
    def announced(self) -> list[dict] | None:
        """The schemas the job's prompts announce (rollout.tools), listed the first
        time a replacement prompt needs them (an MCP server starts for it)."""
        return announced(self.spec.rollout)

    def _draw_replacements(self, step: int, groups: list[int]) -> None:
        """filterGroups: put the prompts of replacement groups of `step` into its
        partition (workflow/dynamic_sampling.py draws them by seed, step and group)."""
        algo = self.spec.algorithm
        if self.examples is None:
            self.examples = load_examples(self.spec.dataset)
        picks = [self.examples[replacement_example(len(self.examples), algo.seed, step, g)]
                 for g in groups]
        columns = prompt_columns(self.tok, picks, algo.group_size, groups, self.announced)
        rows = len(columns["slot"])
        columns["released_at"] = [time.time()] * rows
        ride_out(lambda: self.consumer.tq.put(step, columns, group_size=algo.group_size,
                                              lengths=[len(x) for x in columns["prompt_ids"]]),
                 away=warn(log, "drawing replacement prompts: transferqueue unavailable (%s); "
                                "putting them again"))

    def _next_micro_batch(self):
        """Rank 0's next micro-batch of samples ("stop" when asked to stop), the
        same on every rank."""
        try:
            chunk = self.source.next_micro_batch() if self.rank == 0 else None
        except Stopped:
            chunk = "stop"
        return broadcast_object(chunk) if self.world > 1 else chunk

    def _report(self, t: int, samples: list[Sample], train_spans, wall: float, sums: dict,
                off_policy: OffPolicyStats, grad_norm) -> None:
        """Rank 0: a step's figures to the sinks (metrics.jsonl, Prometheus,
        TensorBoard, W&B) and the job's to the controller (the operator's status),
        made and sent from the reporter's thread while the next step runs (what
        this step's source and critic hold is taken now)."""
        algo = self.spec.algorithm
        lanes = self.source.lanes.figures() if algo.filter_groups else {}
        if lanes.get("groups_filled"):
            log.warning("step %d: %d of its %d groups are trained without a "
                        "signal (all rewards equal): no group with one came up in "
                        "the %d prompts algorithm.maxPromptsPerStep allows (%d "
                        "replacements drawn)", t + 1, lanes["groups_filled"],
                        algo.step_prompts, algo.prompt_cap, lanes["extra_prompts"])
        rows = {"rows_claimed": self.source.rows_claimed,
                "rows_regenerated": self.source.rows_regenerated,
                "rows_reclaimed": self.source.rows_reclaimed}
        critic = critic_metrics(samples, self.critic) if self.critic is not None else {}
        version = self.version
        # the step's release: the weights it may be generated by (v = t − maxStaleness)
        released = self.published_at.get(t - self.rule.max_staleness, 0.0)

        def figures() -> tuple[dict, int]:
            m = step_metrics(t, samples, train_spans, wall, sums, released,
                             self.spec.workflow.interrupt_cache == "keep")
            m |= off_policy_figures(off_policy)
            m |= lanes
            m["grad_norm"] = grad_norm
            return m | rows | critic, version

        # sync and periodic: the figures are made once the replicas hold the new
        # weights. The next step is released only then, through this process's weight
        # service (the replicas' fetch and report, the driver's wait), whose threads
        # the figures' Python held up (docs/benchmarks/overhead.md). The next step cannot end
        # sooner, so they never fall behind; async trains on meanwhile and makes them
        # at once, and after the last step, or with no replica live, nothing is released.
        wait = self.spec.workflow.mode != "async" and version < self.steps
        self.reporter.submit(figures, after=(
            (lambda: self.sender.wait_replicas(version, timeout=REPLICAS_WAIT, live=True))
            if wait else None))

    def checkpoint(self) -> None:
        """Checkpoint the current version, then ack the rows it holds (rank 0: once
        the figures of its steps are written, so none is missing after a restart
        from it)."""
        if self.reporter is not None:
            self.reporter.flush()
        commit(self.run_dir, self.version, self.policy, self.opt, self.rank, self.world,
               self.consumer, self.uncommitted, self.lineage)
        self.uncommitted, self.checkpointed = [], self.version


def run_trainer(spec: RLJobSpec, tq_address: str, weights_listen: str, rank: int = 0,
                world: int = 1, master: str = local_address(MASTER_PORT),
                run_dir: Path | None = None,
                resume: bool = False, max_steps: int | None = None,
                metrics_port: int | None = None, local_rank: int = 0) -> None:
    """`rljob worker trainer`: one rank until maxSteps or SIGTERM."""
    worker = TrainerWorker(spec, tq_address, weights_listen, rank, world, master, run_dir,
                           resume, max_steps, metrics_port, local_rank)
    try:
        worker.setup()
        settle_heap()  # the model, its engine and clients live as long as the process
        worker.run()
    except WarmupStopped as exc:  # SIGTERM before the first RL step: nothing to keep
        log.info("%s: exiting, no RL step trained, no checkpoint", exc)
    finally:
        worker.close()


def drain(tensors) -> None:
    """A non-sending rank's part of a collective `hf_tensors` (its gathers)."""
    for _ in tensors:
        pass


def _start_critic(spec, tok, state, torch_device, tq_address, run, start, steps, resume,
                  spans=None):
    """ppo: the critic (critic.py) on this rank's device, from the policy's weights
    (`state`: Hugging Face names, after warm-up) or its own checkpoint."""
    from .critic import Critic

    lm = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=torch.float32)
    lm.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    critic = Critic.restore(spec, lm, torch_device, TransferQueueClient(tq_address),
                            tok.pad_token_id, run, start=start, resume=resume, spans=spans)
    log.info("critic: scoring from step %d on %s", critic.version + 1, torch_device)
    return critic.start(steps)
