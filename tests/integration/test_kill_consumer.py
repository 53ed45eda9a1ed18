"""A consumer SIGKILLed mid-batch: every row is still trained exactly once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from rljob.transferqueue import TaskSpec, TransferQueueClient, tensor
from tests.integration.conftest import TQServer

HERE = Path(__file__).parent
ROWS = 96


def consumer(address, log, *extra):
    return subprocess.Popen([sys.executable, str(HERE / "consumer_proc.py"), address, str(log),
                             *extra])


def test_sigkilled_consumer_loses_nothing_and_duplicates_nothing(redis_units, tmp_path):
    server = TQServer(redis_units, lease_seconds=1.5)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(TaskSpec("driver", (), [tensor("payload", "int64")]),
                       TaskSpec("train", ["payload"]))
            for step in range(ROWS // 32):
                n0 = step * 32
                c.put(step, {"payload": [np.full(1024, n0 + i, np.int64) for i in range(32)]})
            marker = tmp_path / "victim.inflight"
            victim = consumer(server.address, tmp_path / "victim.log", "--hang-on-batch", "2",
                              "--marker", str(marker))
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert time.monotonic() < deadline and victim.poll() is None
                time.sleep(0.02)
            inflight = [int(i) for i in marker.read_text().split(",")]
            survivor = consumer(server.address, tmp_path / "survivor.log")
            victim.kill()  # SIGKILL mid-batch: no ack, no release, no goodbye
            victim.wait()
            assert survivor.wait(timeout=120) == 0

            trained = Counter()
            for log in ("victim.log", "survivor.log"):
                trained.update(int(x) for x in (tmp_path / log).read_text().split())
            assert sorted(trained) == list(range(ROWS)), "rows lost"
            assert max(trained.values()) == 1, f"trained twice: {[i for i, n in trained.items() if n > 1]}"
            assert all(trained[i] == 1 for i in inflight)
            victim_rows = (tmp_path / "victim.log").read_text().split()
            assert len(victim_rows) == 8  # its first batch, acked before the kill
            stats = c.stats()
            train = {s.name: s for s in stats.tasks}["train"]
            # the batch in hand and the ones prefetched behind it came back by lease expiry
            assert train.acked == ROWS and train.expired >= len(inflight)
            assert stats.rows == 0 and stats.cleared_partitions == ROWS // 32
    finally:
        server.stop()
