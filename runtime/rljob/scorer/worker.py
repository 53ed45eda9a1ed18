"""`rljob worker reward`: one reward replica, a consumer of the reward task.

With reward.url or reward.model the reward is a task of its own in the TransferQueue
(workflow/tasks.py): the rollout replicas write each sample's text and its rule's
score (reward.name), and the reward replicas claim the rows that are ready, from one
up to reward.batchSize, score them (reward/remote.py: the service, a bounded number
of calls in flight, a time limit, retries, a failure score; reward/classifier.py: a
reward model, one forward a batch), combine the score with the rule's
(reward/combine.py) and write the rewards under the claim's lease, acked by the same
notify. The trainer's claims take a group once its rewards are written, so scoring
streams beside generation: a slow scorer delays its own rows, never the next
generation.

A batch is held in the lease keeper while it is scored, so a scorer slower than a
lease term keeps it. A replica that dies mid-batch, or is paused past its lease,
loses nothing and scores nothing twice: its lease expires, the rows go back to the
task, another replica (or this one's next life) scores them, and the late write of
the paused one is refused (fenced) and dropped."""

from __future__ import annotations

import logging
import signal
import threading
import time

from ..infra.timeline import SpanLog
from ..infra.worker_metrics import WorkerMetrics
from ..reward.combine import asks, combine
from ..transferqueue import Batch
from ..transferqueue.consumer import Consumer, ride_out, warn
from ..transferqueue.dataplane import TransferQueueError
from ..workflow.tasks import REWARD_READS, tasks_for

log = logging.getLogger("rljob.reward")
CLAIM_WAIT_S = 0.5  # a claim's long poll: how soon a stop is seen while nothing is ready


def make_scorer(spec):
    """The reward replicas' scorer: reward.url's client or reward.model's model."""
    if spec.reward.url is not None:
        from ..reward.remote import RemoteScorer

        return RemoteScorer(spec.reward.url)
    from ..infra.device import cores_given
    from ..reward.classifier import ClassifierScorer

    import torch

    torch.set_num_threads(cores_given())
    return ClassifierScorer(spec.reward.model, spec.accelerator_for("reward").type)


def payloads(data: dict, rows: list[int]) -> list[dict]:
    """The service's requests for `rows` of a claimed batch (pure): the prompt, the
    scored text, the answer and the dataset row's other keys."""
    return [{**(data["extra"][i] or {}), "prompt": data["prompt"][i],
             "response": data["response_text"][i], "answer": data["answer"][i]}
            for i in rows]


class RewardWorker:
    """One reward replica: `setup()` joins the TransferQueue and opens its scorer (the
    service's client, or the model); `run()` claims, scores and writes until SIGTERM;
    `close()`."""

    def __init__(self, spec, tq_address: str, replica: int, run_dir=None,
                 metrics_port: int | None = None):
        self.spec, self.tq_address, self.replica = spec, tq_address, replica
        self.name = f"reward-{replica}"
        self.stop = threading.Event()
        self.spans = SpanLog(run_dir, self.name)
        self.metrics = WorkerMetrics(self.name, metrics_port)
        self.consumer = self.scorer = None
        self.scored = self.dropped = 0

    def setup(self) -> RewardWorker:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        for quiet in ("httpx2", "httpcore2"):  # a line per call otherwise
            logging.getLogger(quiet).setLevel(logging.WARNING)
        self.scorer = make_scorer(self.spec)
        self.consumer = Consumer.join(self.tq_address, tasks_for(self.spec))
        if self.consumer.released:
            log.info("gave back %d rows an earlier %s held", self.consumer.released, self.name)
        reward = self.spec.reward
        what = (f"{reward.url.endpoint} ({reward.url.concurrency} calls at most in flight)"
                if reward.url else f"the {reward.model.kind} {reward.model.path}")
        log.info("scoring with %s, %d rows a claim", what, reward.batch_size)
        return self

    def run(self) -> None:
        while not self.stop.is_set():
            batch = self.claim()
            if batch is not None and batch.rows:
                self.score(batch)

    def claim(self) -> Batch | None:
        tq = self.consumer.tq
        batch = ride_out(lambda: tq.claim_get("reward", self.spec.reward.batch_size,
                                              REWARD_READS, wait=CLAIM_WAIT_S, min_count=1),
                         away=warn(log), stop=self.stop, once=True)
        if batch is not None and batch.rows:
            self.spans.claimed(batch, batch.rows[0].partition)
        return batch

    def score(self, batch: Batch) -> None:
        """Score a claimed batch and write its rewards (fenced: a lease that expired
        meanwhile drops them)."""
        self.consumer.keeper.hold(batch)
        try:
            t0 = time.time()
            rewards, errors = self.rewards(batch.data, len(batch))
            t1 = time.time()
            self.spans.add("score", t0, t1, batch.rows[0].partition, {"rows": len(batch)})
            self.write(batch, rewards, errors, (t0, t1))
        finally:
            self.consumer.keeper.drop(batch)
        self._count()

    def rewards(self, data: dict, n: int) -> tuple[list[float], list[str]]:
        """Each row's reward and error ("" for none): the scorer asked for the rows the
        gate lets through (reward.combine), its score combined with the rule's."""
        spec = self.spec.reward
        rules = [float(x) for x in data["rule_reward"]]
        asked = [i for i in range(n) if asks(spec, rules[i])]
        scores: list = [None] * n
        errors = [""] * n
        for i, got in zip(asked, self.scorer.score(payloads(data, asked))):
            scores[i], errors[i] = got.score, got.error
        if any(errors):
            first = next(e for e in errors if e)
            log.warning("scoring failed for %d of %d samples: %s",
                        sum(map(bool, errors)), n, first)
        return [combine(spec, r, s) for r, s in zip(rules, scores)], errors

    def write(self, batch: Batch, rewards: list[float], errors: list[str],
              span: tuple[float, float]) -> None:
        t0 = time.time()
        try:
            self.consumer.tq.write(batch.indices, {
                "reward": rewards, "reward_error": errors,
                "reward_started_at": [span[0]] * len(batch),
                "reward_finished_at": [span[1]] * len(batch)}, lease=batch, ack=True)
            self.spans.add("write", t0, time.time(), batch.rows[0].partition)
            self.scored += len(batch)
            self.metrics.samples.inc(len(batch))
        except TransferQueueError as exc:
            # the lease expired (this replica was paused or cut off): the rows went
            # back to the task and another replica scores them
            log.warning("dropped the rewards of %d rows of step %d: %s", len(batch),
                        batch.rows[0].partition, exc)
            self.dropped += len(batch)
            self.metrics.dropped.inc(len(batch))

    def _count(self) -> None:
        stats = self.scorer.take_stats()
        for seconds in stats.seconds:
            self.metrics.reward_request.observe(seconds)
        self.metrics.reward_retries.inc(stats.retries)
        self.metrics.reward_failures.inc(stats.failures)

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()
        if self.consumer is not None:
            self.consumer.close()
        self.spans.close()
        log.info("scored %d rows (%d dropped)", self.scored, self.dropped)


def run_reward(spec, tq_address: str, replica: int, run_dir=None,
               metrics_port: int | None = None) -> None:
    """`rljob worker reward`: one replica until SIGTERM."""
    worker = RewardWorker(spec, tq_address, replica, run_dir, metrics_port)
    try:
        worker.setup()
        worker.run()
    finally:
        worker.close()
