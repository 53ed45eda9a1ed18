"""Client side of the controller's Session stream: many operations, one stream.

Each operation is a message tagged with an id; results come back tagged with
the same id (a waiting claim may answer after later operations). A broken
stream fails the operations in flight with UNAVAILABLE and the next call opens
a new one. Per operation this costs a fraction of a unary gRPC call, on both
sides, which is what the data path pays per batch.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future

import grpc

from .proto import transferqueue_pb2 as pb

_STATUS = {s.value[0]: s for s in grpc.StatusCode}


def _result(res: pb.OpResult, kind: str, error_type):
    if res.code:
        raise error_type(_STATUS.get(res.code, grpc.StatusCode.UNKNOWN), res.error)
    return getattr(res, kind)


class _Stream:
    def __init__(self, stub, error_type):
        self.error_type = error_type
        self.pending: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.responses = stub.Session(self._iterate(), wait_for_ready=True)
        self.reader = threading.Thread(target=self._read, name="rljob-tq-session", daemon=True)
        self.reader.start()

    def _iterate(self):
        while (op := self.requests.get()) is not None:
            yield op

    def _read(self) -> None:
        try:
            for res in self.responses:
                with self.lock:
                    fut = self.pending.pop(res.id, None)
                if fut is not None:
                    fut.set_result(res)
            err = self.error_type(grpc.StatusCode.UNAVAILABLE, "session ended by the controller")
        except grpc.RpcError as exc:
            err = self.error_type(exc.code(), exc.details())
        with self.lock:
            self.closed = True
            pending, self.pending = self.pending, {}
        for fut in pending.values():
            fut.set_exception(err)

    def send(self, op: pb.Op, fut: Future) -> bool:
        with self.lock:
            if self.closed:
                return False
            self.pending[op.id] = fut
        self.requests.put(op)
        return True

    def close(self) -> None:
        self.requests.put(None)


class SyncSession:
    def __init__(self, stub, error_type):
        self._stub = stub
        self._error_type = error_type
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stream: _Stream | None = None
        self.generation = 0  # bumped per stream: a new stream may face a restarted controller

    def _current(self) -> _Stream:
        with self._lock:
            if self._stream is None or self._stream.closed:
                self._stream = _Stream(self._stub, self._error_type)
                self.generation += 1
            return self._stream

    def open(self) -> int:
        """Make sure a stream is open; returns its generation."""
        self._current()
        return self.generation

    def send(self, kind: str, request) -> Future:
        """Send one operation; the future resolves to its OpResult."""
        op = pb.Op(id=next(self._ids), **{kind: request})
        fut: Future = Future()
        while not self._current().send(op, fut):
            pass
        return fut

    def result(self, fut: Future, kind: str, timeout: float | None = 60.0):
        try:
            res = fut.result(timeout)
        except TimeoutError:
            raise self._error_type(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"no answer to {kind} within {timeout}s") from None
        return _result(res, kind, self._error_type)

    def call(self, kind: str, request, timeout: float | None = 60.0):
        return self.result(self.send(kind, request), kind, timeout)

    def close(self) -> None:
        with self._lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None

