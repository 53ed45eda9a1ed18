"""TLS on a job's connections (transferQueue.tls, infra/tls.py), against real servers:
the TransferQueue controller and its storage service, the weight server and a Redis
unit started as the operator starts them serve TLS on the job's certificate alone; the
job's clients trust the job's CA alone, so plain text, a server of another job and an
expired certificate fail the handshake with the address and the reason; over TLS the
job's token is still asked for."""

from __future__ import annotations

import datetime
import subprocess
import time

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rljob.api.builders.transferqueue import redis_tls_args
from rljob.contract import CA_FILE, CERT_FILE, KEY_FILE, TLS_CA_ENV, TOKEN_ENV
from rljob.infra import auth, tls
from rljob.infra.netutil import free_port
from rljob.transferqueue import TransferQueueClient
from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg
from rljob.transferqueue.storage.redis_unit import RedisUnit
from rljob.weights.client import WeightClient

from .conftest import PASSWORD, TQServer, redis_argv

TOKEN = auth.new_token()
JOB, OTHER = tls.make(), tls.make()  # this job's credentials, and another job's


def _stats(channel) -> grpc.RpcError | None:
    try:
        pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=10)
        return None
    except grpc.RpcError as exc:
        return exc


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10).status


def test_the_controller_serves_tls_on_the_jobs_certificate_alone(monkeypatch):
    health_port = free_port()
    server = TQServer(None, token=TOKEN, env=JOB.env(),
                      extra_args=("--health-port", str(health_port)))
    try:
        address = server.address
        # plain text: the handshake fails before any method is reached
        with grpc.insecure_channel(address) as channel:
            assert _stats(channel).code() == grpc.StatusCode.UNAVAILABLE
        # a client of another job (it trusts its own CA) refuses this server
        with auth.channel(address, token=TOKEN, ca=OTHER.ca.encode()) as channel:
            err = _stats(channel)
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert address in err.details() and "handshake failed" in err.details(), err
        # the job's CA without the token: the token is still asked for
        with auth.channel(address, token="", ca=JOB.ca.encode()) as channel:
            assert _stats(channel).code() == grpc.StatusCode.UNAUTHENTICATED
        # the probes' port: the health service alone, in plain text
        assert _health(f"127.0.0.1:{health_port}") == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            assert _stats(channel).code() == grpc.StatusCode.UNIMPLEMENTED
        # the job's own client, from its environment: served, on the storage service too
        monkeypatch.setenv(TOKEN_ENV, TOKEN)
        monkeypatch.setenv(TLS_CA_ENV, JOB.ca)
        with TransferQueueClient(address) as c:
            assert list(c.allocate(0, 4).indices) == [0, 1, 2, 3]
    finally:
        server.stop()
    log = server.proc.stdout.read()
    assert "no job token" in log and JOB.key not in log and TOKEN not in log


def test_an_expired_certificate_fails_the_handshake_with_the_reason():
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=3)
    expired = tls.make(days=1, now=past)
    server = TQServer(None, token=TOKEN, env=expired.env())
    try:
        with auth.channel(server.address, token=TOKEN, ca=expired.ca.encode()) as channel:
            err = _stats(channel)
        assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert server.address in err.details() and "certificate has expired" in err.details()
    finally:
        server.stop()


def test_grpcs_handshake_trace_names_the_address_and_reason_of_a_refused_caller():
    """The documented knob (docs/guides/security.md): GRPC_TRACE=handshaker in a
    server's environment logs each failed handshake with the caller's address and the
    reason; without it the reason alone (grpc logs no address)."""
    import re
    import socket

    def garbage(address: str) -> int:  # plain text that is no TLS: the caller's port
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(5)
            try:
                sock.recv(1024)
            except OSError:
                pass
            return sock.getsockname()[1]

    for traced in (False, True):
        env = JOB.env() | ({"GRPC_TRACE": "handshaker"} if traced else {})
        server = TQServer(None, token=TOKEN, env=env)
        try:
            port = garbage(server.address)
            time.sleep(0.5)
        finally:
            server.stop()
        log = server.proc.stdout.read()
        # the reason, either way: BoringSSL's, an HTTP request where TLS was due
        assert "Handshake failed" in log and "HTTP_REQUEST" in log, log[-2000:]
        failed = [m for m in re.finditer(r"CallNextHandshakerLocked: error=(?!OK)(.*?)"
                                         r"endpoint_peer_address=([\w:.]+)", log, re.S)]
        if traced:
            assert any(m[2] == f"ipv4:127.0.0.1:{port}" and "HTTP_REQUEST" in m[1]
                       for m in failed), log[-3000:]
        else:
            assert not failed and f":{port}" not in log


def test_the_weight_server_serves_tls_on_the_jobs_certificate_alone(monkeypatch):
    import torch

    from rljob.weights.sender import WeightSender

    for env, value in {TOKEN_ENV: TOKEN, **JOB.env()}.items():
        monkeypatch.setenv(env, value)
    sender = WeightSender("127.0.0.1:0")
    try:
        sender.publish(1, {"w": torch.ones(4)})
        address = f"127.0.0.1:{sender.port}"
        client = WeightClient(address)  # the job's CA and token, from the environment
        assert client.latest() == 1
        assert client.fetch(1, 10)[1]["w"].tolist() == [1.0] * 4
        for channel in (grpc.insecure_channel(address),
                        auth.channel(address, token=TOKEN, ca=OTHER.ca.encode())):
            with channel:
                from rljob.weights.proto import weights_pb2 as wpb
                from rljob.weights.proto import weights_pb2_grpc as wpbg

                with pytest.raises(grpc.RpcError) as err:
                    wpbg.WeightServiceStub(channel).Latest(wpb.LatestRequest(), timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        sender.stop(0)


@pytest.fixture
def tls_redis(tmp_path):
    """A redis-server as a Redis unit's pod runs it with transferQueue.tls: TLS alone,
    on the job's certificate, with the job's ACL user."""
    for name, pem in ((CA_FILE, JOB.ca), (CERT_FILE, JOB.cert), (KEY_FILE, JOB.key)):
        (tmp_path / name).write_text(pem)
    port = free_port()
    argv = redis_argv(port, tmp_path)
    i = argv.index("--port")
    argv[i:i + 2] = redis_tls_args(str(tmp_path), port)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while subprocess.run(["redis-cli", "-p", str(port), "--tls", "--cacert",
                          str(tmp_path / CA_FILE), "ping"], capture_output=True,
                         text=True).stdout.strip() not in ("PONG", "NOAUTH Authentication "
                                                           "required."):
        assert time.monotonic() < deadline and proc.poll() is None, "redis-server did not start"
        time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def test_a_redis_unit_serves_tls_to_the_jobs_clients_alone(tls_redis, monkeypatch):
    port = tls_redis
    monkeypatch.setenv(TLS_CA_ENV, JOB.ca)
    unit = RedisUnit(f"rediss://127.0.0.1:{port}/0", job="tls", password=PASSWORD,
                     username="rljob")
    unit.put([(0, "prompt", b"x" * 65536)])
    assert bytes(unit.get([0], ["prompt"])[0][0]) == b"x" * 65536
    unit.close()
    # plain text on the TLS port, and a client that trusts another job's CA: refused
    plain = RedisUnit(f"redis://127.0.0.1:{port}/0", job="tls", password=PASSWORD,
                      username="rljob")
    with pytest.raises(redis.ConnectionError):
        plain.client.ping()
    monkeypatch.setenv(TLS_CA_ENV, OTHER.ca)
    other = RedisUnit(f"rediss://127.0.0.1:{port}/0", job="tls", password=PASSWORD,
                      username="rljob")
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        other.client.ping()
