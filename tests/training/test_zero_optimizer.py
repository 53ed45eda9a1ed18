"""The trainer's optimizer over two data-parallel ranks (real gloo processes):
ZeRO-1 shards AdamW's state, and its updates equal unsharded AdamW's bit for bit."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rljob.infra.netutil import free_port
from rljob.trainer.checkpoint import make_optimizer, optimizer_state_bytes


class _Policy:
    def __init__(self, model, world):
        self.model, self.data_world, self.data_group = model, world, None

    def parameters(self):
        return self.model.parameters()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 32),
                               torch.nn.Linear(32, 4))


def _steps(policy, opt, steps: int = 5) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        for p in policy.model.parameters():  # the same (all-reduced) gradient on every rank
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _rank(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    policy = _Policy(_model(), 2)
    opt = make_optimizer(policy, 1e-2)
    _steps(policy, opt)
    opt.consolidate_state_dict(to=0)  # what a checkpoint does
    full = None
    if rank == 0:  # numpy across the queue: tensors would share memory with an exited child
        full = {k: st["exp_avg_sq"].numpy() for k, st in opt.state_dict()["state"].items()}
    out.put((rank, optimizer_state_bytes(opt),
             [p.detach().numpy().copy() for p in policy.model.parameters()], full))
    dist.destroy_process_group()


def test_zero_shards_the_state_and_steps_like_adamw():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (n, params, full)) for r, n, params, full in
               (out.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)

    local = _Policy(_model(), 1)
    opt = make_optimizer(local, 1e-2)
    assert isinstance(opt, torch.optim.AdamW)
    _steps(local, opt)
    whole = optimizer_state_bytes(opt)
    for rank in (0, 1):
        n, params, _ = got[rank]
        assert all(torch.equal(torch.from_numpy(a), b)
                   for a, b in zip(params, local.model.parameters())), rank
        assert 0 < n < 0.8 * whole, (rank, n, whole)  # a shard of the state, not all of it
    assert got[0][0] + got[1][0] == whole
    # the consolidated state is the whole state, as unsharded AdamW has it
    full = got[0][2]
    assert sorted(full) == sorted(opt.state_dict()["state"])
    for k, st in opt.state_dict()["state"].items():
        assert torch.equal(torch.from_numpy(full[k]), st["exp_avg_sq"])
