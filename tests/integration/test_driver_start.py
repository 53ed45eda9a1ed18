"""The driver's start (workflow/driver.py `init_engines`) against the real weight
service over gRPC: it waits for a trainer that answers but has published nothing yet
(a warm-up longer than its time-out: seen on a loaded 2-core machine, where a
270-step warm-up took 20 min and the driver gave up at 10), and gives up on one that
does not answer, or on replicas that never load the published weights."""

from __future__ import annotations

import threading
import time

import pytest

from rljob.api.spec import RLJobSpec
from rljob.infra.netutil import free_port
from rljob.weights import WeightClient
from rljob.weights.sender import WeightSender
from rljob.workflow.driver import Workflow

SPEC = RLJobSpec.model_validate({
    "model": {"path": "random:examples/models/tiny-qwen2", "tokenizer": "builtin:char"},
    "dataset": {"path": "examples/data/arith.jsonl"}})


class Registry:
    """The TransferQueue client's part the start uses (registering the job's tasks);
    what it registers is the TransferQueue tier's to test."""

    def register(self, *tasks) -> None:
        pass


def flow(address: str) -> Workflow:
    return Workflow(SPEC, Registry(), WeightClient(address), tokenizer=None)


def test_a_trainer_still_warming_up_is_waited_for_past_the_time_out():
    address = f"127.0.0.1:{free_port()}"
    sender = WeightSender(address)
    client = WeightClient(address)
    try:
        def trainer_then_replica():
            time.sleep(2.5)  # the warm-up: 2.5 s against a 1 s time-out
            sender.publish(0, [])
            time.sleep(0.5)
            client.report("rollout-0", 0)

        threading.Thread(target=trainer_then_replica, daemon=True).start()
        t = time.monotonic()
        flow(address).init_engines(timeout=1.0, poll=0.05)
        assert time.monotonic() - t >= 2.9
    finally:
        sender.stop()


def test_weights_no_replica_loads_and_a_silent_trainer_end_the_wait():
    address = f"127.0.0.1:{free_port()}"
    sender = WeightSender(address)
    try:
        sender.publish(3, [])
        with pytest.raises(TimeoutError, match=r"no rollout replica loaded weights v3 within 1 s"):
            flow(address).init_engines(timeout=1.0, poll=0.05)
    finally:
        sender.stop()
    with pytest.raises(TimeoutError, match="the trainer's weight service did not answer for 1 s"):
        flow(address).init_engines(timeout=1.0, poll=0.05)
