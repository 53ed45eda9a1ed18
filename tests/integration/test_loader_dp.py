"""The stream loader in a data-parallel group: rank 0 pulls, gloo broadcasts."""

from __future__ import annotations

import json

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp

from rljob.transferqueue import TaskSpec, TransferQueueClient, tensor
from tests.integration.conftest import PASSWORD, TQServer, free_port


def _rank(rank: int, world: int, port: int, address: str, out: str) -> None:
    import os

    os.environ["RLJOB_TQ_PASSWORD"] = PASSWORD
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    from rljob.transferqueue.loader import stream_loader

    client = TransferQueueClient(address) if rank == 0 else None
    seen = []
    for batch in stream_loader(client, "train", ["ids"], 4, group=dist.group.WORLD,
                               max_batches=6, wait=2.0):
        seen.append([batch.indices, [int(x.sum()) for x in batch.data["ids"]]])
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


def test_one_rank_claims_and_every_rank_gets_the_same_batches(redis_units, tmp_path):
    server = TQServer(redis_units)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(TaskSpec("driver", (), [tensor("ids", "int64")]), TaskSpec("train", ["ids"]))
            c.put(0, {"ids": [np.arange(i + 1, dtype=np.int64) for i in range(24)]})
            out = str(tmp_path / "seen")
            mp.spawn(_rank, args=(2, free_port(), server.address, out), nprocs=2, join=True)
            seen0 = json.loads((tmp_path / "seen.0").read_text())
            seen1 = json.loads((tmp_path / "seen.1").read_text())
            assert seen0 == seen1 and len(seen0) == 6
            indices = sorted(i for b in seen0 for i in b[0])
            assert indices == list(range(24))
            assert [s for b in seen0 for s in b[1]] == [sum(range(i + 1)) for b in seen0 for i in b[0]]
            train = {s.name: s for s in c.stats().tasks}["train"]
            assert train.acked == 24 and train.claimed == 0
    finally:
        server.stop()
