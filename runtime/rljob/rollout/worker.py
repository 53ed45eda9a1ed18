"""The rollout worker (`rljob worker rollout`): claims prompt groups, generates,
scores, writes experience back, and keeps its weights current.

At every generation-iteration boundary it takes the newest weights: with
`weightSync: async` they were received in the background into host memory and
only the swap happens here (AsyncFlow's delayed parameter update); with `sync`
it fetches them now, generation waiting. A worker that joins mid-run loads
the latest version before its first generation."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace

import numpy as np

from ..api.spec import RLJobSpec
from ..device import activate, cores_given, resolve as resolve_device
from ..models import build_model, load_tokenizer
from ..reward import get_reward, score_all
from ..timeline import SpanLog
from ..worker_metrics import WorkerMetrics
from ..transferqueue import Batch, TransferQueueClient
from ..transferqueue.client import TransferQueueError
from ..transferqueue.loader import LeaseKeeper
from ..weights import WeightReceiver
from ..weights.collective import BACKENDS
from ..planner.dispatch import rollout_claim_policy
from ..workflow.tasks import ROLLOUT_READS, rollout_batch_rows, tasks_for
from .engine import SamplingParams, make_engine

log = logging.getLogger("rljob.rollout")


def run_rollout(spec: RLJobSpec, tq_address: str, weights_address: str, replica: int,
                run_dir=None, metrics_port: int | None = None) -> None:
    import torch

    torch.set_num_threads(cores_given())  # the cores this worker was given
    sys.setswitchinterval(0.0005)  # the weight receiver thread swaps in promptly
    name = f"rollout-{replica}"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tok = load_tokenizer(spec.model)
    accelerator = spec.accelerator_for("rollout").type
    dtype = torch.float32 if accelerator == "cpu" else None
    model = None
    if spec.rollout.engine == "hf":  # vLLM places itself
        device = activate(resolve_device(accelerator,
                                         int(os.environ.get("LOCAL_RANK", "0"))))
        model = build_model(spec.model, tok, seed=spec.algorithm.seed, dtype=dtype).to(device)
    if spec.rollout.engine == "vllm" and accelerator == "cpu":
        # vLLM's CPU build takes its KV cache from host memory (GiB); it sizes it itself
        # on accelerators
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = make_engine(spec.rollout.engine, spec.model, spec.rollout, tok, model,
                         accelerator, spec.algorithm.seed)
    reward_fn = get_reward(spec.reward.name)
    spans = SpanLog(run_dir, name)
    metrics = WorkerMetrics(name, metrics_port)

    transport = spec.weight_transport
    receiver = WeightReceiver(weights_address, name, spec.workflow.weight_sync, transport,
                              BACKENDS[accelerator])
    with spans.span("weight-sync", -1):
        receiver.load_latest(engine, 0)  # joining: the newest version first
    receiver.start_background(engine)
    tq = TransferQueueClient(tq_address)
    tq.register(*tasks_for(spec))  # idempotent: whoever comes first declares the job's table
    back = tq.release_consumer()  # rows an earlier life of this replica was generating
    if back:
        log.info("gave back %d rows an earlier %s held", back, name)
    keeper = LeaseKeeper(tq)
    g = spec.algorithm.group_size
    claim_rows = rollout_batch_rows(spec.algorithm.samples_per_step, g, spec.rollout.replicas,
                                    spec.rollout.max_num_seqs, spec.workflow.mode)
    params = SamplingParams(n=g, max_new_tokens=spec.rollout.max_new_tokens,
                            temperature=spec.rollout.temperature, top_p=spec.rollout.top_p)
    wait_weights = spec.workflow.weight_sync == "sync"
    claim_policy = rollout_claim_policy(spec.rollout.dispatch, replica, spec.rollout.replicas)
    if claim_policy != "group":
        log.info("rollout.dispatch %s: claiming %s", spec.rollout.dispatch, claim_policy)

    def claim(rows: int = claim_rows) -> tuple[Batch, tuple[int, int]]:
        """The next groups, and (weightSync sync) the newest (version, epoch) published
        then."""
        try:
            batch = tq.claim_get("rollout", rows, ROLLOUT_READS, policy=claim_policy,
                                 wait=0.5, min_count=g)
        except TransferQueueError as exc:
            if not exc.unavailable:
                raise
            log.warning("transferqueue unavailable (%s); claiming again", exc.code.name)
            stop.wait(0.5)  # it restarts: the session reconnects by itself
            return Batch("rollout", "", []), (-1, 0)
        if batch.rows:
            keeper.hold(batch)  # generation may outlast the lease
        return batch, (receiver.latest() if batch.rows and wait_weights else (-1, 0))

    def write(batch: Batch, flat: list, scored: list, version: int, epoch: int,
              span: tuple[float, float], indices: list[int] | None = None,
              last: bool = True) -> None:
        """Publish generated rows (`indices`, default the whole batch) under their
        lease (fenced), then ack them; `last`: the batch's keep-alive ends. A lease that
        expired meanwhile (this replica was paused or cut off) has given the rows to
        another replica: the controller refuses the write and the work is dropped."""
        if last:
            keeper.drop(batch)
        indices = batch.indices if indices is None else indices
        try:
            tq.write(indices, {
                "response_ids": [np.asarray(x.response_ids, np.int32) for x in flat],
                "rollout_logp": [np.asarray(x.logprobs, np.float32) for x in flat],
                "reward": [s.score for s in scored],
                "reward_error": [s.error for s in scored],
                "started_at": [span[0]] * len(flat),
                "finished_at": [span[1]] * len(flat),
                "weights_epoch": [epoch] * len(flat),
            }, versions=[version] * len(flat), length_column="response_ids", lease=batch)
            tq.ack(batch, indices)
        except TransferQueueError as exc:
            log.warning("dropped %d generated samples of step %d: %s", len(flat),
                        batch.rows[0].partition, exc)
            metrics.dropped.inc(len(flat))

    def score(batch: Batch, first: int, group: list) -> tuple[list, list]:
        texts = [tok.decode(x.response_ids) for x in group]
        rows = range(first, first + len(group))
        scored = score_all(reward_fn, [batch.data["prompt"][i] for i in rows], texts,
                           [batch.data["answer"][i] for i in rows])
        errors = [x.error for x in scored if x.error]
        if errors:
            log.warning("reward failed for %d of %d samples: %s", len(errors), len(group),
                        errors[0])
        return group, scored

    if engine.concurrent:
        try:
            _stream(engine, spec, receiver, keeper, tq, claim, write, score, spans,
                    metrics, stop, claim_rows, wait_weights)
        finally:
            engine.close()
            keeper.close()
            receiver.stop()
            tq.close()
            spans.close()
        return

    # the I/O of a generation overlaps the next one: one claim is in flight while
    # a group generates, and its results are written while the next generates
    io = ThreadPoolExecutor(2, thread_name_prefix="rljob-rollout-io")
    ahead = io.submit(claim)
    written: Future | None = None
    logged_swaps = 0
    try:
        while not stop.is_set():
            logged_swaps = _log_swaps(receiver, spans, metrics, logged_swaps)
            metrics.version.set(receiver.version)
            batch, latest = ahead.result()
            ahead = io.submit(claim)
            if not batch.rows:
                continue
            if wait_weights:
                # generation waits for the newest weights
                receiver.wait_version(latest[0], epoch=latest[1])
            step = batch.rows[0].partition
            firsts = list(range(0, len(batch.rows), g))
            t0 = time.time()
            # one seed per (step, group): a group's samples do not depend on which
            # replica draws them or what else is in its batch
            seeds = tuple(_seed(spec, step, batch.data["slot"][i] // g) for i in firsts)
            prompts = [batch.data["prompt_ids"][i].tolist() for i in firsts]
            with receiver.lock:  # weights swap between generations, never during one
                version, epoch = engine.version, receiver.epoch
                groups = engine.generate(prompts, replace(params, seeds=seeds))
            flat = [x for group in groups for x in group]
            texts = [tok.decode(x.response_ids) for x in flat]
            scored = score_all(reward_fn, batch.data["prompt"], texts, batch.data["answer"])
            done = time.time()
            spans.add("generate", t0, done, step)
            if written is not None:
                written.result()  # one write in flight at most; a refusal surfaces here
            written = io.submit(write, batch, flat, scored, version, epoch, (t0, done))
            metrics.samples.inc(len(flat))
            metrics.tokens.inc(sum(len(x.response_ids) for x in flat))
            errors = [s.error for s in scored if s.error]
            if errors:
                log.warning("reward failed for %d of %d samples: %s", len(errors), len(flat),
                            errors[0])
    finally:
        try:
            if written is not None:
                written.result()
        except Exception as exc:  # noqa: BLE001 - shutting down: the rows' lease expires
            log.warning("the last write was refused: %s", exc)
        try:  # the claim in flight: its rows go back to the queue at once
            unused, _ = ahead.result()
            if unused.rows:
                keeper.drop(unused)
                tq.release(unused)
        except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires instead
            log.warning("could not release a claimed batch: %s", exc)
        io.shutdown()
        keeper.close()
        receiver.stop()
        tq.close()
        spans.close()


def _stream(engine, spec: RLJobSpec, receiver, keeper, tq, claim, write, score, spans,
            metrics, stop, max_rows: int, wait_weights: bool) -> None:
    """A concurrent engine (vLLM): keep up to `max_rows` rows' groups in flight,
    claim more as groups finish, and write each group the moment it is generated.
    Weight updates happen inside the engine between generations (it drains the
    groups in flight first), so every group comes back with the one version that
    generated it."""
    g = spec.algorithm.group_size
    params = SamplingParams(n=g, max_new_tokens=spec.rollout.max_new_tokens,
                            temperature=spec.rollout.temperature, top_p=spec.rollout.top_p)
    io = ThreadPoolExecutor(1, thread_name_prefix="rljob-rollout-claim")
    writer = ThreadPoolExecutor(1, thread_name_prefix="rljob-rollout-write")
    inflight: dict[Future, tuple[Batch, int, float]] = {}  # group → (batch, first row, t0)
    left: dict[str, int] = {}  # a batch's lease → its groups not yet written
    held: dict[str, Batch] = {}
    ahead: Future | None = None
    written: list[Future] = []
    logged_swaps = 0
    try:
        while not stop.is_set():
            logged_swaps = _log_swaps(receiver, spans, metrics, logged_swaps)
            metrics.version.set(receiver.version)
            metrics.inflight.set(len(inflight) * g)
            free = max_rows - len(inflight) * g
            if ahead is None and free >= g:
                ahead = io.submit(claim, free)
            done, _ = wait([*inflight, *([ahead] if ahead else [])], timeout=0.5,
                           return_when=FIRST_COMPLETED)
            if ahead is not None and ahead.done():
                batch, latest = ahead.result()
                ahead = None
                if batch.rows:
                    if wait_weights:  # generation waits for the newest weights
                        receiver.wait_version(latest[0], epoch=latest[1])
                    step = batch.rows[0].partition
                    t0 = time.time()
                    for first in range(0, len(batch.rows), g):
                        seed = _seed(spec, step, batch.data["slot"][first] // g)
                        fut = engine.submit(batch.data["prompt_ids"][first].tolist(), params,
                                            seed)
                        inflight[fut] = (batch, first, t0)
                    left[batch.lease], held[batch.lease] = len(batch.rows) // g, batch
            for fut in [f for f in done if f in inflight]:
                batch, first, t0 = inflight.pop(fut)
                group, version, epoch = fut.result()
                finished = time.time()
                spans.add("generate", t0, finished, batch.rows[0].partition)
                left[batch.lease] -= 1
                last = left[batch.lease] == 0
                if last:
                    del left[batch.lease], held[batch.lease]
                group, scored = score(batch, first, group)
                for w in [w for w in written if w.done()]:
                    w.result()  # a failed write surfaces here
                written = [w for w in written if not w.done()]
                written.append(writer.submit(write, batch, group, scored, version, epoch,
                                             (t0, finished), batch.indices[first:first + g],
                                             last))
                metrics.samples.inc(len(group))
                metrics.tokens.inc(sum(len(x.response_ids) for x in group))
    finally:
        writer.shutdown(wait=True)  # what was generated is written
        # groups in flight and a claim in flight: their rows go back to the queue at once
        if ahead is not None:
            try:
                batch, _ = ahead.result()
                if batch.rows:
                    held[batch.lease] = batch
            except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires
                log.warning("a claim in flight failed: %s", exc)
        io.shutdown()
        for batch in held.values():
            keeper.drop(batch)
            try:
                tq.release(batch)
            except Exception as exc:  # noqa: BLE001 - shutting down: its lease expires
                log.warning("could not release a claimed batch: %s", exc)


def _log_swaps(receiver, spans, metrics, logged: int) -> int:
    """Record the weight swaps since the first `logged` ones (timeline spans and
    histograms); return how many are recorded now."""
    for (t0, t1, v), drain, transfer in zip(receiver.swap_seconds[logged:],
                                            receiver.drain_seconds[logged:],
                                            receiver.transfer_seconds[logged:]):
        spans.add("weight-sync", t0, t1, v)
        metrics.weight_swap.observe(t1 - t0)
        metrics.weight_drain.observe(drain)
        metrics.weight_transfer.observe(transfer)
    return len(receiver.swap_seconds)


def _seed(spec: RLJobSpec, step: int, group: int) -> int:
    return (spec.algorithm.seed * 1_000_003 + step * 10_007 + group) % (2 ** 31)
