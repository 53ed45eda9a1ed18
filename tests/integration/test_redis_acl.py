"""A storage unit run as the operator renders it (the StatefulSet's redis-server
arguments, its password substituted as the kubelet does): the job's processes work
through its ACL user alone, and anyone else, or any other command, is refused."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from rljob.api import builders as b
from rljob.api.builders.transferqueue import TLS_DIR
from rljob.contract import CA_FILE, CERT_FILE, KEY_FILE, REDIS_USER, TLS_CA_ENV
from rljob.infra import tls
from rljob.transferqueue import TaskSpec, TransferQueueClient
from tests.cluster.controlplane import free_port
from tests.integration.conftest import ADMIN, ADMIN_ARGS, ADMIN_PASSWORD, PASSWORD, TQServer
from tests.integration.test_transferqueue import DRIVER, ROLLOUT, prompts, respond
from tests.unit.test_operator_builders import load


PEMS = tls.make()  # the job's CA and its units' certificate


class RenderedUnit:
    """redis-server with the args of the job's StatefulSet, on loopback: TLS alone
    (transferQueue.tls, the default), on the certificate of `PEMS` in `workdir`/tls."""

    def __init__(self, job, workdir):
        container = b.build_redis_statefulset(job)["spec"]["template"]["spec"]["containers"][0]
        (workdir / "tls").mkdir()
        for name, pem in ((CA_FILE, PEMS.ca), (CERT_FILE, PEMS.cert), (KEY_FILE, PEMS.key)):
            (workdir / "tls" / name).write_text(pem)
        args = [a.replace("$(RLJOB_TQ_PASSWORD)", PASSWORD).replace(
            TLS_DIR, str(workdir / "tls")) for a in container["args"]]
        self.port = free_port()
        args[args.index("--tls-port") + 1] = str(self.port)
        args[args.index("--dir") + 1] = str(workdir)
        # and the tests' admin, to read Redis's log of refused commands
        self.proc = subprocess.Popen([*container["command"], *args, "--bind", "127.0.0.1",
                                      *ADMIN_ARGS],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.url = f"rediss://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 20
        while True:
            try:
                self.connect().ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server refused its args: "
                                       f"{self.proc.stdout.read()}") from None
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def connect(self, username: str | None = REDIS_USER, password: str | None = PASSWORD):
        return redis.Redis.from_url(self.url, username=username, password=password,
                                    **tls.redis_client_kwargs(self.url, PEMS.ca))

    def admin(self) -> redis.Redis:
        return self.connect(ADMIN, ADMIN_PASSWORD)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def job():
    return load("quickstart.yaml")


@pytest.fixture
def unit(job, tmp_path, monkeypatch):
    monkeypatch.setenv(TLS_CA_ENV, PEMS.ca)  # the tests' controllers and clients trust it
    u = RenderedUnit(job, tmp_path)
    yield u
    u.stop()


def test_the_job_works_through_its_acl_user_and_a_restarted_controller_recovers(job, unit):
    """Every command of a job's life (the journal, its takeover, cells put, read and
    swept, the recovery's reads) runs as the ACL user: Redis logs no refusal."""
    name = job.metadata.name
    server = TQServer([unit], job=name, env=PEMS.env())  # TLS, as in the pods
    try:
        with TransferQueueClient(server.address) as c:
            c.register(DRIVER, ROLLOUT, TaskSpec("train", ["response_ids", "reward"]))
            c.put(0, prompts(6), length_column="prompt_ids")
            got = c.claim_get("rollout", 6, ["prompt", "prompt_ids"])
            assert respond(c, got) == 6
            c.ack(got)
    finally:
        server.stop()
    again = TQServer([unit], job=name, env=PEMS.env())  # the table and journal found again
    try:
        with TransferQueueClient(again.address) as c:
            assert c.stats().rows == 6
            c.register(DRIVER, ROLLOUT, TaskSpec("train", ["response_ids", "reward"]))
            t = c.claim_get("train", 6, ["response_ids", "reward"])
            assert t.data["reward"] == [float(i) for i in range(6)]
            c.ack(t)
            assert c.stats().rows == 0
    finally:
        again.stop()
    # what the job's user was refused (redis-py's CLIENT SETINFO, which it may be refused
    # and goes on without, aside): nothing
    denied = [e for e in unit.admin().acl_log() if e["object"] != "client|setinfo"]
    assert denied == []


def test_anyone_else_and_any_other_command_is_refused(job, unit):
    with pytest.raises(redis.AuthenticationError):
        unit.connect(None, PASSWORD).ping()  # the password alone: the default user, off
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        unit.connect(None, None).get("x")  # no credentials
    with pytest.raises(redis.AuthenticationError):
        unit.connect(REDIS_USER, "wrong").ping()
    own = unit.connect()
    own.set(f"{job.metadata.name}:probe", b"1")
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "dir"), ("KEYS", "*"),
                    ("SHUTDOWN",), ("ACL", "LIST"), ("MONITOR",),
                    ("EVAL", "return 1", "0"), ("SET", "another-job:x", "1"),
                    ("GET", "another-job:x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            own.execute_command(*command)
    with pytest.raises(redis.ResponseError):  # refused by the server's config, then the ACL
        own.execute_command("DEBUG", "SLEEP", "0")
    assert own.get(f"{job.metadata.name}:probe") == b"1"  # nothing was changed
    # each refusal is in Redis's log, with the user and what it tried
    refused = {(e["username"], e["object"]) for e in unit.admin().acl_log(count=100)}
    assert {(REDIS_USER, "flushall"), (REDIS_USER, "config|get"), (REDIS_USER, "keys"),
            (REDIS_USER, "another-job:x")} <= refused, refused
