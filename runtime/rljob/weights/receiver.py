"""The replicas' side: `WeightReceiver` fetches or receives each version (through a
`WeightClient`, client.py) and loads it into the rollout engine (in the background
with weightSync async, at once with sync)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

import grpc
import torch

from ..infra import auth
from . import collective as coll
from .client import WeightClient

log = logging.getLogger("rljob.weights")


class WeightReceiver:
    """A rollout replica's side. A background thread long-polls the sender for the
    next version, receives it (gRPC into host memory, or a broadcast into device
    buffers) and swaps it into the engine under the engine lock, i.e. between two
    generations (AsyncFlow's delayed parameter update), or with weightUpdate
    interrupt through the engine's gate, at its next token boundary. An engine with
    processes of its own (vLLM) receives a broadcast in those processes, while its
    requests in flight drain. With `weightSync: sync` the rollout loop also
    refuses to generate with an older version than the newest published
    (`latest` + `wait_version`)."""

    def __init__(self, address: str, replica: str, mode: str = "async",
                 transport: str = "grpc", backend: str = "gloo",
                 merge: Callable[[dict], dict] | None = None):
        self.client = WeightClient(address)
        # model.lora for an engine that loads whole weights: each received version
        # (the adapter, the base with a life's first) merged (`adapter.AdapterMerge`)
        self.merge = merge
        self.replica = replica
        self.mode = mode
        self.transport, self.backend = transport, backend
        self.version = -1
        self.epoch = 0  # the sender life whose weights the engine holds
        self.lock = threading.Lock()  # held by the rollout while it generates
        self.swapped = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swap_seconds: list[tuple[float, float, int]] = []  # (start, end, version)
        self.drain_seconds: list[float] = []  # of each swap: waiting for generations in flight
        self.transfer_seconds: list[float] = []  # of each update: moving the bytes
        self.update_bytes: list[int] = []  # of each update (model.lora: the adapter's)
        self._store = self._group = self._group_name = None  # the collective path's
        # called in the receiving thread after each swap (the engine holds
        # `self.version`): the rollout moves its claims' release bound
        self.on_swap: Callable[[], None] | None = None

    def _update(self, engine, min_version: int, wait: float) -> int:
        """Receive the first version ≥ min_version (or any of a new sender life) and
        swap it in; grpc.RpcError when none comes within `wait` s."""
        if self.transport == "collective":
            return self._update_collective(engine, min_version, wait)
        version, state = self.client.fetch(min_version, wait, self.epoch)
        epoch = self.client.last_epoch
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        if self.merge is not None:
            state = self.merge(state)
        self._swap(engine, version, epoch, self.client.last_transfer_seconds,
                   lambda: engine.load_weights(state, version, epoch), nbytes)
        return version

    def _swap(self, engine, version: int, epoch: int, transfer: float | None, load,
              nbytes: int) -> None:
        t0 = time.time()
        if epoch != self.epoch and self.epoch:
            log.info("the trainer restarted: taking version %d of its new epoch "
                     "(held %d)", version, self.version)
        waited = [0.0]  # until the generation in progress let go of the weights
        ended = [0.0]  # once the weights are in: before a generation may start on them

        def swap_in() -> None:
            waited[0] = time.time() - t0
            load()
            ended[0] = time.time()
            self.version, self.epoch = version, epoch

        gate = getattr(engine, "gate", None)
        if gate is not None:  # weightUpdate interrupt: at the next token boundary
            gate.update(swap_in)
        else:
            with self.lock:  # drain: waits for the generation in progress to finish
                swap_in()
        self.swap_seconds.append((t0, ended[0], version))
        self.update_bytes.append(nbytes)
        log.info("loaded version %d (%.3f MB)", version, nbytes / 1e6)
        self.drain_seconds.append(engine.drain_seconds + waited[0])
        self.transfer_seconds.append(engine.transfer_seconds if transfer is None else transfer)
        with self.swapped:
            self.swapped.notify_all()
        if self.on_swap is not None:
            self.on_swap()

    def _join(self, engine) -> None:
        """A new weight group with the sender: rank 0 the sender, then the engine's
        ranks (this process's one when the engine has none of its own)."""
        if self._store is None:
            self._store, self._store_address = coll.open_store(self.client.address)
        name = f"{self.replica}.{secrets.token_hex(4)}"
        prefix = coll.store_prefix(name, auth.token_from_env())  # the job's ranks only
        ranks = engine.weight_ranks or 1
        log.info("joining weight group %s: store at %s, %d ranks", name, self._store_address,
                 1 + ranks)
        self.client.join(self.replica, name, self._store_address, 1 + ranks, self.backend)
        if engine.weight_ranks:
            engine.join_weight_group(self.backend, self._store_address, prefix, 1, 1 + ranks)
        else:
            self._group, self._group_store = coll.new_group(
                self.backend, self._store_address, prefix, 1, 1 + ranks)
        self._group_name = name
        log.info("joined weight group %s (%s, %d ranks)", name, self.backend, 1 + ranks)

    def _update_collective(self, engine, min_version: int, wait: float) -> int:
        if self._group_name is None:
            self._join(engine)
        plan = self.client.broadcast(self.replica, self._group_name, min_version, wait,
                                     self.epoch)
        slots = [coll.Slot(t.name, t.dtype, tuple(t.shape), t.bucket, t.offset, t.nbytes)
                 for t in plan.tensors]
        sizes, version, epoch = list(plan.buckets), plan.version, plan.epoch
        try:
            if engine.weight_ranks and self.merge is not None:
                raise ValueError("an engine that receives broadcasts in processes of its "
                                 "own loads no adapter to merge: weightTransport grpc")
            if engine.weight_ranks:  # its processes receive, while its requests drain
                self._swap(engine, version, epoch, None,
                           lambda: engine.load_broadcast(sizes, slots, version, epoch),
                           sum(s.nbytes for s in slots))
            else:  # received while generating goes on, swapped between generations
                t0 = time.monotonic()
                state = coll.unpack(slots, coll.receive(self._group, sizes,
                                                        engine.weight_device()))
                if self.merge is not None:
                    state = self.merge(state)
                self._swap(engine, version, epoch, time.monotonic() - t0,
                           lambda: engine.load_weights(state, version, epoch),
                           sum(s.nbytes for s in slots))
        except RuntimeError:  # the group broke (the sender died, or a transfer stalled)
            self._group = self._group_name = None
            raise
        return version

    def load_latest(self, engine, min_version: int = 0, wait: float = 600.0) -> int:
        """Block until a version ≥ min_version is loaded (a replica joining the run).
        A sender that answers but has published nothing yet (the trainer loads its
        checkpoint or warms up, as long as that takes) is waited for again after each
        `wait` s; an error of another kind, or a sender that does not answer, ends it."""
        while True:
            try:
                version = self._update(engine, min_version, wait)
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED or not self._unpublished():
                    raise
                log.info("the trainer has published no weights after %.0f s (loading or "
                         "warming up): waiting on", wait)
        self.client.report(self.replica, version, self.epoch)
        return version

    def _unpublished(self) -> bool:
        """Whether the sender answers and has published no version yet."""
        try:
            return self.client.latest_info().version < 0
        except grpc.RpcError:
            return False

    def start_background(self, engine, heartbeat: float = 2.0) -> None:
        def report(version: int) -> None:
            try:
                self.client.report(self.replica, version, self.epoch)
            except (grpc.RpcError, ValueError):  # ValueError: stop() closed the channel
                pass  # the trainer is away (restarting): the next heartbeat says it again

        def run():
            while not self._stop.is_set():
                try:
                    self._update(engine, self.version + 1, heartbeat)
                except (grpc.RpcError, ValueError, RuntimeError) as exc:
                    # ValueError: stop() closed the channel; RuntimeError: a weight
                    # group broke (joined anew on the next round)
                    if self._stop.is_set():
                        return  # stop() cancelled the fetch
                    code = exc.code() if isinstance(exc, grpc.RpcError) else None
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        self._group = self._group_name = None  # a new sender: join it
                    elif code not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.CANCELLED):  # the sender stopping
                        log.error("fetching weights failed (retrying): %s", exc)
                        self._stop.wait(1.0)
                    report(self.version)  # no new version yet: say we are alive
                    continue
                if not self._stop.is_set():
                    report(self.version)

        self._thread = threading.Thread(target=run, name="rljob-weight-receiver", daemon=True)
        self._thread.start()

    def latest(self) -> tuple[int, int]:
        """The newest (version, epoch) the sender has published; (-1, 0) while it is
        unreachable (a restarting trainer: generate with what we hold)."""
        try:
            info = self.client.latest_info()
            return info.version, info.epoch
        except grpc.RpcError:
            return -1, 0

    def holds(self, version: int, epoch: int = 0) -> bool:
        """Whether the engine holds `version` or newer (of `epoch`, when given)."""
        return self.version >= version and (not epoch or self.epoch == epoch)

    def wait_version(self, version: int, timeout: float = 600.0, epoch: int = 0) -> None:
        """Block until the engine holds `version` or newer of `epoch` (or `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self.swapped:
            while not self.holds(version, epoch) and time.monotonic() < deadline:
                self.swapped.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self.client.close()  # cancels the fetch in flight: the thread ends at once
        if self._thread:
            self._thread.join(timeout=5)
