"""The frozen reference's log-probs of each finished sample: a task of its own,
computed by whichever side of the job waits, or the trainer's own work.

With `algorithm.klCoef` > 0 the trainer needs, for every response token, the
reference policy's log-prob (the KL term). Where a rollout replica can compute
it too (`workflow.tasks.reference_task`: the hf engine on CPU in a local run, in
sync and async, the modes that park the replicas) it is a TransferQueue task of
its own (`reference` reads prompt_ids and response_ids and writes ref_logp;
`train` reads ref_logp), so it is not tied to the trainer's micro-steps: a
sample's reference log-probs can be computed as soon as the sample exists, by
any worker holding the reference weights.

Two kinds of worker take it, each only while it has nothing else to do:

- the trainer (rank 0), while it waits for the samples of its next micro-batch,
  takes the rows of the step it trains (`ReferenceWork`);
- in a local run, a rollout replica of the hf engine on CPU, while its claim for
  prompts waits (parked by the staleness bound in a training-bound job), takes
  any rows. The trainer writes the reference weights into the run directory
  (`RunDir.reference`) when it freezes them; the replica loads them the
  first time it has time.

So in a training-bound job the idle rollout cores compute what the trainer
would, and in a generation-bound one the waiting trainer keeps them.

Everywhere else (periodic, whose replicas generate the next batch while the
trainer computes this one's; accelerators; vLLM replicas) only the trainer could
take the task, and its claims, writes and acks would be round trips for
nothing: the trainer computes its step's samples' reference log-probs itself as
they arrive, while the rest of its micro-batch comes (`LocalReference`).

Who computes a row changes nothing in it: `sampling.row_logprobs` gives a row the
same bits whatever was batched with it, from the same weights in the same
dtype (float32 on CPU), so a streamed step still makes the update a whole-step
step makes (tests/training: periodic, the trainer's own, equals sync, a task,
bit for bit)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from ..sampling import TokenDistribution, row_logprobs
from ..transferqueue import Batch, TransferQueueClient
from ..transferqueue.consumer import ride_out
from ..transferqueue.dataplane import TransferQueueError
from ..workflow.tasks import REFERENCE_READS, reference_task

log = logging.getLogger("rljob.reference")


def replicas_take_it(spec) -> bool:
    """Whether the rollout replicas of a local run take the reference task too: an
    in-process transformers model (hf engine) on the device the trainer's
    reference runs on (CPU: the bits of a row then do not depend on the side), in
    the modes that park them (`workflow.tasks.reference_task`)."""
    return reference_task(spec)


def save_weights(path: Path, model) -> None:
    """The frozen reference's weights at `path` (`RunDir.reference`), for the rollout
    replicas of a local run (written once; a resumed run's reference is the same)."""
    from safetensors.torch import save_file

    if path.exists():
        return
    tmp = path.with_name(path.name + ".partial")
    # a copy each: safetensors refuses tensors that share storage (tied embeddings)
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(tmp))
    tmp.replace(path)


class ReferenceWork:
    """One worker's share of the reference task: `once()` claims up to `rows`
    rows, computes their reference log-probs and writes them under the claim's
    lease. `model()` gives the frozen reference (a `ReferenceFromRunDir` gives None
    while the trainer has not written it yet)."""

    def __init__(self, tq_address: str, model, pad_id: int, dist: TokenDistribution,
                 rows: int = 16, compute=nullcontext, spans=None):
        self.tq = TransferQueueClient(tq_address)  # its own: the worker's is busy elsewhere
        self.model, self.pad_id, self.dist, self.rows = model, pad_id, dist, rows
        self.compute = compute  # () -> the context the forwards run in
        self.spans = spans  # the worker's SpanLog: a "reference" span per chunk
        self._claims = ThreadPoolExecutor(1, thread_name_prefix="rljob-reference-claim")

    def once(self, partition: int | None = None, wait: float = 0.0,
             since: int | None = None) -> int:
        """Claim, compute and write up to `rows` rows (of `partition`, else any);
        the number computed (0: none was ready within `wait`, the claim was woken
        (`wake`: the caller has other work; `since`: `mark()` read before the caller
        last looked for it), or the reference is not there yet)."""
        return self.work(self.claim(partition, wait, since).result())

    def claim(self, partition: int | None = None, wait: float = 0.0,
              since: int | None = None) -> Future:
        """`once`'s claim, sent from a thread of its own: the caller waits on it and
        on its other work at once. Its result: the claimed Batch (no rows: none within
        `wait`, woken, or the controller away), or None without reference weights."""
        if self.model() is None:
            done: Future = Future()
            done.set_result(None)
            return done
        kwargs = {"partition": partition} if partition is not None else {}
        return self._claims.submit(lambda: ride_out(
            lambda: self.tq.claim_get("reference", self.rows, REFERENCE_READS, wait=wait,
                                      min_count=1, since=since, **kwargs),
            once=True, pause=0) or Batch("reference", "", []))  # away: claim again

    def work(self, batch: Batch | None) -> int:
        """Compute and write the claimed rows' reference log-probs; how many."""
        if batch is None or not batch.rows:
            return 0
        if self.spans is not None:
            self.spans.claimed(batch, batch.rows[0].partition)
        logps = _forward(self, [x.tolist() for x in batch.data["prompt_ids"]],
                         [x.tolist() for x in batch.data["response_ids"]],
                         batch.rows[0].partition)
        return self._write(batch, logps)

    def abandon(self, claim: Future) -> None:
        """The caller went on to other work: the claim stops waiting (`wake`), and rows
        it brings back all the same go back to the queue at once."""
        self.wake()

        def give_back(fut: Future) -> None:
            batch = None if fut.exception() is not None else fut.result()
            if batch is not None and batch.rows:
                try:
                    self.tq.release(batch)
                except Exception as exc:  # noqa: BLE001 - its lease expires instead
                    log.warning("could not give back %d reference rows: %s", len(batch), exc)

        claim.add_done_callback(give_back)

    def mark(self) -> int:
        """Read before looking for other work; `once(since=...)` then wakes for a
        `wake()` that came after it."""
        return self.tq.wakes

    def wake(self) -> None:
        """Other work arrived: a waiting `once` returns now (from another thread). A
        wake that cannot be sent (the controller away, the client closed) is let go:
        the claim's own wait ends it."""
        try:
            self.tq.wake()
        except Exception as exc:  # noqa: BLE001
            log.debug("could not wake the reference claim: %s", exc)

    def _write(self, batch: Batch, logps: list[list[float]]) -> int:
        t0 = time.time()
        try:
            self.tq.write(batch.indices, {"ref_logp": [np.asarray(x, np.float32) for x in logps]},
                          lease=batch, ack=True)
            if self.spans is not None:
                self.spans.add("write", t0, time.time(), batch.rows[0].partition)
        except TransferQueueError as exc:
            # the lease expired (this worker was paused): the rows went back and
            # another worker computes them
            log.warning("dropped the reference log-probs of %d rows: %s", len(logps), exc)
            return 0
        return len(logps)

    def close(self) -> None:
        self.wake()
        self._claims.shutdown(wait=True)  # a claim in flight ends within its wait
        self.tq.close()


class LocalReference:
    """The trainer's own reference log-probs of its step's samples, computed in its
    process as they arrive, where the reference is not a task (`reference_task`):
    the same function, weights and dtype as `ReferenceWork`, so a row gets the same
    bits either way, and no claim, write or ack goes through TransferQueue for them."""

    def __init__(self, model, pad_id: int, dist: TokenDistribution, rows: int,
                 compute=nullcontext, spans=None):
        self.model, self.pad_id, self.dist, self.rows = model, pad_id, dist, rows
        self.compute = compute  # () -> the context the forwards run in
        self.spans = spans  # the trainer's SpanLog: a "reference" span per forward batch

    def __call__(self, samples: list, step: int) -> None:
        """Set each sample's `ref_logp` (those without), `rows` at a time."""
        todo = [s for s in samples if s.ref_logp is None]
        for k in range(0, len(todo), self.rows):
            part = todo[k:k + self.rows]
            logps = _forward(self, [s.prompt_ids for s in part],
                             [s.response_ids for s in part], step)
            for s, lp in zip(part, logps):  # float32 values, as the task's column holds
                s.ref_logp = lp


def _forward(work, prompts: list[list[int]], responses: list[list[int]],
             step: int) -> list[list[float]]:
    """The rows' reference log-probs, computed as `work` (a `ReferenceWork` or a
    `LocalReference`) computes them, with a "reference" span of `step`."""
    t0 = time.time()
    with work.compute():
        logps = row_logprobs(work.model(), work.pad_id, prompts, responses, work.dist)
    if work.spans is not None:
        work.spans.add("reference", t0, time.time(), step)
    return logps


class ReferenceFromRunDir:
    """The reference model a rollout replica loads from the run directory once the
    trainer has written it (None until then)."""

    def __init__(self, path: Path, build):
        self.path = Path(path)  # RunDir.reference
        self.build = build  # () -> a fresh model of the job's architecture, float32
        self.model = None

    def __call__(self):
        if self.model is None and self.path.exists():
            from safetensors.torch import load_file

            model = self.build()
            model.load_state_dict(load_file(str(self.path)))
            self.model = model.eval().requires_grad_(False)
            log.info("reference weights loaded: computing the reference task's rows "
                     "while waiting for prompts")
        return self.model
