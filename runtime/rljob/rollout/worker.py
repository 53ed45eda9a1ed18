"""The rollout worker (`rljob worker rollout`): claims prompt groups, generates,
scores, writes experience back, and keeps its weights current.

At every generation-iteration boundary it takes the newest weights: with
`weightSync: async` they were received in the background into host memory and
only the swap happens here (AsyncFlow's delayed parameter update); with `sync`
it fetches them now, generation waiting. A worker that joins mid-run loads
the latest version before its first generation."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, replace

import numpy as np

from ..api.spec import RLJobSpec
from ..environments import environment_factory
from ..tools.catalog import job_tools
from ..infra.cores import CoreShare, computing
from ..infra.device import activate, cores_given, resolve as resolve_device
from ..inputs.models import build_model, load_tokenizer
from ..reward import get_reward, score_all
from ..sampling import TokenDistribution
from ..trainer.reference import ReferenceFromRunDir, ReferenceWork, replicas_take_it
from ..infra.heap import settle_heap
from ..infra.rundir import RunDir
from ..infra.timeline import SpanLog
from ..infra.torchprof import StepProfiler
from ..infra.worker_metrics import WorkerMetrics
from ..transferqueue import Batch
from ..transferqueue.consumer import Consumer, ride_out, warn
from ..transferqueue.dataplane import TransferQueueError
from ..weights import WeightReceiver
from ..weights.adapter import AdapterMerge
from ..weights.collective import BACKENDS
from ..workflow.dispatch import rollout_claim_policy
from ..workflow.release import ReleaseRule
from ..workflow.tasks import (ROLLOUT_READS, interrupting, reward_task, rollout_batch_rows,
                              tasks_for)
from . import vllm_engine  # noqa: F401 - registers rollout.engine vllm
from .engine import SamplingParams, make_engine
from .episodes import Episode, episode_record, run_episodes, summary

log = logging.getLogger("rljob.rollout")
# seconds a parked replica's reference claim waits at most (the prompts' claim, when
# it is answered, ends it sooner)
REFERENCE_WAIT = 0.5
# steps past its release bound a replica generating a batch at a time claims (the hf
# engine's loop): it holds the next step's prompts when the weights that may generate
# them come, so the claim's answer is off the path from the trainer's publish to the
# next generation
AHEAD = 1
# seconds the weight receiver's thread waits, after a swap that lets the loop generate
# its held batch, for that generation to start before it goes on (the bound, its report
# to the trainer, the next fetch): their Python, under the process's one GIL, held up the
# loop's wake by about a millisecond
SWAP_YIELD = 0.005


class RolloutWorker:
    """One rollout replica: `setup()` builds the engine, joins the weight service and
    TransferQueue; `run()` claims, generates, scores and writes until SIGTERM (a batch
    at a time with the hf engine, groups in flight with a concurrent one); `close()`
    lets go of everything. `claim`, `score` and `write` are the steps both loops share."""

    ahead = 0  # steps past the release bound its claims take (AHEAD in the batched loop)

    def __init__(self, spec: RLJobSpec, tq_address: str, weights_address: str, replica: int,
                 run_dir=None, metrics_port: int | None = None):
        self.spec, self.replica = spec, replica
        self.tq_address, self.weights_address = tq_address, weights_address
        self.name = f"rollout-{replica}"
        self.stop = threading.Event()
        self.spans = SpanLog(run_dir, self.name)
        self.metrics = WorkerMetrics(self.name, metrics_port)
        g = self.g = spec.algorithm.group_size
        self.claim_rows = rollout_batch_rows(spec.algorithm.samples_per_step, g,
                                             spec.rollout.replicas, spec.rollout.max_num_seqs,
                                             spec.workflow.mode)
        self.params = SamplingParams(n=g, max_new_tokens=spec.rollout.max_new_tokens,
                                     temperature=spec.rollout.temperature,
                                     top_p=spec.rollout.top_p)
        self.wait_weights = spec.workflow.weight_sync == "sync"
        self.interrupting = interrupting(spec)
        self.claim_policy = rollout_claim_policy(spec.rollout.dispatch, replica,
                                                 spec.rollout.replicas)
        self.engine = self.receiver = self.consumer = self.cores = None
        self.reference = None  # this replica's share of the reference task
        self.run_dir = run_dir
        # torch's profiler over the steps `rljob run --torch-profile` names (hf engine)
        self.profiler = StepProfiler.from_env(run_dir, self.name)
        self.logged_swaps = 0
        self.rule = ReleaseRule.of(spec)
        self._bound_lock = threading.Lock()  # bounds go out in the versions' order
        self._sent_bound: int | None = None
        # a claimed batch of a step ahead of the weights' bound, kept until weights
        # that may generate it come (`ReleaseRule.verdict` "hold"), with the newest
        # (version, epoch) published at its claim; a swap completes `_swapped`, armed
        # while the loop waits for one
        self._held: tuple[Batch, tuple[int, int]] | None = None
        self._swapped: Future | None = None
        self._started = threading.Event()  # clear from a swap's wake to its generation
        self._started.set()

    # ---- life -----------------------------------------------------------------
    def setup(self) -> RolloutWorker:
        import torch

        spec = self.spec
        torch.set_num_threads(cores_given())  # the cores this worker was given
        sys.setswitchinterval(0.0005)  # the weight receiver thread swaps in promptly
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        self.tok = load_tokenizer(spec.model)
        accelerator = spec.accelerator_for("rollout").type
        model = None
        if spec.rollout.engine == "hf":  # vLLM places itself
            dtype = torch.float32 if accelerator == "cpu" else None
            device = activate(resolve_device(accelerator,
                                             int(os.environ.get("LOCAL_RANK", "0"))))
            model = build_model(spec.model, self.tok, seed=spec.algorithm.seed,
                                dtype=dtype).to(device)
        if spec.rollout.engine == "vllm" and accelerator == "cpu":
            # vLLM's CPU build takes its KV cache from host memory (GiB); it sizes it
            # itself on accelerators
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self.engine = make_engine(spec.rollout.engine, spec.model, spec.rollout, self.tok,
                                  model, accelerator, spec.algorithm.seed)
        if self.interrupting:  # an update stops generation at a token boundary
            self.engine.interruptible(keep=spec.workflow.interrupt_cache == "keep")
        if spec.rollout.episodic:  # episodes: the environment's class, one per episode
            self.make_env = environment_factory(spec.rollout.environment,
                                                job_tools(spec.rollout),
                                                spec.rollout.tool_parser)
        # a local run: the cores of a trainer that waits are lent to generation
        self.cores = CoreShare.open(self.run_dir, self.name) if model is not None else None
        if self.cores is not None:
            self.cores.hook(model)
        if model is not None and self.run_dir is not None and replicas_take_it(spec):
            # a local run: while parked, this replica computes reference log-probs
            # (trainer/reference.py) from the weights the trainer writes
            def reference_model():
                return build_model(spec.model, self.tok, seed=spec.algorithm.seed,
                                   dtype=torch.float32)

            self.reference = ReferenceWork(
                self.tq_address, ReferenceFromRunDir(RunDir.of(self.run_dir).reference,
                                                     reference_model),
                self.tok.pad_token_id, TokenDistribution.of(spec.rollout, len(self.tok)),
                rows=32, compute=lambda: computing(self.cores),
                spans=self.spans)
        self.reward_fn = get_reward(spec.reward.name)  # a file's path is absolute here
        self.streamed = reward_task(spec)  # reward.url, .model: the reward replicas score
        lora = spec.model.lora  # its updates are the adapter: merged for an engine
        merge = (AdapterMerge(lora.rank, lora.alpha)  # that loads whole weights only
                 if lora is not None and not self.engine.takes_adapter else None)
        self.receiver = WeightReceiver(self.weights_address, self.name,
                                       spec.workflow.weight_sync, spec.weight_transport,
                                       BACKENDS[accelerator], merge)
        with self.spans.span("weight-sync", -1):
            self.receiver.load_latest(self.engine, 0)  # joining: the newest version first
        self.receiver.start_background(self.engine)
        self.consumer = Consumer.join(self.tq_address, tasks_for(spec))
        # the release: this replica's claims take a step's prompts once the weights it
        # holds may generate them (v >= step - maxStaleness), moved at each swap
        self.receiver.on_swap = self._on_swap
        self._rebound()
        if self.consumer.released:  # rows an earlier life of this replica held
            log.info("gave back %d rows an earlier %s held", self.consumer.released, self.name)
        if self.claim_policy != "group":
            log.info("rollout.dispatch %s: claiming %s", spec.rollout.dispatch,
                     self.claim_policy)
        return self

    def run(self) -> None:
        (self._run_streaming if self.engine.concurrent else self._run_batched)()

    def close(self) -> None:
        self.profiler.close()
        if self.engine is not None and self.engine.concurrent:
            self.engine.close()
        if self.receiver is not None:
            self.receiver.stop()
        if self.reference is not None:
            self.reference.close()
        if self.consumer is not None:
            self.consumer.close()
        self.spans.close()

    def _on_swap(self) -> None:
        """In the weight receiver's thread, after each swap: a held batch's verdict may
        have changed, so `_swapped` wakes the loop waiting for it, whose generation
        starts before this thread goes on (`SWAP_YIELD`); then the bound moves."""
        with self._bound_lock:
            woke = self._swapped is not None and not self._swapped.done()
            if woke:
                self._started.clear()
                self._swapped.set_result(None)
        if woke:
            self._started.wait(SWAP_YIELD)
        self._rebound()

    def _rebound(self) -> None:
        """Claims of prompts up to the last step the weights this replica holds may
        generate (`ReleaseRule.last_step`), and `ahead` steps past it while no batch of
        those is held; the waiting claim looks again under it. Called at each swap
        (`_on_swap`) and when a batch is held or let go."""
        with self._bound_lock:
            last = self.rule.last_step(self.receiver.version)
            held = self._held[0].rows[0].partition if self._held is not None else None
            bound = last if held is not None and held > last else last + self.ahead
            if bound == self._sent_bound:
                return
            try:
                self.consumer.tq.bound("rollout", bound)
                self._sent_bound = bound
            except ValueError:  # close() closed the channel: no more claims
                pass

    def _verdict(self, batch: Batch) -> str:
        """`ReleaseRule.verdict` of a claimed batch with the weights held now."""
        return self.rule.verdict(batch.rows[0].partition, self.receiver.version, self.ahead)

    def _hold(self, claimed: tuple[Batch, tuple[int, int]] | None) -> None:
        """Keep a batch of a step ahead (its lease kept alive), or let go of the held
        one; the bound follows (`_take_held` arms `_swapped` while it waits)."""
        with self._bound_lock:
            self._held, self._swapped = claimed, None
        self._rebound()

    def _take_held(self) -> tuple[Batch, tuple[int, int]] | None:
        """The held batch once the weights may generate it; given back once the bound
        fell below it (a trainer restarted from an older checkpoint); else None, with
        `_swapped` armed for the next swap."""
        with self._bound_lock:
            if self._held is None:
                return None
            verdict = self._verdict(self._held[0])
            if verdict == "hold":
                if self._swapped is None or self._swapped.done():
                    self._swapped = Future()
                return None
            claimed = self._held
            if verdict == "now":
                # the bound is the same without it (its step <= last); the swap's
                # `_rebound` moves it once this batch's generation has started
                self._held, self._swapped = None, None
                return claimed
        self._hold(None)
        log.info("step %d's held rows go back: weights %d cannot generate them",
                 claimed[0].rows[0].partition, self.receiver.version)
        self._give_back([claimed[0]])
        self.metrics.given_back.inc(len(claimed[0].rows))
        return None

    # ---- the steps both loops share ------------------------------------------
    def claim(self, rows: int | None = None) -> tuple[Batch, tuple[int, int]]:
        """The next groups, and (weightSync sync) the newest (version, epoch) published
        then."""
        tq = self.consumer.tq
        # one step's rows: a batch is generated with one step's weights and seeds
        batch = ride_out(lambda: tq.claim_get("rollout", rows or self.claim_rows, ROLLOUT_READS,
                                              policy=self.claim_policy, wait=0.5,
                                              min_count=self.g, one_partition=True),
                         away=warn(log), stop=self.stop, once=True)
        if batch is None:  # the controller was away
            return Batch("rollout", "", []), (-1, 0)
        if batch.rows:
            self.consumer.keeper.hold(batch)  # generation may outlast the lease
            self.spans.claimed(batch, batch.rows[0].partition)
        if (not (batch.rows and self.wait_weights) or self.holds_step(batch)
                or self._verdict(batch) == "hold"):  # held: generated at a swap to newer
            return batch, (-1, 0)
        return batch, self.receiver.latest()

    def holds_step(self, batch: Batch) -> bool:
        """sync and periodic: whether this replica holds the weights of the batch's step
        (v = step). Its claim took the step's rows because it held them (the release
        bound), and nothing newer is published before the step is trained, so they are
        the newest: no need to ask the trainer (a round trip on the path from the claim
        to generation, 3.2 ms a claim in a sync run on 2 cores; `latest`)."""
        return (self.spec.workflow.mode != "async"
                and self.receiver.holds(batch.rows[0].partition))

    def score(self, batch: Batch, first: int, samples: list) -> tuple[list[str], list]:
        """The texts `samples` are scored on and their rewards (reward.name's, an
        episode's environment reward added), generated for the batch's rows from
        `first` on."""
        # an episode's: the turns its environment says the reward scores
        texts = [x.text if isinstance(x, Episode) else self.tok.decode(x.response_ids)
                 for x in samples]
        rows = range(first, first + len(samples))
        scored = score_all(self.reward_fn, [batch.data["prompt"][i] for i in rows], texts,
                           [batch.data["answer"][i] for i in rows],
                           [batch.data["extra"][i] for i in rows])
        # an episode's own rewards (its environment's, per turn) add to the job's
        scored = [replace(s, score=s.score + x.env_reward) if isinstance(x, Episode) else s
                  for s, x in zip(scored, samples)]
        errors = [x.error for x in scored if x.error]
        if errors:
            log.warning("reward failed for %d of %d samples: %s", len(errors), len(samples),
                        errors[0])
        return texts, scored

    def score_and_write(self, batch: Batch, first: int, flat: list, version: int, epoch: int,
                        span: tuple[float, float], indices: list[int] | None = None,
                        last: bool = True, calls: list[dict] = ()) -> None:
        """In the writer thread: a slow reward (a remote verifier) delays the write of
        its own samples, not the next generation."""
        self.write(batch, flat, self.score(batch, first, flat), version, epoch, span,
                   indices, last, calls)

    def reward_columns(self, texts: list[str], scored: list) -> dict[str, list]:
        """The rule's scores as the table takes them: the reward itself, or, where the
        reward is a task of its own (reward.url, reward.model), the rule's score and the
        text the reward replicas score."""
        if self.streamed:
            return {"rule_reward": [s.score for s in scored],
                    "rule_error": [s.error for s in scored], "response_text": list(texts)}
        return {"reward": [s.score for s in scored], "reward_error": [s.error for s in scored]}

    def write(self, batch: Batch, flat: list, scored: tuple[list[str], list], version: int,
              epoch: int, span: tuple[float, float], indices: list[int] | None = None,
              last: bool = True, calls: list[dict] = ()) -> None:
        """Publish generated rows (`indices`, default the whole batch) under their
        lease (fenced), acked by the same notify; `last`: the batch's keep-alive ends; `calls`:
        the engine calls that generated them (on the first row). A lease that
        expired meanwhile (this replica was paused or cut off) has given the rows to
        another replica: the controller refuses the write and the work is dropped."""
        if last:
            self.consumer.keeper.drop(batch)
        indices = batch.indices if indices is None else indices
        episodes = {}
        if self.spec.rollout.episodic:  # the model's tokens 1, the observations' 0
            episodes = {"loss_mask": [np.asarray(x.loss_mask, np.uint8) for x in flat],
                        "episode": [episode_record(x) for x in flat]}
        # each sample's versions: its tokens' where the engine recorded them (an
        # interrupted one has several); the row's version is its first token's
        changes = [list(x.versions) if x.versions else [(0, version, epoch)] for x in flat]
        if self.interrupting:
            episodes["weight_versions"] = [[list(c) for c in cs] for cs in changes]
        t0 = time.time()
        try:
            self.consumer.tq.write(indices, {**episodes,
                "response_ids": [np.asarray(x.response_ids, np.int32) for x in flat],
                "rollout_logp": [np.asarray(x.logprobs, np.float32) for x in flat],
                **self.reward_columns(*scored),
                "started_at": [span[0]] * len(flat),
                "finished_at": [span[1]] * len(flat),
                "weights_epoch": [cs[0][2] for cs in changes],
                "gen_calls": [list(calls)] + [[] for _ in flat[1:]],
            }, versions=[cs[0][1] for cs in changes], length_column="response_ids",
                lease=batch, ack=True)
            self.spans.add("write", t0, time.time(), batch.rows[0].partition)
        except TransferQueueError as exc:
            log.warning("dropped %d generated samples of step %d: %s", len(flat),
                        batch.rows[0].partition, exc)
            self.metrics.dropped.inc(len(flat))

    def _wait_weights(self, latest: tuple[int, int], step: int) -> None:
        """weightSync sync: until the weights published when the batch was claimed are
        loaded (a "weight-wait" span where it waits: none where they are, so the loop
        makes no write of its own between two generations)."""
        if self.receiver.holds(*latest):
            return
        with self.spans.span("weight-wait", step):
            self.receiver.wait_version(latest[0], epoch=latest[1])

    def _tick(self, inflight_rows: int = 0) -> None:
        """Each loop turn: record the weight swaps since the last turn, and the gauges."""
        self.logged_swaps = _log_swaps(self.receiver, self.spans, self.metrics,
                                       self.logged_swaps)
        self.metrics.version.set(self.receiver.version)
        self.metrics.inflight.set(inflight_rows)

    def _count(self, samples: list, step: int) -> None:
        self.metrics.samples.inc(len(samples))
        self.metrics.tokens.inc(sum(len(x.response_ids) for x in samples))
        episodes = [x for x in samples if isinstance(x, Episode)]
        for e in episodes:  # each tool call on the timeline, the episodes' series
            for t0, t1 in e.tool_spans:
                self.spans.add("tool", t0, t1, step)
        if episodes:
            self.metrics.count_episodes([episode_record(e) for e in episodes],
                                        [len(e.response_ids) for e in episodes])
            errors = [e.error for e in episodes if e.error]
            if errors:  # an environment that raised: its episode ended there
                log.warning("%d of %d episodes of step %d ended on an environment error: %s",
                            len(errors), len(episodes), step, "; ".join(sorted(set(errors))[:3]))

    def beyond_bound(self, batch: Batch, before_waiting: Callable[[], None] = lambda: None
                     ) -> bool:
        """Whether the batch's step is beyond what the weights this replica holds may
        train and the steps its claims take ahead (`ReleaseRule.verdict` "back": after a
        trainer restart from an older checkpoint, rows released by its dead life). Such
        rows go back to the queue at once, and the replica waits a moment for newer
        weights; generated now, the trainer would refuse them and have them made again."""
        if self.spec.workflow.mode != "async" or not batch.rows:
            return False
        step = batch.rows[0].partition
        if self.rule.verdict(step, self.engine.version, self.ahead) != "back":
            return False
        log.info("step %d's rows go back: weights %d cannot train them within "
                 "maxStaleness %d", step, self.engine.version, self.rule.k)
        self._give_back([batch])
        self.metrics.given_back.inc(len(batch.rows))
        before_waiting()
        self.receiver.wait_version(self.engine.version + 1, timeout=1.0)
        return True

    def _give_back(self, batches) -> None:
        """Rows claimed but not generated go back to the queue at once (shutting down)."""
        for batch in batches:
            self.consumer.keeper.drop(batch)
            try:
                self.consumer.tq.release(batch)
            except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires
                log.warning("could not release a claimed batch: %s", exc)

    # ---- hf: a batch at a time -------------------------------------------------
    def _run_batched(self) -> None:
        """The I/O of a generation overlaps the next one: one claim is in flight while
        a batch generates, and its results are written while the next generates (the
        write and the next claim start once the next generation is about to, or before
        the loop waits: their Python does not hold up the next generation's start).
        The claims take the next step's prompts too (`AHEAD`): a batch of them is held
        until a swap brings weights that may generate it, the claims meanwhile bounded
        by the weights held (rows the current step still needs: a replacement group,
        rows a dead replica held)."""
        g, spec = self.g, self.spec
        self.ahead = AHEAD
        self._rebound()
        io = ThreadPoolExecutor(2, thread_name_prefix="rljob-rollout-io")
        ahead = io.submit(self.claim)
        written: Future | None = None
        unwritten: tuple | None = None  # a generation's samples, their write not started

        def write() -> None:
            nonlocal written, unwritten
            if unwritten is not None:
                if written is not None:
                    written.result()  # one write in flight at most; a refusal surfaces here
                written, unwritten = io.submit(self.score_and_write, *unwritten), None

        try:
            while not self.stop.is_set():
                claimed = self._take_held()
                claim_next = False
                if claimed is None:
                    if not ahead.done():
                        write()  # the loop waits: the write goes first
                    self._tick()
                    claimed = self._await_claim(ahead, self._swapped)
                    if claimed is None:  # a swap: the held batch's verdict again
                        continue
                    if claimed[0].rows and self._verdict(claimed[0]) == "hold":
                        # nothing to generate before a swap: the samples' write first
                        # (the step's path), this bookkeeping and the next claim after
                        write()
                        if written is not None:
                            wait([written])
                        if self._held is None:
                            self._hold(claimed)  # before the next claim: its bound
                        else:  # one held at a time (the bound stops a second)
                            self._give_back([claimed[0]])
                        claimed = None
                    if claimed is None:
                        ahead = io.submit(self.claim)
                        continue
                    claim_next = True
                batch, latest = claimed
                if not batch.rows or self.beyond_bound(batch, before_waiting=write):
                    if claim_next:
                        ahead = io.submit(self.claim)
                    continue
                if self.wait_weights:  # generation waits for the newest weights
                    if not self.receiver.holds(*latest):
                        write()  # before the wait
                    self._wait_weights(latest, batch.rows[0].partition)
                step = batch.rows[0].partition
                self.profiler.at(step + 1)  # metrics.jsonl's step
                firsts = list(range(0, len(batch.rows), g))
                # one seed per (step, group): a group's samples do not depend on which
                # replica draws them or what else is in its batch
                seeds = tuple(_seed(spec, step, batch.data["slot"][i] // g) for i in firsts)
                prompts = [batch.data["prompt_ids"][i].tolist() for i in firsts]
                # drain: weights swap between generations, not in one; interrupt: the
                # engine lets an update in at its next token boundary
                hold = contextlib.nullcontext() if self.interrupting else self.receiver.lock
                write()  # the last generation's, scored and written while this one runs
                if claim_next:  # the next batch's, answered while this one generates
                    ahead = io.submit(self.claim)
                self._started.set()  # the swap's thread goes on
                with hold, computing(self.cores):
                    t0 = time.time()  # the weights held: a swap in progress is over
                    version, epoch = self.engine.version, self.receiver.epoch
                    params = replace(self.params, seeds=seeds)
                    groups = (self._episodes(batch, firsts, prompts, params)
                              if spec.rollout.episodic else self.engine.generate(prompts, params))
                flat = [x for group in groups for x in group]
                done = time.time()
                calls = [asdict(c) for c in self.engine.take_timings()]
                self.spans.add("generate", t0, done, step, {
                    "calls": calls, "version": version,
                    **({"episodes": summary(flat)} if spec.rollout.episodic else {})})
                unwritten = (batch, 0, flat, version, epoch, (t0, done), None, True, calls)
                self._count(flat, step)
                self._tick()
        finally:
            try:
                write()
                if written is not None:
                    written.result()
            except Exception as exc:  # noqa: BLE001 - shutting down: the rows' lease expires
                log.warning("the last write was refused: %s", exc)
            if self._held is not None:  # a step ahead, never generated: back at once
                self._give_back([self._held[0]])
                self._held = None
            try:  # the claim in flight: its rows go back to the queue at once
                unused, _ = ahead.result()
                self._give_back([unused] if unused.rows else [])
            except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires
                log.warning("could not release a claimed batch: %s", exc)
            io.shutdown()

    def _episodes(self, batch: Batch, firsts: list[int], prompts: list[list[int]],
                  params: SamplingParams) -> list[list[Episode]]:
        """Each group's episodes: the model's turns and its environment's replies."""
        return run_episodes(self.engine, self.tok, prompts, [_row(batch, i) for i in firsts],
                            params, self.make_env, self.spec.rollout.max_turns,
                            self.spec.rollout.max_new_tokens)

    def _await_claim(self, ahead: Future, swapped: Future | None = None):
        """The claim in flight, or None once `swapped` (a held batch's swap) came
        first; while it waits (parked by the staleness bound, or holding a step
        ahead), the reference task's rows. A reference claim of its own waits beside
        it, so the prompts start the next generation the moment they come (a reference
        claim that polled held it up to the poll's length), and the controller is not
        asked again and again while nothing comes; once the prompts came, one wake ends
        that claim (whatever it brings afterwards goes back)."""
        self._started.set()  # nothing to start: a swap's thread need not wait
        watch = [ahead] if swapped is None else [swapped, ahead]
        if self.reference is None:
            wait(watch, return_when=FIRST_COMPLETED)
            return None if watch[0] is swapped and swapped.done() else ahead.result()
        pending: Future | None = None
        try:
            while not self.stop.is_set():
                since = self.reference.mark()  # before looking: the wake comes after it
                if any(f.done() for f in watch):
                    break
                if pending is None:
                    pending = self.reference.claim(wait=REFERENCE_WAIT, since=since)
                wait([*watch, pending], return_when=FIRST_COMPLETED)
                if pending.done():
                    claimed, pending = pending, None
                    if not self.reference.work(claimed.result()):
                        # woken (the prompts came), out of time, or no reference yet
                        wait(watch, timeout=0.02, return_when=FIRST_COMPLETED)
        finally:
            if pending is not None:
                self.reference.abandon(pending)
        if (swapped is not None and swapped.done()) or not ahead.done():
            return None  # a swap first; or stopping (the claim's rows go back after)
        return ahead.result()

    # ---- a concurrent engine (vLLM): groups in flight ---------------------------
    def _run_streaming(self) -> None:
        """Keep up to `claim_rows` rows' groups in flight, claim more as groups
        finish, and write each group the moment it is generated. Weight updates
        happen inside the engine: with weightUpdate drain between generations (it
        drains the groups in flight first), so every group comes back with the one
        version that generated it; with interrupt midway, each sample with the
        versions of its tokens."""
        g, spec = self.g, self.spec
        io = ThreadPoolExecutor(1, thread_name_prefix="rljob-rollout-claim")
        writer = ThreadPoolExecutor(1, thread_name_prefix="rljob-rollout-write")
        inflight: dict[Future, tuple[Batch, int, float]] = {}  # group → (batch, row, t0)
        left: dict[str, int] = {}  # a batch's lease → its groups not yet written
        held: dict[str, Batch] = {}
        ahead: Future | None = None
        written: list[Future] = []
        try:
            while not self.stop.is_set():
                self._tick(len(inflight) * g)
                free = self.claim_rows - len(inflight) * g
                if ahead is None and free >= g:
                    ahead = io.submit(self.claim, free)
                done, _ = wait([*inflight, *([ahead] if ahead else [])], timeout=0.5,
                               return_when=FIRST_COMPLETED)
                if ahead is not None and ahead.done():
                    batch, latest = ahead.result()
                    ahead = None
                    if batch.rows and not self.beyond_bound(batch):
                        if self.wait_weights:  # generation waits for the newest weights
                            self._wait_weights(latest, batch.rows[0].partition)
                        step = batch.rows[0].partition
                        t0 = time.time()
                        for first in range(0, len(batch.rows), g):
                            seed = _seed(spec, step, batch.data["slot"][first] // g)
                            prompt = batch.data["prompt_ids"][first].tolist()
                            fut = (self.engine.submit_episodes(
                                prompt, _row(batch, first), self.params, seed, self.make_env,
                                spec.rollout.max_turns, spec.rollout.max_new_tokens)
                                if spec.rollout.episodic
                                else self.engine.submit(prompt, self.params, seed))
                            inflight[fut] = (batch, first, t0)
                        # sequences in flight beside each of these groups
                        sharing = len(inflight) * g
                        left[batch.lease], held[batch.lease] = len(batch.rows) // g, batch
                for fut in [f for f in done if f in inflight]:
                    batch, first, t0 = inflight.pop(fut)
                    group, version, epoch = fut.result()
                    finished = time.time()
                    lengths = [len(x.response_ids) for x in group]
                    prompt = len(batch.data["prompt_ids"][first])
                    # continuous batching: the group's sequences decoded among about
                    # `sharing` others; its seconds include its prefill and queueing
                    calls = [{"rows": sharing, "prompt_tokens": prompt * g,
                              "output_tokens": sum(lengths), "steps": max(lengths, default=0),
                              "prefill_seconds": 0.0, "decode_seconds": finished - t0,
                              "concurrent": True}]
                    step = batch.rows[0].partition
                    self.spans.add("generate", t0, finished, step, {
                        "calls": calls, "version": version,
                        **({"episodes": summary(group)} if spec.rollout.episodic else {})})
                    left[batch.lease] -= 1
                    last = left[batch.lease] == 0
                    if last:
                        del left[batch.lease], held[batch.lease]
                    for w in [w for w in written if w.done()]:
                        w.result()  # a failed write surfaces here
                    written = [w for w in written if not w.done()]
                    written.append(writer.submit(  # scored and written off this loop
                        self.score_and_write, batch, first, group, version, epoch,
                        (t0, finished), batch.indices[first:first + g], last, calls))
                    self._count(group, step)
        finally:
            writer.shutdown(wait=True)  # what was generated is written
            # groups in flight and a claim in flight: their rows go back to the queue
            if ahead is not None:
                try:
                    batch, _ = ahead.result()
                    if batch.rows:
                        held[batch.lease] = batch
                except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires
                    log.warning("a claim in flight failed: %s", exc)
            io.shutdown()
            self._give_back(held.values())


def run_rollout(spec: RLJobSpec, tq_address: str, weights_address: str, replica: int,
                run_dir=None, metrics_port: int | None = None) -> None:
    """`rljob worker rollout`: one replica until SIGTERM."""
    worker = RolloutWorker(spec, tq_address, weights_address, replica, run_dir, metrics_port)
    try:
        worker.setup()
        settle_heap()  # the model, its engine and clients live as long as the process
        worker.run()
    finally:
        worker.close()


def _log_swaps(receiver, spans, metrics, logged: int) -> int:
    """Record the weight swaps since the first `logged` ones (timeline spans and
    histograms); return how many are recorded now."""
    for (t0, t1, v), drain, transfer, nbytes in zip(receiver.swap_seconds[logged:],
                                                    receiver.drain_seconds[logged:],
                                                    receiver.transfer_seconds[logged:],
                                                    receiver.update_bytes[logged:]):
        spans.add("weight-sync", t0, t1, v)
        metrics.weight_swap.observe(t1 - t0)
        metrics.weight_drain.observe(drain)
        metrics.weight_transfer.observe(transfer)
        metrics.weight_bytes.inc(nbytes)
    return len(receiver.swap_seconds)


def _row(batch: Batch, i: int) -> dict:
    """Row `i`'s dataset row, as an environment starts from it."""
    d = batch.data
    return {"prompt": d["prompt"][i], "answer": d["answer"][i], **(d["extra"][i] or {})}


def _seed(spec: RLJobSpec, step: int, group: int) -> int:
    return (spec.algorithm.seed * 1_000_003 + step * 10_007 + group) % (2 ** 31)
