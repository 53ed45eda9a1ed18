"""The driver: puts each step's prompts into TransferQueue a step before the workflow
mode releases them; a rollout replica claims them once its weights may generate them
(the release bound its claims carry, `ReleaseRule.last_step`)."""

from __future__ import annotations

import logging
import time

import grpc

from ..api.spec import RLJobSpec
from ..inputs.data import PromptCursor, load_examples, prompt_columns
from ..tools.catalog import announced
from ..transferqueue import TransferQueueClient
from ..transferqueue.consumer import ride_out, warn
from ..weights import WeightClient
from .release import ReleaseRule
from .tasks import tasks_for

log = logging.getLogger("rljob.driver")

# steps whose prompts wait in the table before their release: a replica that loads the
# weights of their step takes them at once (its claim waits there), and the put, the
# weight service's version reports and the driver's answer are off the step's path
LOOKAHEAD = 1


class Workflow:
    """The driver's side of the job over TransferQueue and the weight service.

    init_engines()         register the job's tasks, wait for weights v0 and replicas
    prepare_prompts(ex)    a step's prompts rendered and tokenized, G rows per prompt
    put_prepared(s, cols)  put step s's prepared prompts
    may_release(s)         whether the workflow mode lets step s out now
    may_put(s)             whether step s's prompts may go into the table (s − LOOKAHEAD
                           released)
    """

    def __init__(self, spec: RLJobSpec, tq: TransferQueueClient, weights: WeightClient,
                 tokenizer, lengths=None):
        self.spec = spec
        self.tq = tq
        self.weights = weights
        self.tok = tokenizer
        # the function schemas the prompts announce (rollout.tools), through the template
        self.tools = announced(spec.rollout)
        self.lengths = lengths  # skew-aware dispatch: a LengthModel (workflow/lengths.py)
        self.rule = ReleaseRule.of(spec)

    def init_engines(self, timeout: float = 600.0, poll: float = 0.2) -> None:
        """Register the job's tasks and wait until the trainer published its first
        weights and a rollout replica loaded them. A trainer that answers but has
        published nothing is still loading or warming up: it is waited for as long as
        it answers (a warm-up takes what the machine gives it); `timeout` s bound a
        trainer that does not answer, and the replicas' load after the publish."""
        self.tq.register(*tasks_for(self.spec))
        deadline = time.monotonic() + timeout
        published = None
        while True:
            try:
                status = self.weights.status()
                if status.version >= 0 and status.replicas:
                    return
                if status.version < 0:
                    deadline = time.monotonic() + timeout
                elif published is None:
                    published = status.version
                    deadline = time.monotonic() + timeout
            except grpc.RpcError:
                pass  # the trainer is still starting or restarting
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no rollout replica loaded weights v{published} within {timeout:.0f} s "
                    "of their publish" if published is not None else
                    f"the trainer's weight service did not answer for {timeout:.0f} s")
            time.sleep(poll)

    def prepare_prompts(self, examples) -> dict[str, list]:
        """Step prompts rendered and tokenized, G rows per prompt (before release)."""
        return prompt_columns(self.tok, examples, self.spec.algorithm.group_size,
                              tools=self.tools)

    def put_prepared(self, step: int, columns: dict[str, list]) -> list[int]:
        """Put prepared prompts: one put, stamped with its time (`released_at`: the
        trainer counts a step's queueing from the later of it and the publish of the
        weights that release the step). A row's length is its prompt's, or with
        skew-aware dispatch its predicted output length (predicted now, from every
        sample finished so far)."""
        n = len(columns["slot"])
        lengths = (self.lengths.predict(columns["prompt"], columns["answer"]) if self.lengths
                   else [len(x) for x in columns["prompt_ids"]])
        return self.tq.put(step, {**columns, "released_at": [time.time()] * n},
                           group_size=self.spec.algorithm.group_size, lengths=lengths)

    def may_release(self, step: int, wait: float = 0.0) -> bool:
        """Whether `step`'s prompts may go out; with `wait`, long-poll the weight
        service until they may (or the time is up)."""
        need = self.rule.version_needed(step)
        status = self.weights.status(wait_version=need if wait else None, wait=wait)
        return self.rule.allows(step, status.version, [r.version for r in status.replicas])

    def may_put(self, step: int, wait: float = 0.0) -> bool:
        """Whether `step`'s prompts may go into the table: once the step LOOKAHEAD
        before it is released. Replicas claim them only under their release bound."""
        return self.may_release(step - LOOKAHEAD, wait)


def _released(tq: TransferQueueClient) -> int:
    """Steps whose prompts were put already (partitions are steps)."""
    return ride_out(lambda: tq.stats().next_partition)


def _put_once(flow: Workflow, tq: TransferQueueClient, step: int, prepared) -> None:
    """Put a step's prompts exactly once, through a controller restart: if the answer
    was lost, the table says whether the rows were created."""
    while ride_out(lambda: flow.put_prepared(step, prepared), once=True, pause=0,
                   away=warn(log, f"putting step {step}: %s; checking the table")) is None:
        if _released(tq) > step:
            return


def run_driver(spec: RLJobSpec, tq_address: str, weights_address: str, tokenizer,
               start_step: int = 0, max_steps: int | None = None,
               poll: float = 0.01, metrics_port: int | None = None, run_dir=None) -> None:
    """Put steps from `start_step`, or from the first step the table has not seen
    (a restarted driver), each LOOKAHEAD steps before its release; the dataset cursor
    of a step follows from its number. With `run_dir`, each step's put is a span of
    the driver's timeline."""
    from ..infra.timeline import SpanLog
    from ..infra.worker_metrics import WorkerMetrics

    prom = WorkerMetrics("driver", metrics_port)
    spans = SpanLog(run_dir, "driver")
    examples = load_examples(spec.dataset)
    tq = TransferQueueClient(tq_address)
    weights = WeightClient(weights_address)
    flow = Workflow(spec, tq, weights, tokenizer)
    flow.init_engines()
    if spec.rollout.dispatch == "skew_aware":
        from .lengths import LengthModel

        flow.lengths = LengthModel(tq, tokenizer, spec.rollout.length_predictor).start()
    steps = max_steps or spec.algorithm.max_steps
    start_step = max(start_step, _released(tq))
    if start_step:
        log.info("putting from step %d", start_step)
    batch = spec.algorithm.step_prompts
    cursor = PromptCursor.at_step(examples, spec.algorithm.seed, start_step, batch)
    for step in range(start_step, steps):
        # the prompts go in before their release: a replica takes them as soon as it
        # holds the weights of their step
        prepared = flow.prepare_prompts(cursor.take(batch))
        while True:
            try:
                if flow.may_put(step, wait=5.0):
                    break
            except grpc.RpcError as exc:  # the trainer (weight service) restarts
                log.warning("weight service unavailable (%s); waiting", exc.code().name)
                time.sleep(1.0)
                continue
            time.sleep(poll)
        with spans.span("put", step):
            _put_once(flow, tq, step, prepared)
        prom.step.set(step)
        log.info("put step %d", step)
    # stay until the trainer has published the last version: the job is not over
    # before, and the driver's exit should not take CPU from the last step
    while True:
        try:
            if weights.status(wait_version=steps, wait=5.0).version >= steps:
                break
        except grpc.RpcError:
            break  # the trainer has finished and gone (or is restarting: nothing left to release)
    if flow.lengths is not None:
        flow.lengths.close()
        log.info("length ranker: learned from %d samples", flow.lengths.observed)
    tq.close()
    weights.close()
    spans.close()
