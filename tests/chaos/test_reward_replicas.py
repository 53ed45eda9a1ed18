"""Reward replicas hurt mid-batch: real `rljob worker reward` processes on a real
TransferQueue over Redis, with a real scoring service on loopback. A replica
SIGKILLed mid-batch, or paused past its lease, loses no row and scores none twice:
the reward task acks every row once, and the trainer claims each once, with the
reward its rule gives (the service scores with the rule)."""

from __future__ import annotations

import os
import signal
import socket
import time

from rljob.transferqueue import TransferQueueClient
from tests.integration.conftest import (  # noqa: F401 - the units and their password
    TQServer, _password, redis_units)
from tests.integration.test_reward_task import (ROWS, STEPS, Served, check, fill, holds,
                                                job_file, replica, replica_thread, spec_of,
                                                until)


def test_a_reward_replica_killed_mid_batch_loses_and_doubles_nothing(redis_units, tmp_path):
    hang = socket.socket()  # a service that takes the call and never answers
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    served = Served()
    server = TQServer(redis_units, lease_seconds=1.5)
    try:
        victim_job = job_file(tmp_path, f"http://127.0.0.1:{hang.getsockname()[1]}/", "kill")
        spec = spec_of(job_file(tmp_path, served.url, "kill"))
        with TransferQueueClient(server.address) as tq:
            texts = fill(tq, spec)
            # the train task may not take a row before its reward is written
            assert not tq.claim("train", ROWS, policy="group", partition=0, wait=0.2).rows
            victim = replica(victim_job, server.address, "reward-victim", tmp_path / "v.log")
            until(lambda: holds(tq, "reward-victim"), proc=victim)
            claimed = sum(c.claimed for c in tq.stats().consumers if c.consumer == "reward-victim")
            victim.kill()  # SIGKILL mid-batch: no write, no release
            victim.wait()
            with replica_thread(spec, server.address) as worker:
                until(lambda: worker.scored == STEPS * ROWS)
                check(tq, texts, worker, claimed)
            assert claimed == 8  # its batch (reward.batchSize), given back by expiry
    finally:
        server.stop()
        served.close()
        hang.close()


def test_a_reward_replica_paused_past_its_lease_cannot_write(redis_units, tmp_path):
    slow, served = Served(delay=0.5), Served()
    server = TQServer(redis_units, lease_seconds=1.5)
    try:
        spec = spec_of(job_file(tmp_path, served.url, "pause"))
        victim_job = job_file(tmp_path, slow.url, "pause")
        log = tmp_path / "v.log"
        with TransferQueueClient(server.address) as tq:
            texts = fill(tq, spec)
            victim = replica(victim_job, server.address, "reward-victim", log)
            until(lambda: holds(tq, "reward-victim"), proc=victim)
            os.kill(victim.pid, signal.SIGSTOP)  # its calls take 0.5 s: it holds the batch
            claimed = sum(c.claimed for c in tq.stats().consumers if c.consumer == "reward-victim")
            time.sleep(3 * 1.5)  # three lease terms
            with replica_thread(spec, server.address) as worker:
                until(lambda: worker.scored == STEPS * ROWS)
                os.kill(victim.pid, signal.SIGCONT)  # its answers came: it writes, refused
                until(lambda: "dropped the rewards" in log.read_text(), proc=victim)
                victim.terminate()
                assert victim.wait(20) == 0
                check(tq, texts, worker, claimed)
            text = log.read_text()
            assert "is not held" in text or "no longer in the table" in text, text[-2000:]
            assert "scored 0 rows (8 dropped)" in text, text[-2000:]
    finally:
        server.stop()
        served.close()
        slow.close()
