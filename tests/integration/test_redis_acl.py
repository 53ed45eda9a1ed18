"""A storage unit run as the operator renders it (the StatefulSet's redis-server
arguments, its password substituted as the kubelet does): the job's processes work
through its ACL user alone, and anyone else, or any other command, is refused."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis

from rljob.api import builders as b
from rljob.contract import REDIS_USER
from rljob.transferqueue import TaskSpec, TransferQueueClient
from tests.cluster.controlplane import free_port
from tests.integration.conftest import ADMIN_ARGS, PASSWORD, TQServer, admin_client
from tests.integration.test_transferqueue import DRIVER, ROLLOUT, prompts, respond
from tests.unit.test_operator_builders import load


class RenderedUnit:
    """redis-server with the args of the job's StatefulSet, on loopback."""

    def __init__(self, job, workdir):
        container = b.build_redis_statefulset(job)["spec"]["template"]["spec"]["containers"][0]
        args = [a.replace("$(RLJOB_TQ_PASSWORD)", PASSWORD) for a in container["args"]]
        self.port = free_port()
        args[args.index("--port") + 1] = str(self.port)
        args[args.index("--dir") + 1] = str(workdir)
        # and the tests' admin, to read Redis's log of refused commands
        self.proc = subprocess.Popen([*container["command"], *args, "--bind", "127.0.0.1",
                                      *ADMIN_ARGS],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.url = f"redis://127.0.0.1:{self.port}/0"
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
        return redis.Redis(port=self.port, username=username, password=password)

    def admin(self) -> redis.Redis:
        return admin_client(self.port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def job():
    return load("quickstart.yaml")


@pytest.fixture
def unit(job, tmp_path):
    u = RenderedUnit(job, tmp_path)
    yield u
    u.stop()


def test_the_job_works_through_its_acl_user_and_a_restarted_controller_recovers(job, unit):
    """Every command of a job's life (the journal, its takeover, cells put, read and
    swept, the recovery's reads) runs as the ACL user: Redis logs no refusal."""
    name = job.metadata.name
    server = TQServer([unit], job=name)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(DRIVER, ROLLOUT, TaskSpec("train", ["response_ids", "reward"]))
            c.put(0, prompts(6), length_column="prompt_ids")
            got = c.claim_get("rollout", 6, ["prompt", "prompt_ids"])
            assert respond(c, got) == 6
            c.ack(got)
    finally:
        server.stop()
    again = TQServer([unit], job=name)  # the table and journal found again
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
