"""The fork server of `rljob run` (infra/forkserver.py), for real: a server that
preloaded torch forks children that take on their own environment, session, log,
cores and thread count, report their exit (codes and signals) and lose no write."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from rljob.infra.forkserver import ForkServer, ForkServerGone, preload_modules, start_standing

CHILD = "tests.unit.forked_child"


def test_preload_modules_name_the_jobs_architecture_and_nothing_odd():
    assert preload_modules("qwen2")[-1] == "transformers.models.qwen2.modeling_qwen2"
    assert "torch" in preload_modules(None)
    assert preload_modules("../x") == preload_modules(None)


@pytest.fixture
def server(tmp_path):
    forks = ForkServer(tmp_path, ["torch"], tmp_path / "forkserver.log")
    try:
        yield forks
    finally:
        forks.close()


def _spawn(server, tmp_path: Path, name: str, *what: str, cpus=None, threads: int = 1):
    out = tmp_path / f"{name}.json"
    env = dict(os.environ, POD_NAME=name, OMP_NUM_THREADS=str(threads))
    child = server.spawn([str(out), *what], env, tmp_path / f"{name}.log", cpus, module=CHILD)
    return child, out


def test_a_forked_child_is_the_worker_it_was_asked_for(server, tmp_path):
    cpus = {sorted(os.sched_getaffinity(0))[-1]}
    child, out = _spawn(server, tmp_path, "rollout-0", "exit", "0", cpus=cpus, threads=2)
    assert child.wait(timeout=120) == 0
    seen = json.loads(out.read_text())
    assert seen["pid"] == child.pid and seen["sid"] == child.pid  # a session of its own
    assert seen["env"] == {"POD_NAME": "rollout-0", "OMP_NUM_THREADS": "2"}
    assert seen["cpus"] == sorted(cpus)
    assert seen["preloaded"] and seen["threads"] == 2  # torch from the server, 2 threads
    # torch's objects are out of the child's collections, which still run
    assert seen["frozen"] > 50_000 and seen["collecting"]
    assert seen["argv"] == [str(out), "exit", "0"]
    assert (tmp_path / "rollout-0.log").read_text() == "hello from the child\n"
    assert child.pid != server.pid


def test_exit_codes_signals_and_tracebacks_come_back_as_subprocess_gives_them(server, tmp_path):
    code, _ = _spawn(server, tmp_path, "a", "exit", "3")
    failed, _ = _spawn(server, tmp_path, "b", "raise")
    sleeper, out = _spawn(server, tmp_path, "c", "sleep")
    assert code.wait(timeout=120) == 3
    assert failed.wait(timeout=120) == 1
    assert "RuntimeError: the child failed" in (tmp_path / "b.log").read_text()
    _started(out)
    assert sleeper.poll() is None
    with pytest.raises(Exception, match="timed out"):
        sleeper.wait(timeout=0.2)
    os.killpg(sleeper.pid, signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL


def test_a_childs_unclosed_file_is_written_when_it_exits(server, tmp_path):
    child, _ = _spawn(server, tmp_path, "d", "open-file", str(tmp_path / "kept.txt"))
    assert child.wait(timeout=120) == 0
    assert (tmp_path / "kept.txt").read_text() == "unflushed line\n"


def _started(out: Path) -> None:
    deadline = time.monotonic() + 60
    while not out.exists():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    path = Path(f"/proc/{pid}/stat")
    try:
        return path.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_sigterm_to_the_server_stops_each_child_as_its_own_sigterm_would(server, tmp_path):
    """What `rljob run`'s going sends the server (its death signal): each child gets
    SIGTERM and the server waits while it stops (a trainer checkpoints)."""
    stopping, out = _spawn(server, tmp_path, "t", "stop-file", str(tmp_path / "stopped"))
    plain, out2 = _spawn(server, tmp_path, "u", "sleep")
    _started(out)
    _started(out2)
    os.kill(server.pid, signal.SIGTERM)
    assert stopping.wait(timeout=60) == 0
    assert (tmp_path / "stopped").read_text() == "checkpointed\n"
    assert plain.wait(timeout=60) == -signal.SIGTERM
    server._proc.wait(timeout=30)


def test_children_die_with_a_killed_server_and_a_gone_server_says_so(server, tmp_path):
    sleeper, out = _spawn(server, tmp_path, "e", "sleep")
    _started(out)
    os.kill(server.pid, signal.SIGKILL)
    # the child had its death signal: reported as killed, and really gone
    assert sleeper.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while not _gone(sleeper.pid):
        assert time.monotonic() < deadline, "the child outlived its server"
        time.sleep(0.05)
    with pytest.raises(ForkServerGone):
        _spawn(server, tmp_path, "f", "exit", "0")


@pytest.fixture
def standing(tmp_path):
    sock = tmp_path / "fs.sock"
    proc = start_standing(sock, ["torch"], tmp_path / "standing.log")
    try:
        yield proc, sock
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_standing_server_forks_for_each_client_and_stops_what_a_gone_one_left(
        standing, tmp_path, monkeypatch):
    """Many runs share one standing server (`RLJOB_FORK_SERVER`): each client's
    children are forked in its working directory and reported to it alone; those a
    client leaves when it disconnects get SIGTERM, and the others go on."""
    proc, sock = standing
    first, second = ForkServer.connect(str(sock)), ForkServer.connect(str(sock))
    assert first.pid == second.pid == proc.pid
    sleeper, out = _spawn(first, tmp_path, "a", "sleep")
    _started(out)
    work = tmp_path / "elsewhere"
    work.mkdir()
    # the child's module, found from there as `python -m` would (the working
    # directory first on the import path)
    (work / "tests").symlink_to(Path(__file__).resolve().parents[1])
    monkeypatch.chdir(work)
    child, out2 = _spawn(second, tmp_path, "b", "exit", "3")
    assert child.wait(timeout=120) == 3
    assert json.loads(out2.read_text())["cwd"] == str(work)
    assert json.loads(out.read_text())["preloaded"]
    first.close()
    deadline = time.monotonic() + 30
    while not _gone(sleeper.pid):
        assert time.monotonic() < deadline, "a gone client's child was left running"
        time.sleep(0.05)
    again, _ = _spawn(second, tmp_path, "c", "exit", "0")
    assert again.wait(timeout=120) == 0
    second.close()
    assert proc.poll() is None  # it stands until it is stopped


def test_a_standing_server_of_another_import_path_is_refused(standing, monkeypatch):
    """A run whose PYTHONPATH is not the server's would fork workers importing other
    code: it is refused (the run then starts a server of its own)."""
    _, sock = standing
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    with pytest.raises(ForkServerGone, match="pythonpath"):
        ForkServer.connect(str(sock))
    with pytest.raises(ForkServerGone, match="no fork server answered"):
        ForkServer.connect(str(sock) + ".none")
