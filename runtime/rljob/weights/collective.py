"""The collective weight path (`workflow.weightTransport: collective`): the trainer's
rank 0 and every rank of a rollout replica's engine form a process group of their
own (gloo on CPU, NCCL on GPU, HCCL on Ascend), and each weight version is
broadcast from rank 0 in a few large buckets straight from device memory.

A replica hosts its group's rendezvous store (a `TCPStore` on its own address) and
asks the sender to join (`WeightService.Join`); the sender answers each
`Broadcast` request with the version's plan (where each tensor lies in which
bucket) and then broadcasts the buckets, which the replica's ranks receive into
buffers of their own device. gRPC stays the control plane (versions, epochs,
reports) and the data path across clusters (`weightTransport: grpc`).

Admission: the store asks no credential (torch.distributed's stores have none), so the
ranks meet under a prefix only the job's processes can name: the group's name (public:
logged, sent in `Join`) and an HMAC of it under the job's token (`store_prefix`). A
caller without the token who reaches the store sees no key of the group and cannot
take a rank in it.

Memory: the sender packs a version into host buckets one tensor at a time and
stages one bucket at a time on its device to broadcast it; a receiver holds one
bucket on its device beyond what it keeps (`receive_stream`: a tensor-parallel
worker keeps its shard; `receive`: a whole-model engine keeps a host copy).

Pure parts: `plan_buckets` (layout), `unpack` (buckets → tensors);
the process groups are torch.distributed's own backends, made without a default
group (`new_group`), so a trainer rank already in its gang's group can join a
group per replica.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

BUCKET_BYTES = 256 << 20
# accelerator.type → torch.distributed backend of the weight groups
BACKENDS = {"cpu": "gloo", "gpu": "nccl", "ascend": "hccl"}


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies: bytes [offset, offset + nbytes) of bucket `bucket`."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _offset(size: int, n: int, bucket_bytes: int) -> int | None:
    """Where a tensor of `n` bytes starts in a bucket filled to `size` bytes (a
    multiple of 16), or None when it opens the next bucket: a full bucket's size
    would pass `bucket_bytes` (a larger tensor gets a bucket of its own) (pure)."""
    start = -(-size // 16) * 16
    return None if size and start + n > bucket_bytes else start


def plan_buckets(state: dict[str, torch.Tensor], bucket_bytes: int = BUCKET_BYTES
                 ) -> tuple[list[Slot], list[int]]:
    """Tensors in order into buckets of at most `bucket_bytes` (a larger tensor gets a
    bucket of its own); each tensor starts at a multiple of 16 bytes. Returns the
    slots and each bucket's size (pure)."""
    slots: list[Slot] = []
    sizes: list[int] = []
    for name, t in state.items():
        n = _nbytes(t)
        start = _offset(sizes[-1], n, bucket_bytes) if sizes else None
        if start is None:
            sizes.append(0)
            start = 0
        slots.append(Slot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape),
                          len(sizes) - 1, start, n))
        sizes[-1] = start + n
    return slots, sizes


def pack(tensors, bucket_bytes: int = BUCKET_BYTES) -> tuple[list[Slot], list[torch.Tensor]]:
    """A host copy of `tensors` (a dict, or (name, tensor) pairs given one at a time)
    in byte buckets laid out as `plan_buckets` does (`_offset`): one snapshot, which replicas
    receive while the trainer goes on training. Holds at most one bucket's tensors
    besides the buckets already packed, so a stream of freshly made tensors (a
    gathered shard, a cast to the compute dtype) costs its device one bucket, not a
    model. Buckets of an accelerator's tensors are in pinned memory (fast copies)."""
    items = tensors.items() if isinstance(tensors, dict) else tensors
    slots: list[Slot] = []
    buckets: list[torch.Tensor] = []
    pending: list[tuple[Slot, torch.Tensor]] = []
    size = 0

    def close() -> None:
        pin = pending[0][1].device.type != "cpu"
        bucket = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        for slot, t in pending:
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            bucket[slot.offset:slot.offset + slot.nbytes].copy_(flat)
        buckets.append(bucket)
        pending.clear()

    for name, t in items:
        n = _nbytes(t)
        start = _offset(size, n, bucket_bytes) if pending else 0
        if start is None:
            close()
            start = 0
        slot = Slot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), len(buckets),
                    start, n)
        slots.append(slot)
        pending.append((slot, t))
        size = start + n
    if pending:
        close()
    return slots, buckets


def _view(s: Slot, bucket: torch.Tensor) -> torch.Tensor:
    return bucket[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype)).reshape(s.shape)


def unpack(slots: list[Slot], buckets: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of `slots` as views into `buckets` (no copy)."""
    return {s.name: _view(s, buckets[s.bucket]) for s in slots}


def device_of(backend: str) -> torch.device:
    """Where a rank of a `backend` group keeps its buckets."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "hccl":
        return torch.device("npu", torch.npu.current_device())  # torch_npu registers it
    return torch.device("cpu")


def store_prefix(name: str, token: str | None) -> str:
    """Where the ranks of group `name` meet in its store: under the job's `token`, a
    prefix nobody without the token can derive (pure; no token: `name` itself)."""
    if not token:
        return name
    return f"{name}/{hmac.new(token.encode(), name.encode(), hashlib.sha256).hexdigest()}"


def source_address(host: str) -> str:
    """This host's address on the route toward `host` (the one `host` reaches us at)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host or "127.0.0.1", 9))  # sends nothing: only picks the route
        return s.getsockname()[0]


def open_store(toward: str, timeout: float = 600.0):
    """A rendezvous store on a free port of this host's address toward `toward`
    (host:port of the sender: the address it can reach us at). Returns (store, "host:port")."""
    from torch.distributed import TCPStore

    me = source_address(toward.rsplit(":", 1)[0])
    store = TCPStore(me, 0, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=timeout))
    return store, f"{me}:{store.port}"


def new_group(backend: str, store_address: str, prefix: str, rank: int, world: int,
              timeout: float = 600.0):
    """A process group of `world` ranks apart from any default group, met at the
    store `store_address` (host:port) under `prefix`. Blocks until every rank has
    joined; a collective that waits longer than `timeout` s fails. Returns (group, store)."""
    from torch.distributed import PrefixStore, TCPStore

    host, port = store_address.rsplit(":", 1)
    wait = datetime.timedelta(seconds=timeout)
    # meeting the other ranks fails within 2 minutes (an unreachable address says so
    # soon); a collective may wait `timeout` (a replica draining its requests)
    store = TCPStore(host, int(port), is_master=False,
                     timeout=datetime.timedelta(seconds=min(timeout, 120.0)))
    pstore = PrefixStore(prefix, store)
    if backend == "gloo":
        # gloo's connections on the interface that reaches the store's host (its
        # default, the hostname's address, may be one the peers cannot reach)
        opts = torch.distributed.ProcessGroupGloo._Options()
        opts._timeout = wait
        opts._devices = [torch.distributed.ProcessGroupGloo.create_device(
            hostname=source_address(host))]
        group = torch.distributed.ProcessGroupGloo(pstore, rank, world, opts)
    elif backend == "nccl":
        opts = torch.distributed.ProcessGroupNCCL.Options()
        opts._timeout = wait
        group = torch.distributed.ProcessGroupNCCL(pstore, rank, world, opts)
    elif backend == "hccl":
        group = hccl_group_class()(pstore, rank, world, hccl_options(wait))
    else:
        raise ValueError(f"no weight group backend {backend!r}: one of gloo, nccl, hccl")
    return group, store


def broadcast(group, tensor: torch.Tensor, root: int = 0) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = root
    group.broadcast([tensor], opts).wait()


def receive(group, sizes: list[int], device: torch.device) -> list[torch.Tensor]:
    """A non-root rank's side of one version, kept in host memory: each bucket is
    received into `device` (NCCL and HCCL need device buffers) and moved to the host
    before the next, so the device holds one bucket beyond what it had."""
    buckets = []
    for size in sizes:
        b = torch.empty(size, dtype=torch.uint8, device=device)
        broadcast(group, b)
        buckets.append(b if b.device.type == "cpu" else b.to("cpu"))
    return buckets


def receive_stream(group, sizes: list[int], slots: list[Slot], device: torch.device,
                   seconds: list[float] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """A non-root rank's side of one version as a stream: bucket i is received into
    `device` and its tensors (views) are yielded before bucket i+1 is received, so a
    rank that keeps only its shard of what it is given (a tensor-parallel worker's
    weight loaders) holds one bucket beyond its shard, not the model. Every rank of
    the group must consume the stream to its end. The seconds spent receiving are
    added to `seconds[0]`."""
    by_bucket: list[list[Slot]] = [[] for _ in sizes]
    for s in slots:
        by_bucket[s.bucket].append(s)
    for size, mine in zip(sizes, by_bucket):
        t0 = time.monotonic()
        b = torch.empty(size, dtype=torch.uint8, device=device)
        broadcast(group, b)
        if b.device.type == "cuda":
            torch.cuda.synchronize(b.device)
        if seconds is not None:
            seconds[0] += time.monotonic() - t0
        for s in mine:
            yield s.name, _view(s, b)
        del b


def hccl_group_class():
    """torch_npu's HCCL process group. torch_npu binds it in its C extension, not on
    torch.distributed (vllm-ascend's platform imports it from there too)."""
    from torch_npu._C._distributed_c10d import ProcessGroupHCCL

    return ProcessGroupHCCL


def hccl_options(timeout: datetime.timedelta):
    """ProcessGroupHCCL's options: the timeout goes in them, as for NCCL."""
    opts = hccl_group_class().Options()
    opts._timeout = timeout
    return opts
