"""The reference task against a real TransferQueue controller and Redis storage:
the trainer's frozen reference and a replica's copy of it (loaded from the run
directory) share a step's rows, and each row gets the bits it would get from
either side alone, whatever else each side batched with it, and the bits the
trainer computes itself where the reference is no task."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from rljob.api.validation import load_rljob
from rljob.inputs.models import build_model, load_tokenizer
from rljob.preflight import resolve_paths
from rljob.sampling import TokenDistribution, row_logprobs
from rljob.infra.rundir import RunDir
from rljob.infra.timeline import SpanLog, load_spans
from rljob.trainer.reference import (LocalReference, ReferenceFromRunDir, ReferenceWork,
                                     replicas_take_it, save_weights)
from rljob.transferqueue import TransferQueueClient
from rljob.workflow.tasks import ROLLOUT_READS, tasks_for, train_reads

REPO = Path(__file__).resolve().parents[2]


def test_the_trainer_and_a_replica_share_the_reference_rows_bit_for_bit(tq, tmp_path):
    job = resolve_paths(load_rljob(str(REPO / "examples/quickstart.yaml")), REPO / "examples")
    spec = job.spec
    assert replicas_take_it(spec)  # kl > 0, torch trainer, hf rollouts, all on CPU
    tok = load_tokenizer(spec.model)
    dist = TokenDistribution(0.8, 0.9, len(tok))
    trainer_ref = build_model(spec.model, tok, seed=3, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, len(tok), rng.integers(5, 14)).tolist() for _ in range(8)]
    responses = [rng.integers(4, len(tok), rng.integers(1, 23)).tolist() for _ in range(32)]
    rows = [(prompts[i // 4], r) for i, r in enumerate(responses)]

    client = TransferQueueClient(tq.address)
    client.register(*tasks_for(spec))
    client.put(0, {"prompt": [""] * 32, "answer": [""] * 32, "extra": [{}] * 32,
                   "prompt_ids": [np.asarray(p, np.int32) for p, _ in rows],
                   "slot": list(range(32)), "released_at": [0.0] * 32},
               group_size=4, lengths=[len(p) for p, _ in rows])
    batch = client.claim_get("rollout", 32, ROLLOUT_READS, wait=5.0, min_count=32)
    client.write(batch.indices, {
        "response_ids": [np.asarray(r, np.int32) for _, r in rows],
        "rollout_logp": [np.zeros(len(r), np.float32) for _, r in rows],
        "reward": [0.0] * 32, "reward_error": [""] * 32, "started_at": [0.0] * 32,
        "finished_at": [0.0] * 32, "weights_epoch": [0] * 32, "gen_calls": [[]] * 32,
    }, versions=[0] * 32, length_column="response_ids", lease=batch)
    client.ack(batch)
    # the train task waits for the reference's log-probs
    assert not client.claim("train", 32, partition=0, wait=0.2)

    # the trainer writes its reference; the replica loads it the first time it looks
    weights = RunDir(tmp_path).reference
    loaded = ReferenceFromRunDir(weights, lambda: build_model(spec.model, tok, seed=9,
                                                               dtype=torch.float32))
    replica = ReferenceWork(tq.address, loaded, tok.pad_token_id, dist, rows=12)
    assert replica.once() == 0 and loaded.model is None  # not written yet
    save_weights(weights, trainer_ref)
    assert weights.exists()
    trainer = ReferenceWork(tq.address, lambda: trainer_ref, tok.pad_token_id, dist, rows=5)
    try:
        done = {"replica": replica.once(), "trainer": trainer.once(partition=0)}
        while sum(done.values()) < 32:
            done["replica"] += replica.once()
            done["trainer"] += trainer.once(partition=0)
        assert done["replica"] > 0 and done["trainer"] > 0, done
    finally:
        replica.close()
        trainer.close()

    train = client.claim_get("train", 32, train_reads(spec), partition=0, wait=5.0,
                             min_count=32)
    got = {int(train.data["slot"][i]): train.data["ref_logp"][i] for i in range(32)}
    # each row alone, and all rows in one call: the bits each side wrote
    alone = [row_logprobs(trainer_ref, tok.pad_token_id, [p], [r], dist)[0] for p, r in rows]
    together = row_logprobs(trainer_ref, tok.pad_token_id, [p for p, _ in rows],
                            [r for _, r in rows], dist)
    # where the reference is no task (periodic, accelerators), the trainer's own
    # (LocalReference, a few rows a forward): the bits the task's rows carry
    samples = [SimpleNamespace(prompt_ids=p, response_ids=r, ref_logp=None) for p, r in rows]
    spans = SpanLog(tmp_path, "trainer-0")
    LocalReference(lambda: trainer_ref, tok.pad_token_id, dist, rows=7, spans=spans)(samples, 0)
    spans.close()
    assert sum(1 for s in load_spans(tmp_path) if s.kind == "reference") == 5  # 32 / 7
    for slot, (p, r) in enumerate(rows):
        assert got[slot].tolist() == np.asarray(alone[slot], np.float32).tolist()
        assert samples[slot].ref_logp == got[slot].tolist()
        assert together[slot] == alone[slot]
        assert len(got[slot]) == len(r)
    client.ack(train)
    deadline = time.monotonic() + 5
    while client.stats().cleared_partitions < 1:  # every task has acked every row
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.close()
