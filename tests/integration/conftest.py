"""Real redis-server and `rljob worker transferqueue` processes on loopback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from rljob.api.builders.transferqueue import redis_acl_args, redis_aof_args
from rljob.contract import REDIS_USER
from tests.cluster.controlplane import free_port

PASSWORD = "tq-test-password"
# what a process of the job has in its environment for its Redis units
UNIT_ENV = {"RLJOB_TQ_PASSWORD": PASSWORD, "RLJOB_TQ_USER": REDIS_USER}
# the tests' own user, to look at what the job's user did (the job's user may not)
ADMIN, ADMIN_PASSWORD = "test-admin", "tq-test-admin"
ADMIN_ARGS = ["--user", ADMIN, "on", f">{ADMIN_PASSWORD}", "~*", "&*", "+@all"]


def redis_argv(port: int, workdir: Path, appendonly: bool = False) -> list[str]:
    """redis-server with the job's ACL user as the operator renders it (on every key:
    the tests' jobs share units) and the tests' admin user."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed: run the README test command "
                           "(it installs Debian's redis-server)")
    aof = redis_aof_args() if appendonly else ["--appendonly", "no"]
    return [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *aof,
            *redis_acl_args(PASSWORD), *ADMIN_ARGS, "--dir", str(workdir)]


def admin_client(port: int) -> redis.Redis:
    return redis.Redis(port=port, username=ADMIN, password=ADMIN_PASSWORD)


class RedisServer:
    """A real redis-server; `appendonly` as the operator's StatefulSet runs it, with
    the job's ACL user; `client` is the tests' admin."""

    def __init__(self, workdir: Path, appendonly: bool = False, port: int | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(redis_argv(self.port, workdir, appendonly),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.client = admin_client(self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


class TQServer:
    def __init__(self, units: list[RedisServer] | None, lease_seconds: float = 60.0,
                 max_row_bytes: int | None = None, job: str | None = None,
                 token: str | None = None, env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = ()):
        # the worker binds port 0 and says which ports it got: no window in which another
        # process can take a port picked here
        args = [sys.executable, "-m", "rljob", "worker", "transferqueue",
                "--listen", "127.0.0.1:0", "--lease-seconds", str(lease_seconds),
                "--metrics-port", "0", "--job", job or f"job{uuid.uuid4().hex[:8]}"]
        for u in units or []:
            args += ["--redis", u.url]
        if not units:
            args += ["--memory-units", "2"]
        if max_row_bytes:
            args += ["--max-row-bytes", str(max_row_bytes)]
        args += extra_args
        env = dict(os.environ, **UNIT_ENV, **(env or {}))
        if token:  # the job's token: it answers only callers that present it
            env["RLJOB_JOB_TOKEN"] = token
        self.seen = ""  # what it logged before it listened
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        seen = ""  # log lines before the ready line
        while True:
            line = self.proc.stdout.readline()
            if not line or line.startswith(("transferqueue listening on ", "Traceback")):
                break
            seen += line
        if not line.startswith("transferqueue listening on "):
            # a failure: wait for the rest of what it says
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            rest = self.proc.stdout.read()
            raise RuntimeError(f"transferqueue did not start (exit {self.proc.returncode}): "
                               f"{seen}{line}{rest}")
        found = re.search(r"listening on 127\.0\.0\.1:(\d+) .*metrics on :(\d+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"transferqueue said where it listens in an unknown form: {line}")
        self.port, self.metrics_port = int(found[1]), int(found[2])
        self.seen = seen
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="session")
def redis_units(tmp_path_factory):
    servers = [RedisServer(tmp_path_factory.mktemp(f"redis{i}")) for i in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(autouse=True)
def _password(monkeypatch):
    for name, value in UNIT_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def tq(redis_units):
    server = TQServer(redis_units)
    yield server
    server.stop()


@pytest.fixture
def tq_memory():
    server = TQServer(None)
    yield server
    server.stop()
