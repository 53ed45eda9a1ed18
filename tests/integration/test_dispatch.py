"""Skew-aware dispatch through a real TransferQueue controller: the driver releases
steps of examples/longtail.yaml with predicted output lengths, its ranker learns
from the samples written back (the `lengths` task), and a rollout claiming
`group_longest_first` gets the step's long groups in its first batch."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from rljob.api.validation import load_rljob
from rljob.inputs.data import load_examples
from rljob.inputs.models import load_tokenizer
from rljob.workflow.dispatch import rollout_claim_policy
from rljob.preflight import resolve_paths
from rljob.transferqueue import TransferQueueClient
from rljob.workflow.driver import Workflow
from rljob.workflow.lengths import LengthModel
from rljob.workflow.tasks import ROLLOUT_READS, tasks_for

REPO = Path(__file__).resolve().parents[2]


def test_the_ranker_learns_from_written_samples_and_long_groups_go_first(tq_memory):
    job = resolve_paths(load_rljob(str(REPO / "examples/longtail.yaml")), REPO / "examples")
    spec = job.spec
    assert spec.rollout.dispatch == "skew_aware"
    tok = load_tokenizer(spec.model)
    client = TransferQueueClient(tq_memory.address)
    client.register(*tasks_for(spec))
    flow = Workflow(spec, client, None, tok, lengths=LengthModel(client, tok).start())
    examples = load_examples(spec.dataset)
    prompts, g = spec.algorithm.step_prompts, spec.algorithm.group_size
    policy = rollout_claim_policy(spec.rollout.dispatch, 0, spec.rollout.replicas)
    firsts = []
    try:
        for step in range(4):
            step_examples = examples[step * prompts:(step + 1) * prompts]
            flow.put_prepared(step, flow.prepare_prompts(step_examples))
            batches = []
            while sum(len(b) for b in batches) < prompts * g:  # four batches of four groups
                batches.append(client.claim_get("rollout", 4 * g, ROLLOUT_READS,
                                                policy=policy, wait=2.0))
            for batch in batches:  # the model answers with the answer's length
                lengths = [len(a) + 1 for a in batch.data["answer"]]
                client.write(batch.indices, {"response_ids": [np.ones(n, np.int32)
                                                              for n in lengths]},
                             versions=[step] * len(batch), length_column="response_ids",
                             lease=batch)
                client.ack(batch)
            firsts.append(sorted({len(a) for a in batches[0].data["answer"]}, reverse=True))
            longest = sorted((len(e.answer) for e in step_examples), reverse=True)[:4]
            deadline = time.monotonic() + 20
            while flow.lengths.observed < (step + 1) * prompts * g:  # the ranker saw them
                assert time.monotonic() < deadline, flow.lengths.observed
                time.sleep(0.05)
            if step >= 2:  # two steps seen: the step's four longest prompts come first
                assert sorted((len(a) for a in batches[0].data["answer"][::g]),
                              reverse=True) == longest, (step, firsts)
    finally:
        flow.lengths.close()
        client.close()
