"""The job's token on its gRPC endpoints (infra/auth.py), against real servers: the
TransferQueue controller (`rljob worker transferqueue`, its storage service too) and
the trainer's weight server refuse a caller without the job's token, or with another,
before anything is read or changed, and say who they refused."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rljob.contract import TOKEN_ENV
from rljob.infra import auth
from rljob.transferqueue import TransferQueueClient
from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg
from rljob.weights.client import WeightClient
from rljob.weights.proto import weights_pb2 as wpb
from rljob.weights.proto import weights_pb2_grpc as wpbg

from .conftest import TQServer

TOKEN = auth.new_token()


@pytest.fixture
def guarded():
    server = TQServer(None, token=TOKEN)
    yield server
    server.stop()


def _outsiders(address: str):
    """(what the caller presents, its channel): none, another job's, a malformed one,
    the right token twice over."""
    yield "no token", grpc.insecure_channel(address)
    yield "another job's token", auth.channel(address, token=auth.new_token())
    bare = auth._TokenChannel(grpc.insecure_channel(address), TOKEN)
    bare._pair = (auth.METADATA_KEY, TOKEN)  # no scheme
    yield "no scheme", bare
    yield "twice", auth._TokenChannel(auth.channel(address, token=TOKEN), TOKEN)


def test_the_controller_answers_only_its_jobs_callers(guarded, monkeypatch):
    for what, channel in _outsiders(guarded.address):
        with channel:
            for call, request in ((pbg.TransferQueueControllerStub(channel).Stats,
                                   pb.StatsRequest()),
                                  (pbg.TransferQueueControllerStub(channel).Allocate,
                                   pb.AllocateRequest(partition=0, count=4)),
                                  (pbg.StorageServiceStub(channel).Put, pb.PutRequest(unit=0))):
                with pytest.raises(grpc.RpcError) as err:
                    call(request, timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (what, call)
            # the session stream (claims, acks) is refused as it opens
            ops = iter([pb.Op(id=1, claim=pb.ClaimRequest(task="t", count=1))])
            with pytest.raises(grpc.RpcError) as err:
                list(pbg.TransferQueueControllerStub(channel).Session(ops, timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, what
            # probes carry no token: the health service stays open
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                               timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with TransferQueueClient(guarded.address) as c:  # the job's own: served, and the
        # outsiders' allocations never happened (its first rows are the table's first)
        assert list(c.allocate(0, 4).indices) == [0, 1, 2, 3]


def test_a_refusal_names_the_caller_and_the_reason_never_the_token(tmp_path):
    server = TQServer(None, token=TOKEN)
    try:
        wrong = auth.new_token()
        with auth.channel(server.address, token=wrong) as channel:
            with pytest.raises(grpc.RpcError):
                pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=10)
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError):
                pbg.TransferQueueControllerStub(channel).Layout(pb.LayoutRequest(), timeout=10)
    finally:
        server.stop()
    log = server.proc.stdout.read()
    assert "refused /rljob.transferqueue.v1.TransferQueueController/Stats from ipv4:127.0.0.1:" \
        in log and ": a wrong job token" in log, log
    assert "Layout from ipv4:127.0.0.1:" in log and ": no job token" in log, log
    assert TOKEN not in log and wrong not in log and TOKEN not in server.seen


def test_the_weight_server_answers_only_its_jobs_callers(monkeypatch):
    from rljob.weights.sender import WeightSender

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    sender = WeightSender("127.0.0.1:0")
    try:
        import torch

        sender.publish(1, {"w": torch.ones(4)})
        address = f"127.0.0.1:{sender.port}"
        assert WeightClient(address).latest() == 1  # the job's own
        monkeypatch.delenv(TOKEN_ENV)
        for what, channel in _outsiders(address):
            with channel:
                stub = wpbg.WeightServiceStub(channel)
                for call, request in ((stub.Latest, wpb.LatestRequest()),
                                      (stub.Fetch, wpb.FetchRequest(min_version=1))):
                    with pytest.raises(grpc.RpcError) as err:
                        result = call(request, timeout=10)
                        list(result) if call is stub.Fetch else None
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (what, call)
    finally:
        sender.stop(0)
