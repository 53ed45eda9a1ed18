"""The reward task on a real TransferQueue over Redis: the rows a rollout wrote, the
reward replicas' claims and fenced writes, the trainer's claims of whole groups once
their rewards are written (tests/chaos/test_reward_replicas.py kills and pauses
replicas with these helpers)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from rljob.api import RLJob
from rljob.reward import get_reward
from rljob.reward.server import make_server
from rljob.scorer.worker import RewardWorker, make_scorer
from rljob.transferqueue import TransferQueueClient
from rljob.transferqueue.consumer import Consumer
from rljob.workflow.tasks import tasks_for
from tests import zoo
from tests.integration.conftest import TQServer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS, ROWS = 2, 32  # rows a step: 4 groups of 8
ARITH = get_reward("arith_partial")


def job_file(tmp_path: Path, endpoint: str, name: str, **reward) -> Path:
    doc = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["path"] = f"random:{EXAMPLES / 'models/tiny-qwen2'}"
    doc["spec"]["dataset"]["path"] = str(EXAMPLES / "data/arith.jsonl")
    doc["spec"]["algorithm"]["klCoef"] = 0.0  # no reference task: train waits for rewards
    doc["spec"]["reward"] = {"name": "arith_partial", "batchSize": 8,
                             "url": {"endpoint": endpoint, "timeoutSeconds": 600,
                                     "backoffSeconds": 0.05}, **reward}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def spec_of(path: Path):
    return RLJob.model_validate(yaml.safe_load(path.read_text())).spec


class Served:
    """arith_partial served on reward.url's protocol, each answer `delay` late."""

    def __init__(self, delay: float = 0.0):
        def slow(prompt, response, answer):
            time.sleep(delay)
            return ARITH(prompt, response, answer)

        self.server = make_server(slow)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def fill(tq: TransferQueueClient, spec) -> dict[int, tuple[str, str]]:
    """STEPS steps of rows put and generated (as a rollout replica writes them);
    global index → (response text, answer)."""
    tq.register(*tasks_for(spec))
    rng = np.random.default_rng(0)
    for step in range(STEPS):
        answers = [str(int(x)) for x in rng.integers(10, 99, ROWS)]
        tq.put(step, {"prompt": [f"{a}+0=" for a in answers], "answer": answers,
                      "extra": [{}] * ROWS,
                      "prompt_ids": [np.arange(4, dtype=np.int32)] * ROWS,
                      "slot": list(range(ROWS)), "released_at": [time.time()] * ROWS},
               group_size=8)
    texts = {}
    batch = tq.claim_get("rollout", STEPS * ROWS, ["answer"])
    got = batch.data
    responses = [a if i % 3 else a[::-1] for i, a in enumerate(got["answer"])]
    for i, r, a in zip(batch.indices, responses, got["answer"]):
        texts[i] = (r, a)
    n = len(batch)
    tq.write(batch.indices, {
        "response_ids": [np.ones(3, np.int32)] * n, "rollout_logp": [np.zeros(3, np.float32)] * n,
        "rule_reward": [ARITH("", r, a) for r, a in zip(responses, got["answer"])],
        "rule_error": [""] * n, "response_text": responses,
        "started_at": [0.0] * n, "finished_at": [1.0] * n, "weights_epoch": [0] * n,
        "gen_calls": [[]] * n}, versions=[0] * n, length_column="response_ids",
        lease=batch, ack=True)
    return texts


def replica(path: Path, address: str, name: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, POD_NAME=name)
    return subprocess.Popen([sys.executable, "-m", "rljob", "worker", "reward", "--job",
                             str(path), "--tq", address], env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def holds(tq: TransferQueueClient, consumer: str) -> bool:
    return any(c.consumer == consumer and c.task == "reward" and c.claimed
               for c in tq.stats().consumers)


def until(what, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        assert proc is None or proc.poll() is None, f"exited with {proc.returncode}"
        time.sleep(0.02)


@contextmanager
def replica_thread(spec, address: str):
    """A reward replica in a thread of the test (its setup without the SIGTERM
    handler), stopped and closed on the way out."""
    worker = RewardWorker(spec, address, 1)
    worker.scorer = make_scorer(spec)
    worker.consumer = Consumer.join(address, tasks_for(spec))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop.set()
        thread.join(10)
        worker.close()


def trained(tq: TransferQueueClient, texts) -> Counter:
    """Every row the trainer claims, by index, its reward checked against the rule."""
    seen = Counter()
    for step in range(STEPS):
        batch = tq.claim_get("train", ROWS, ["reward", "reward_error"], policy="group",
                             partition=step, min_count=ROWS, wait=10.0)
        got = batch.data
        for i, reward, error in zip(batch.indices, got["reward"], got["reward_error"]):
            response, answer = texts[i]
            assert float(reward) == np.float32(ARITH("", response, answer)) and not error
            seen[i] += 1
        tq.ack(batch)
    return seen


def check(tq, texts, worker, victim_claimed: int) -> None:
    reward = {s.name: s for s in tq.stats().tasks}["reward"]
    assert reward.acked == STEPS * ROWS and reward.expired >= victim_claimed
    seen = trained(tq, texts)
    assert sorted(seen) == sorted(texts) and max(seen.values()) == 1
    assert worker.scored == STEPS * ROWS


def test_a_reward_model_behind_the_rule_s_gate_scores_the_rows_it_lets_through(
        redis_units, tmp_path):
    """reward.model with combine gate: a row whose rule scored below the threshold keeps
    the rule's score, the others get the classifier's probability, as the model gives
    it for that text alone; every row once."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rljob.inputs.models import CharTokenizer

    model_dir = zoo.reward_classifier(tmp_path / "rm")
    path = job_file(tmp_path, "http://unused/", "gate")
    doc = yaml.safe_load(path.read_text())
    del doc["spec"]["reward"]["url"]
    doc["spec"]["reward"].update({"model": {"path": str(model_dir), "tokenizer": "builtin:char",
                                            "dtype": "float32"},
                                  "combine": "gate", "gateThreshold": 1.0})
    path.write_text(yaml.safe_dump(doc))
    spec = spec_of(path)
    server = TQServer(redis_units, lease_seconds=5)
    try:
        with TransferQueueClient(server.address) as tq, \
                replica_thread(spec, server.address) as worker:
            texts = fill(tq, spec)
            until(lambda: worker.scored == STEPS * ROWS)
            model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
            tok, asked = CharTokenizer(), 0
            for step in range(STEPS):
                batch = tq.claim_get("train", ROWS, ["reward", "prompt", "rule_reward"],
                                     policy="group", partition=step, min_count=ROWS, wait=10)
                for i, reward, prompt, rule in zip(batch.indices, batch.data["reward"],
                                                   batch.data["prompt"],
                                                   batch.data["rule_reward"]):
                    if rule < 1.0:
                        assert reward == rule
                        continue
                    asked += 1
                    ids = torch.tensor([tok.encode(prompt + texts[i][0])])
                    with torch.inference_mode():
                        p = torch.softmax(model(input_ids=ids).logits, -1)[0, 1].item()
                    assert abs(float(reward) - p) < 1e-5
                tq.ack(batch)
            assert 0 < asked < STEPS * ROWS
    finally:
        server.stop()
