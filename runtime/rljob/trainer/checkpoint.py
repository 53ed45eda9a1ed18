"""The trainer's optimizer and checkpoints: AdamW (ZeRO-1 over several
data-parallel ranks), a version checkpointed and then the rows it holds acked
(`commit`), and the newest complete checkpoint restored (`restore`)."""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from ..infra.rundir import RunDir
from ..transferqueue import TransferQueueClient
from ..transferqueue.dataplane import TransferQueueError
from ..transferqueue.consumer import Consumer, ride_out
from .lineage import Lineage

log = logging.getLogger("rljob.trainer")


def make_optimizer(policy, lr: float) -> torch.optim.Optimizer:
    """AdamW on the float32 master weights. Over several data-parallel ranks it is
    ZeRO-1 (`ZeroRedundancyOptimizer`): each rank keeps the optimizer state of its
    share of the parameters only, steps that share and broadcasts it; the update
    is the same as unsharded AdamW's."""
    params = list(policy.parameters())
    if policy.data_world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=policy.data_group, lr=lr,
                                       weight_decay=0.0)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of optimizer state this rank holds (its shard under ZeRO)."""
    inner = getattr(opt, "optim", opt)
    return sum(v.numel() * v.element_size() for st in inner.state.values()
               for v in st.values() if torch.is_tensor(v))


def commit(run, version, policy, opt, rank, world, consumer: Consumer | None, batches,
           lineage: Lineage) -> None:
    """Checkpoint `version`, then ack the rows it holds: they are consumed for good
    (rank 0, the step's `consumer`)."""
    if run and hasattr(opt, "consolidate_state_dict"):
        opt.consolidate_state_dict(to=0)  # ZeRO, collective: the whole state to the saver
    if run and policy.saves_checkpoint(rank):
        _checkpoint(run, version, policy, opt, lineage)
    if world > 1:
        dist.barrier()  # every shard is on disk before the rows are acked
    if rank != 0:
        return
    for batch in batches:
        consumer.keeper.drop(batch)
        _ack_trained(consumer.tq, batch)


def _ack_trained(tq: TransferQueueClient, batch) -> None:
    """Ack rows a checkpoint now holds, riding out a controller restart. A lease that
    expired meanwhile (this process was paused) gave its rows back to `train`: they
    are in the checkpoint, so they are claimed again and acked, never retrained."""
    retried: list = []  # the controller was away meanwhile
    try:
        ride_out(lambda: tq.ack(batch), away=retried.append)
        return
    except TransferQueueError as exc:
        if retried and "not held" in exc.message:
            return  # the ack before the controller restarted went through
        if "not held" not in exc.message:
            raise
    step = batch.rows[0].partition
    want = set(batch.indices)
    log.warning("the lease of %d trained rows of step %d expired: acking them again",
                len(want), step)
    deadline = time.monotonic() + 60
    while want and time.monotonic() < deadline:
        again = tq.claim("train", 1 << 14, partition=step, wait=1.0, min_count=1)
        mine = [i for i in again.indices if i in want]
        if mine:
            tq.ack(again, mine)
            want -= set(mine)
        if len(mine) < len(again.indices):
            tq.release(again)  # rows of another batch of the step


def _checkpoint(run: RunDir, version: int, policy, opt, lineage: Lineage) -> None:
    path = run.checkpoint(version)
    path.mkdir(parents=True, exist_ok=True)
    name = policy.checkpoint_name()
    tmp = path / f"{name}.partial"
    torch.save({**policy.checkpoint_state(), "optimizer": opt.state_dict(), "step": version,
                "lineage": lineage.at(version)}, tmp)
    tmp.rename(path / name)


def restore(run: RunDir | None, policy, resume: bool, map_location
            ) -> tuple[int, dict | None, dict | None, dict | None]:
    """From the newest complete checkpoint (with `resume`): the step it holds, the
    reference weights, the optimizer state and the recorded lineage (0 and Nones
    without one)."""
    name = policy.checkpoint_name()
    # a checkpoint cut short by a kill has only its .partial file: not counted
    done = run.checkpoint_steps(name) if resume and run else []
    if not done:
        return 0, None, None, None
    ck = torch.load(run.checkpoint(done[-1]) / name, weights_only=True,
                    map_location=map_location)
    ref_state = policy.load_checkpoint(ck)
    return ck["step"], ref_state, ck["optimizer"], ck.get("lineage")
