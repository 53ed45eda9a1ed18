"""Weight sync over real gRPC on loopback: WeightSender (trainer rank 0) →
WeightReceiver (a rollout replica), versions, chunking, replica reports, and
shutdown that does not hang on a long poll; and the collective path: a real gloo
process group per replica, versions broadcast in buckets."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch

from rljob.infra.netutil import free_port
from rljob.weights import CHUNK, WeightClient, WeightReceiver, WeightSender


class Engine:
    """What the receiver needs from a rollout engine: load_weights + version."""

    weight_ranks = 0  # receives broadcasts in the receiver's process

    def __init__(self):
        self.version = -1
        self.epoch = 0
        self.drain_seconds = 0.0
        self.transfer_seconds = 0.0
        self.state: dict[str, torch.Tensor] = {}
        self.loads = 0

    def load_weights(self, state, version, epoch=0):
        self.state = {k: v.clone() for k, v in state.items()}
        self.version, self.epoch = version, epoch
        self.loads += 1

    def weight_device(self):
        return torch.device("cpu")


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        # small ones go together in a message (`WeightChunk.along`), before and after
        # a tensor larger than one chunk, which goes in several messages and is joined
        "norm": torch.randn(16, generator=g),
        "big": torch.randn(CHUNK // 4 + 1000, generator=g),
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "ints": torch.arange(7, dtype=torch.int64).reshape(7, 1) * seed,
        "empty": torch.zeros(0, 4),
    }


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name


@pytest.fixture
def sender():
    s = WeightSender(f"127.0.0.1:{free_port()}")
    yield s
    s.stop(grace=0)


def test_versions_stream_to_a_replica_and_it_reports_them(sender):
    address = f"127.0.0.1:{sender.port}"
    sender.publish(0, weights(0))
    engine = Engine()
    receiver = WeightReceiver(address, "rollout-0", mode="async")
    assert receiver.load_latest(engine) == 0  # a replica joining: the newest version first
    assert_same(engine.state, weights(0))
    assert sender.wait_replicas(0, timeout=10)
    receiver.start_background(engine, heartbeat=60)  # long polls: stop() must cut them
    try:
        for v in (1, 2):
            sender.publish(v, weights(v))
            receiver.wait_version(v, timeout=30)
            assert engine.version == v and receiver.version == v
            assert_same(engine.state, weights(v))
            assert sender.wait_replicas(v, timeout=10)
        client = WeightClient(address)
        status = client.status(wait_version=2, wait=10)
        assert status.version == 2
        assert [(r.replica, r.version) for r in status.replicas] == [("rollout-0", 2)]
        assert client.latest() == 2
        client.close()
        # a version nobody reached yet: the wait gives up and says so
        assert not sender.wait_replicas(3, timeout=0.3)
        started = time.monotonic()  # `live`: a live replica is waited for all the same
        assert not sender.wait_replicas(3, timeout=0.3, live=True)
        assert time.monotonic() - started >= 0.3
    finally:
        receiver.stop()
    assert not receiver._thread.is_alive()  # stop cancelled its long poll
    assert engine.loads == 3


def test_with_no_replica_live_a_wait_for_replicas_that_asks_so_ends_at_once(sender):
    """A trainer's figures wait for the replicas to hold the step's weights (on
    policy), not for replicas that are not there."""
    sender.publish(0, weights(0))
    started = time.monotonic()
    assert not sender.wait_replicas(0, timeout=10, live=True)
    assert time.monotonic() - started < 5
    assert not sender.wait_replicas(0, timeout=0.2)  # without: the whole timeout


def test_a_fetch_of_a_version_not_yet_published_waits_for_it(sender):
    sender.publish(4, weights(4))
    client = WeightClient(f"127.0.0.1:{sender.port}")
    got = {}

    def fetch():
        got["version"], got["state"] = client.fetch(min_version=5, wait=30)

    t = threading.Thread(target=fetch)
    t.start()
    t.join(0.3)
    assert t.is_alive()  # version 4 is too old for this fetch
    sender.publish(5, weights(5))
    t.join(30)
    assert got["version"] == 5
    assert_same(got["state"], weights(5))
    with pytest.raises(grpc.RpcError) as err:
        client.fetch(min_version=6, wait=0.2)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "version 6 not published" in err.value.details()
    client.close()


def test_stopping_the_sender_ends_waiting_fetches_at_once():
    sender = WeightSender(f"127.0.0.1:{free_port()}")
    sender.publish(0, weights(0))
    client = WeightClient(f"127.0.0.1:{sender.port}")
    errors = []

    def fetch():
        try:
            client.fetch(min_version=1, wait=600)
        except grpc.RpcError as exc:
            errors.append(exc)

    t = threading.Thread(target=fetch)
    t.start()
    t.join(0.3)
    assert t.is_alive()
    sender.stop(grace=20)  # a waiting fetch is not a transfer: it ends now, not after grace
    t.join(30)
    assert not t.is_alive()
    assert errors and errors[0].code() == grpc.StatusCode.UNAVAILABLE
    client.close()


def test_a_replica_keeps_receiving_across_a_trainer_restart():
    """The sender goes away (trainer pod restarts) and comes back on the same
    address: the replica's background receiver reconnects and takes the next
    version, instead of dying with the first failed call."""
    port = free_port()
    first = WeightSender(f"127.0.0.1:{port}")
    first.publish(0, weights(0))
    engine = Engine()
    receiver = WeightReceiver(f"127.0.0.1:{port}", "rollout-0", mode="sync")
    receiver.load_latest(engine)
    receiver.start_background(engine, heartbeat=0.5)
    try:
        first.publish(1, weights(1))
        receiver.wait_version(1, timeout=30)
        assert engine.version == 1
        first.stop(grace=0)
        t = threading.Event()
        t.wait(1.5)  # heartbeats fail while no trainer listens
        assert receiver._thread.is_alive()
        second = WeightSender(f"127.0.0.1:{port}")  # resumed from the step-1 checkpoint
        try:
            second.publish(2, weights(2))
            receiver.wait_version(2, timeout=30)
            assert engine.version == 2
            assert_same(engine.state, weights(2))
            assert second.wait_replicas(2, timeout=10)
        finally:
            second.stop(grace=0)
    finally:
        receiver.stop()


def test_a_restored_trainer_takes_the_replicas_back_to_its_checkpoint():
    """A trainer restored from the checkpoint of version 1 publishes version 1 under a
    new epoch while the replica holds version 3 of the dead life: the replica takes
    version 1 at once (no waiting for a version 4), and until it has, the new sender
    counts it as holding nothing."""
    port = free_port()
    first = WeightSender(f"127.0.0.1:{port}", epoch=11)
    first.publish(3, weights(3))
    engine = Engine()
    receiver = WeightReceiver(f"127.0.0.1:{port}", "rollout-0", mode="async")
    receiver.load_latest(engine)
    assert (receiver.version, receiver.epoch) == (3, 11)
    first.stop(grace=0)
    second = WeightSender(f"127.0.0.1:{port}", epoch=12)
    client = WeightClient(f"127.0.0.1:{port}")
    try:
        client.report("rollout-0", 3, 11)  # what the replica says before it swaps
        assert [r.version for r in second._fresh(10)] == [-1]
        second.publish(1, weights(1))
        receiver.start_background(engine, heartbeat=0.5)
        receiver.wait_version(1, timeout=30, epoch=12)
        assert (engine.version, receiver.epoch) == (1, 12)
        assert_same(engine.state, weights(1))
        assert second.wait_replicas(1, timeout=10)
        assert receiver.latest() == (1, 12)
    finally:
        client.close()
        receiver.stop()
        second.stop(grace=0)


class FlakySender(WeightSender):
    """Refuses replica reports until told otherwise (an overloaded or restarting
    trainer answers some calls and not others)."""

    refuse = True

    def Report(self, request, context):
        if self.refuse:
            context.abort(grpc.StatusCode.INTERNAL, "not now")
        return super().Report(request, context)


def test_a_refused_report_does_not_stop_the_receiver():
    sender = FlakySender(f"127.0.0.1:{free_port()}")
    sender.publish(0, weights(0))
    engine = Engine()
    receiver = WeightReceiver(f"127.0.0.1:{sender.port}", "rollout-0", mode="async")
    receiver.start_background(engine, heartbeat=0.5)
    try:
        receiver.wait_version(0, timeout=30)  # swapped in; its report was refused
        assert engine.version == 0
        sender.publish(1, weights(1))
        receiver.wait_version(1, timeout=30)
        assert engine.version == 1 and receiver._thread.is_alive()
        sender.refuse = False
        assert sender.wait_replicas(1, timeout=10)  # the next heartbeat got through
    finally:
        receiver.stop()
        sender.stop(grace=0)


def test_collective_versions_reach_a_replica_bit_exact():
    """weightTransport collective: the replica joins a gloo group of its own with the
    sender, each version arrives as a broadcast of several buckets (a small bucket
    size here) and equals what was published, bit for bit; a gRPC fetch of the same
    version (another cluster's replica) still works."""
    sender = WeightSender(f"127.0.0.1:{free_port()}", transport="collective",
                          bucket_bytes=1 << 20)
    address = f"127.0.0.1:{sender.port}"
    engine = Engine()
    receiver = WeightReceiver(address, "rollout-0", mode="async", transport="collective",
                              backend="gloo")
    client = WeightClient(address)
    try:
        sender.publish(0, weights(0))
        assert len(sender._latest.buckets) >= 2
        assert receiver.load_latest(engine) == 0
        assert_same(engine.state, weights(0))
        receiver.start_background(engine, heartbeat=0.5)
        for v in (1, 2, 3):
            sender.publish(v, weights(v))
            receiver.wait_version(v, timeout=30)
            assert engine.version == v
            assert_same(engine.state, weights(v))
        assert sender.wait_replicas(3, timeout=10)
        assert len(receiver.transfer_seconds) == engine.loads == 4
        assert all(t > 0 for t in receiver.transfer_seconds)
        version, state = client.fetch(3, wait=10)
        assert version == 3
        assert_same(state, weights(3))
    finally:
        client.close()
        receiver.stop()
        sender.stop(grace=0)


def test_a_collective_group_admits_only_the_jobs_ranks():
    """The replica's store asks no credential: a caller that reaches it and knows the
    group's name (it is logged and sent in Join) tries to take rank 0 while the
    replica's rank waits for it, and cannot, since the ranks meet under a prefix
    derived from the job's token; the sender, which has the token, joins right after
    and broadcasts."""
    from concurrent.futures import ThreadPoolExecutor

    from rljob.weights import collective as coll

    token, name = "the-jobs-token", "rollout-0.1a2b3c4d"
    prefix = coll.store_prefix(name, token)
    assert prefix.startswith(f"{name}/") and token not in prefix
    assert coll.store_prefix(name, None) == name
    store, address = coll.open_store("127.0.0.1:1")
    with ThreadPoolExecutor(1) as pool:
        replica = pool.submit(coll.new_group, "gloo", address, prefix, 1, 2, 60.0)
        for tried in (name, coll.store_prefix(name, "another-jobs-token")):
            t = time.monotonic()
            with pytest.raises(Exception, match="(?i)timeout|timed out"):
                coll.new_group("gloo", address, tried, 0, 2, timeout=3.0)
            print(f"\nan outsider at {tried[:32]!r}...: no group after "
                  f"{time.monotonic() - t:.1f}s")
        assert not replica.done()  # the replica's rank still waits for its sender
        sender, _ = coll.new_group("gloo", address, prefix, 0, 2, 60.0)
        group, _ = replica.result(timeout=60)
        sent = torch.arange(8, dtype=torch.float32)
        got = torch.zeros(8)
        done = pool.submit(coll.broadcast, group, got)
        coll.broadcast(sender, sent)
        done.result(timeout=60)
        assert torch.equal(got, sent)
    del store


def test_a_collective_replica_joins_the_restarted_trainer():
    """The trainer dies and a new one (new epoch, no groups) serves the same address:
    the replica's broadcast request is refused, it joins the new sender's group
    and takes the new life's version."""
    port = free_port()
    first = WeightSender(f"127.0.0.1:{port}", epoch=21, transport="collective")
    first.publish(4, weights(4))
    engine = Engine()
    receiver = WeightReceiver(f"127.0.0.1:{port}", "rollout-0", transport="collective")
    receiver.load_latest(engine)
    first_group = receiver._group_name
    first.stop(grace=0)
    second = WeightSender(f"127.0.0.1:{port}", epoch=22, transport="collective")
    try:
        second.publish(2, weights(2))
        receiver.start_background(engine, heartbeat=0.5)
        receiver.wait_version(2, timeout=60, epoch=22)
        assert (engine.version, receiver.epoch) == (2, 22)
        assert_same(engine.state, weights(2))
        assert receiver._group_name not in (None, first_group)
        assert second.wait_replicas(2, timeout=10)
    finally:
        receiver.stop()
        second.stop(grace=0)


def test_bench_weights_prints_both_transports():
    """`rljob bench weights` (one layer, one measured round): both transports moved
    the whole version to the other process."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "weights", "--rounds", "1",
                          "--layers", "1", "--lora", "16", "--json"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    want = int(r["model"]["gb"] * 1e9)
    for name in ("grpc", "collective"):
        t = r["transports"][name]
        assert abs(t["bytes"] - want) <= 1 and t["transfer_seconds"] > 0, name
    assert r["collective_over_grpc"]["transfer_seconds"] > 0
    # a LoRA update of one layer: r (in + out) bf16 values for each of its 7 modules
    h, f, kv = 896, 4864, 128
    adapter = 16 * (4 * h + (h + kv) * 2 + 2 * (h + f) + (f + h)) * 2
    assert r["lora"]["grpc"]["bytes"] == adapter
    assert r["lora"]["bytes_over_full"] == adapter / r["transports"]["grpc"]["bytes"]


def test_the_weight_bench_counts_a_model_too_large_to_move_exactly():
    from rljob_bench.weights import MODELS, lora_shapes, nbytes, qwen2_shapes

    # Qwen2.5-7B: 7.62 B parameters (its model card), untied head; bfloat16
    full = nbytes(qwen2_shapes(MODELS["qwen2.5-7b"]), "bfloat16")
    assert full == 2 * 7_615_616_512
    # the quickstart model's 604,800 parameters (its tied head once), float32
    assert nbytes(qwen2_shapes(MODELS["quickstart"]), "float32") == 4 * 604_800
    assert nbytes(lora_shapes(MODELS["quickstart"], 8), "float32") == 4 * 65_536


def test_a_streamed_receive_takes_each_bucket_only_when_asked(monkeypatch):
    """A tensor-parallel worker's side of a broadcast (`receive_stream`, real gloo
    group of two): bucket i+1 is received only after bucket i's tensors were taken,
    so the worker holds one bucket beyond what it keeps; the tensors are bit-exact."""
    from rljob.weights import collective as coll

    want = weights(5)
    slots, buckets = coll.pack(iter(want.items()), bucket_bytes=1 << 20)
    assert len(buckets) >= 2
    store, address = coll.open_store("127.0.0.1:1")
    received = []
    real = coll.broadcast

    def counted(group, tensor, root=0):
        real(group, tensor, root)
        if threading.current_thread().name == "receiver":
            received.append(tensor.numel())

    monkeypatch.setattr(coll, "broadcast", counted)

    def send():
        group, _ = coll.new_group("gloo", address, "t", 0, 2, timeout=30)
        for b in buckets:
            coll.broadcast(group, b)

    got, seen_at = {}, {}

    def take():
        group, _ = coll.new_group("gloo", address, "t", 1, 2, timeout=30)
        seconds = [0.0]
        for name, t in coll.receive_stream(group, [b.numel() for b in buckets], slots,
                                           torch.device("cpu"), seconds):
            seen_at[name] = len(received)
            got[name] = t.clone()
        assert seconds[0] > 0

    sender = threading.Thread(target=send)
    receiver = threading.Thread(target=take, name="receiver")
    sender.start(), receiver.start()
    sender.join(60), receiver.join(60)
    assert_same(got, want)
    # each tensor was handed over when only its own bucket (and those before) had come
    assert seen_at == {s.name: s.bucket + 1 for s in slots}
    del store


def test_a_version_published_as_a_stream_is_served_whole(sender):
    """`publish` takes (name, tensor) pairs one at a time (a trainer's `hf_tensors`)."""
    sender.publish(7, iter(weights(7).items()))
    client = WeightClient(f"127.0.0.1:{sender.port}")
    try:
        version, state = client.fetch(7, wait=10)
        assert version == 7
        assert_same(state, weights(7))
    finally:
        client.close()


def test_a_joining_replica_waits_out_a_warm_up_longer_than_its_wait(sender):
    """The trainer answers but publishes v0 only after its warm-up, here 2.5 s against
    a 1 s wait (on a loaded 2-core machine a 270-step warm-up took 20 min, and the
    replica used to give up at 10): the replica waits on and loads v0. A sender that
    published, but not the version asked for, still ends the wait."""
    address = f"127.0.0.1:{sender.port}"
    threading.Timer(2.5, lambda: sender.publish(0, weights(0))).start()
    engine = Engine()
    t = time.monotonic()
    assert WeightReceiver(address, "rollout-0", mode="async").load_latest(engine, wait=1.0) == 0
    assert time.monotonic() - t >= 2.4 and engine.version == 0
    assert_same(engine.state, weights(0))
    # a sender that has published, but not the version asked for: the wait ends
    late = WeightReceiver(address, "rollout-1", mode="async")
    with pytest.raises(grpc.RpcError, match="version 5 not published within 1.0s"):
        late.load_latest(Engine(), min_version=5, wait=1.0)


def adapter(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + seed)
    return {"layers.0.q_proj.lora_A.weight": torch.randn(4, 16, generator=g),
            "layers.0.q_proj.lora_B.weight": torch.randn(16, 4, generator=g)}


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@pytest.mark.parametrize("transport", ["grpc", "collective"])
def test_an_adapter_only_sync_sends_the_base_once_to_each_receiver_of_a_life(transport):
    """model.lora: the sender publishes the base with the first version and the adapter
    alone after it. A replica gets base + adapter first, then the adapter alone each
    version; a replica that joins later gets the base with the latest adapter; a new
    trainer life (another epoch) sends every replica its base again."""
    port = free_port()
    first = WeightSender(f"127.0.0.1:{port}", epoch=31, transport=transport,
                         bucket_bytes=1 << 20)
    base = weights(7)
    first.publish(0, adapter(0), base=base)
    engine, late = Engine(), Engine()
    receiver = WeightReceiver(f"127.0.0.1:{port}", "rollout-0", transport=transport)
    joiner = WeightReceiver(f"127.0.0.1:{port}", "rollout-1", transport=transport)
    second = None
    try:
        receiver.load_latest(engine)
        assert_same(engine.state, {**base, **adapter(0)})
        receiver.start_background(engine, heartbeat=0.5)
        for v in (1, 2):
            first.publish(v, adapter(v))
            receiver.wait_version(v, timeout=30)
            assert_same(engine.state, adapter(v))  # the adapter alone
        assert receiver.update_bytes == [nbytes(base) + nbytes(adapter(0)),
                                         nbytes(adapter(1)), nbytes(adapter(2))]
        assert first.Latest(None, None).total_bytes == nbytes(adapter(2))
        assert joiner.load_latest(late) == 2  # a replica added later
        assert_same(late.state, {**base, **adapter(2)})
        first.stop(grace=0)
        second = WeightSender(f"127.0.0.1:{port}", epoch=32, transport=transport,
                              bucket_bytes=1 << 20)
        second.publish(1, adapter(1), base=weights(8))  # restored from step 1
        receiver.wait_version(1, timeout=60, epoch=32)
        assert_same(engine.state, {**weights(8), **adapter(1)})
        second.publish(2, adapter(5))
        receiver.wait_version(2, timeout=30, epoch=32)
        assert_same(engine.state, adapter(5))
    finally:
        receiver.stop()
        joiner.stop()
        for s in (first, second):
            if s is not None:
                s.stop(grace=0)
