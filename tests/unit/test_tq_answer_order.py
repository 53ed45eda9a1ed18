"""A write that makes rows ready replies after the claims it woke answered: the
writer's next ops (a replica's bound and next claim, sent the moment its write is
acknowledged) never come between the rows and the consumer waiting for them."""

from __future__ import annotations

import asyncio

from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.schema import ColumnSpec, TaskSpec
from rljob.transferqueue.service import TransferQueueService
from rljob.transferqueue.units import UnitConfig
from rljob.transferqueue.wire import task_to_pb


def test_a_waiting_claim_is_answered_before_the_write_that_woke_it_replies():
    async def scenario() -> list[str]:
        svc = TransferQueueService("j", [UnitConfig("memory")])
        await svc._register(pb.RegisterTaskRequest(tasks=[
            task_to_pb(TaskSpec("gen", frozenset(), (ColumnSpec("x", "json"),))),
            task_to_pb(TaskSpec("train", frozenset({"x"}), ()))]))
        start = (await svc._reserve(pb.ReserveRequest(count=4))).start
        order: list[str] = []
        claim = asyncio.create_task(svc._claim(pb.ClaimRequest(task="train", count=4,
                                                               wait_seconds=5.0)))
        claim.add_done_callback(lambda _: order.append("claim answered"))
        await asyncio.sleep(0.05)
        assert not claim.done()  # nothing ready: it waits
        written = await svc._notify(pb.NotifyWrittenRequest(
            indices=range(start, start + 4), columns=["x"], create=True, partition=0,
            group_size=1))
        order.append("write replied")
        assert written.newly_ready == 4
        assert list((await claim).rows.index) == list(range(start, start + 4))
        return order

    assert asyncio.run(scenario()) == ["claim answered", "write replied"]
