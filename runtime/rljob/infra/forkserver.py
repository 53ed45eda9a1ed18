"""Workers forked from one parent that imported torch and transformers once.

Each `rljob worker` of a local run imports torch and transformers before it does
anything: about 8 s of a core each, most of a short job's CPU on a small machine
(three such workers in a 3-step quickstart: 24 of its 39 CPU seconds). `rljob run`
starts one fork server, `python -m rljob.infra.forkserver --run-dir DIR MODULE...`,
which imports those modules once; each CPU worker is then a fork of it (its pages
shared copy-on-write) that becomes the worker `python -m rljob ARGS` would have
started: its own session, environment, log file (stdout and stderr), cores and
death signal, then `rljob ARGS` run as the main module.

The protocol is JSON lines: requests on the server's stdin
({"id", "module", "argv", "env", "log", "cpus"}), answers on its stdout ({"id", "pid"} once
forked, {"pid", "exit"} once the server reaped it: the exit code, -N for a signal,
as `subprocess` gives it). The server's stdin closing ends it. When `rljob run` goes
however it goes, the server gets SIGTERM (PR_SET_PDEATHSIG), passes it on to each
child and waits STOP_GRACE seconds for them: the workers stop as they would had
`rljob run` started them (the trainer checkpoints), and those still there then are
SIGKILLed. A server that dies itself (SIGKILL, out of memory) takes its children with
it by SIGKILL: to `rljob run` they are killed workers, which it restarts.

Many runs can share one standing server instead (`--listen PATH`; `rljob run` with
`RLJOB_FORK_SERVER=PATH`): each run is a connection to it, its requests and answers
the same JSON lines, preceded by the server's hello (its pid, interpreter and
PYTHONPATH, which must be the run's). A fork takes on the run's working directory
too; the forks a run leaves when its connection closes get SIGTERM, and the server
goes on until SIGTERM (or the death of whoever started it).

What a fork cannot change: the OpenMP and BLAS libraries read their thread counts
when they load, in the server (which loads them with 1 thread); a worker's count
(OMP_NUM_THREADS) is set through torch.set_num_threads after the fork. A worker's
/proc/PID/cmdline and /proc/PID/environ are the server's: `rljob run` writes each
worker's pid to logs/NAME.pid.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from .heap import importing

_PR_SET_PDEATHSIG = 1
# seconds a worker has, from the SIGTERM that the death of `rljob run` brings, to stop
# as it would (the trainer's checkpoint: atomic, so one cut short is never read), before
# its session is SIGKILLed: every process of a run is gone within 5 s of its end
STOP_GRACE = 2.0
# the server's own environment: the libraries it loads read these once
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "PYTHONUNBUFFERED": "1"}


def preload_modules(model_type: str | None) -> list[str]:
    """What the server imports (pure): torch, transformers' model classes and
    generation, and the modeling module of the job's architecture where known."""
    mods = ["torch", "torch.distributed", "transformers", "transformers.modeling_utils",
            "transformers.generation", "transformers.models.auto.modeling_auto"]
    if model_type and model_type.replace("_", "").isalnum():
        mods.append(f"transformers.models.{model_type}.modeling_{model_type}")
    return mods


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """This process gets `sig` when its parent goes (Linux; elsewhere nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: `rljob run`'s signal handlers still stop every child


# ---- the client: `rljob run` ------------------------------------------------------
class ForkServerGone(RuntimeError):
    """The fork server exited or did not answer: start workers the usual way."""


class Forked:
    """A worker forked by the server, with the part of subprocess.Popen that
    `rljob run` uses (pid, args, poll, wait, returncode)."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args = pid, args
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()


class ForkServer:
    """Starts the server (it imports while the caller goes on) and forks workers
    from it; or, `connect`, forks them from a standing server others use too."""

    def __init__(self, run_dir: Path, preload: list[str], log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "rljob.infra.forkserver", "--run-dir", str(run_dir),
                 *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                env=dict(os.environ, **SERVER_ENV), start_new_session=True,
                preexec_fn=die_with_parent)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._sock: socket.socket | None = None
        self._setup(self._proc.pid, self._proc.stdout, self._proc.stdin)

    @classmethod
    def connect(cls, path: str, timeout: float = 300) -> ForkServer:
        """A client of the standing server listening at `path` (`--listen`). Its
        workers are this process's as a server of its own would make them; those left
        when the connection closes get SIGTERM. ForkServerGone if nothing answers
        there, or the server runs another interpreter or PYTHONPATH than this process
        (its workers would import other code)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)  # the server says hello once it has imported
            sock.connect(path)
            rfile = sock.makefile("rb")
            hello = json.loads(rfile.readline() or b"{}").get("hello")
            sock.settimeout(None)
        except (OSError, ValueError) as exc:
            sock.close()
            raise ForkServerGone(f"no fork server answered at {path}: {exc}") from None
        mine = _identity()
        if not hello or any(hello.get(k) != v for k, v in mine.items()):
            sock.close()
            theirs = {k: (hello or {}).get(k) for k in mine}
            raise ForkServerGone(f"the fork server at {path} runs {theirs}, this run {mine}")
        self = cls.__new__(cls)
        self._proc = None
        self._sock = sock
        self._setup(int(hello["pid"]), rfile, sock.makefile("wb"))
        return self

    def _setup(self, pid: int, rfile, wfile) -> None:
        self.pid = pid
        self._rfile, self._wfile = rfile, wfile
        self._lock = threading.Lock()
        self._next = 0
        self._answers: dict[int, int] = {}
        self._answered = threading.Condition(self._lock)
        self._children: dict[int, Forked] = {}
        self._early: dict[int, int] = {}  # pid -> exit code reported before its Forked
        self._gone = False
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._rfile:
                self._message(json.loads(line))
        except (OSError, ValueError):
            pass  # the connection broke
        if self._sock is not None:
            self._rfile.close()
        with self._lock:  # the server died: its children had their SIGKILL
            self._gone = True
            for child in self._children.values():
                child._exited(-signal.SIGKILL)
            self._children.clear()
            self._answered.notify_all()

    def _message(self, msg: dict) -> None:
        with self._lock:
            if "exit" in msg:
                child = self._children.pop(msg["pid"], None)
                if child is None:
                    self._early[msg["pid"]] = msg["exit"]
                else:
                    child._exited(msg["exit"])
            else:
                self._answers[msg["id"]] = msg["pid"]
                self._answered.notify_all()

    def spawn(self, argv: list[str], env: dict[str, str], log: Path,
              cpus: set[int] | None, timeout: float = 300, module: str = "rljob") -> Forked:
        """Fork a worker running `python -m MODULE ARGV` (the server may still be
        importing: it answers once it is done)."""
        with self._lock:
            if self._gone:
                raise ForkServerGone("the fork server exited")
            self._next += 1
            rid = self._next
            request = {"id": rid, "module": module, "argv": argv, "env": env,
                       "log": str(log), "cpus": sorted(cpus) if cpus else None,
                       "cwd": os.getcwd()}
            try:
                self._wfile.write(json.dumps(request).encode() + b"\n")
                self._wfile.flush()
            except (OSError, ValueError) as exc:
                raise ForkServerGone(f"the fork server exited: {exc}") from exc
            if not self._answered.wait_for(lambda: rid in self._answers or self._gone,
                                           timeout):
                # it goes (and its children with it, which their supervisor restarts):
                # a request it read late would fork a worker nobody knows of (a
                # standing server SIGTERMs the children of a connection that closed)
                self._abandon()
                raise ForkServerGone(f"the fork server did not answer in {timeout:.0f}s")
            if rid not in self._answers:
                raise ForkServerGone("the fork server exited")
            child = Forked(self._answers.pop(rid), [module, *argv])
            if child.pid in self._early:  # it ended before its answer was read
                child._exited(self._early.pop(child.pid))
            else:
                self._children[child.pid] = child
            return child

    def _abandon(self) -> None:
        if self._proc is not None:
            self._proc.kill()
        else:
            self._disconnect()

    def _disconnect(self) -> None:
        """Close the connection: the reader sees its end (and closes its file)."""
        assert self._sock is not None
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._wfile.close()
        except OSError:
            pass
        self._sock.close()

    def close(self, timeout: float = 10) -> None:
        """End the server, or this run's connection to a standing one (its children, if
        any are left, get SIGTERM)."""
        if self._proc is None:
            self._disconnect()
            return
        try:
            self._wfile.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def start_standing(path: Path, preload: list[str], log: Path) -> subprocess.Popen:
    """A standing server listening at `path` (it binds before it imports), for runs
    to share through `RLJOB_FORK_SERVER=PATH`; it dies with the caller, and SIGTERM
    stops it and whatever children it has."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rljob.infra.forkserver", "--listen", str(path), *preload],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=dict(os.environ, **SERVER_ENV), start_new_session=True,
            preexec_fn=die_with_parent)
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise ForkServerGone(f"the standing fork server did not listen at {path} "
                                 f"(exit {proc.wait()}; see {log})")
        time.sleep(0.02)
    return proc


def _identity() -> dict[str, str]:
    """What a forked worker's code depends on beyond the request: the interpreter, its
    environment and the import path set at start."""
    return {"python": os.path.realpath(sys.executable), "prefix": sys.prefix,
            "pythonpath": os.environ.get("PYTHONPATH", "")}


# ---- the server -------------------------------------------------------------------
class _Peer:
    """One client: a run's `rljob run` (its stdin and stdout, or a connection to a
    standing server) and the bytes of its next request (the children it asked for
    are those `owner` maps to it in `serve`)."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd
        self.buf = b""
        self.open = True

    def send(self, msg: dict) -> None:
        if not self.open:
            return
        try:
            os.write(self.wfd, json.dumps(msg).encode() + b"\n")
        except OSError:  # `rljob run` went: nobody to tell
            pass


def _listen(path: str) -> socket.socket:
    """The standing server's socket, bound before it imports (clients wait in its
    backlog); a socket file left by a server that is gone is replaced."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except FileNotFoundError:
        pass
    except ConnectionRefusedError:
        os.unlink(path)
    else:
        raise SystemExit(f"forkserver: a server already listens at {path}")
    finally:
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staged = f"{path}.{os.getpid()}"
    sock.bind(staged)
    sock.listen(64)
    os.rename(staged, path)  # there once it takes connections
    return sock


def serve(preload: list[str], listen: str | None = None) -> dict:
    """Import `preload`, then fork a child for each request, until SIGTERM comes (then
    pass it on to the children, wait for them and exit). Its client is `rljob run` on
    stdin and stdout (the server exits when stdin closes), or, with `listen`, any
    number of clients connecting to that Unix socket (a standing server: the children
    a client leaves when it disconnects get SIGTERM). Returns only in a child: its
    request."""
    listener = _listen(listen) if listen else None
    with importing():  # settled before any fork: the forks' collections skip it
        for name in preload:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - a module it lacks: the child's own
                print(f"forkserver: not preloaded: {name}: {type(exc).__name__}: {exc}",
                      file=sys.stderr, flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))
    signal.set_wakeup_fd(wake_w)
    peers: dict[int, _Peer] = {} if listener else {0: _Peer(0, 1)}
    owner: dict[int, _Peer] = {}  # child pid -> the peer that asked for it
    hello = {"hello": {"pid": os.getpid(), **_identity()}}
    while True:
        if terminated:
            _stop(owner)
        waits = [*peers, wake_r, *([listener.fileno()] if listener else [])]
        ready, _, _ = select.select(waits, [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _reap(owner)
        if listener is not None and listener.fileno() in ready:
            fd = listener.accept()[0].detach()
            peers[fd] = _Peer(fd, fd)
            peers[fd].send(hello)
        for fd in [fd for fd in ready if fd in peers]:
            peer = peers[fd]
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                if listener is None:  # `rljob run` went (its SIGTERM may come later)
                    _stop(owner)
                _disconnected(peers.pop(fd), owner)
                continue
            peer.buf += data
            while b"\n" in peer.buf:
                line, peer.buf = peer.buf.split(b"\n", 1)
                request = json.loads(line)
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    if listener is not None:  # the clients' ends are the server's alone
                        listener.close()
                        for other in peers:
                            os.close(other)
                    return request
                owner[pid] = peer
                peer.send({"id": request["id"], "pid": pid})


def _disconnected(peer: _Peer, owner: dict[int, _Peer]) -> None:
    """A standing server's client went: the children it left get SIGTERM (as a server
    of its own passes on its death signal); they are reaped as they end."""
    peer.open = False
    os.close(peer.rfd)
    _terminate([pid for pid, asked in owner.items() if asked is peer])


def _terminate(pids, sig: int = signal.SIGTERM) -> None:
    """`sig` to each child's session (the worker and what it started)."""
    for pid in list(pids):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # not yet in a session of its own
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _reap(owner: dict[int, _Peer], block: bool = False) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        peer = owner.pop(pid, None)
        if peer is not None:
            peer.send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def _stop(owner: dict[int, _Peer], grace: float = STOP_GRACE) -> None:
    """SIGTERM to each child's session, SIGKILL to those left after `grace` seconds,
    reap them all, exit."""
    _terminate(list(owner))
    deadline = time.monotonic() + grace
    while owner and time.monotonic() < deadline:
        _reap(owner)
        time.sleep(0.05)
    _terminate(list(owner), signal.SIGKILL)
    _reap(owner, block=True)
    _exit(0)


def _exit(code: int) -> None:
    """End the server without Python's finalization: it holds no buffered output (its
    answers are os.write, its warnings flushed), and tearing down torch and
    transformers one object at a time took 2.4 s of a core, at the end of every run."""
    sys.stderr.flush()
    os._exit(code)


def become(request: dict, server: int) -> None:
    """In a fresh child: take on the worker's session, death signal, cores, log,
    working directory, environment and thread count, and its command line."""
    os.setsid()
    die_with_parent(signal.SIGKILL)  # the server passes a SIGTERM on; only its death
    # without one reaches here
    if os.getppid() != server:  # the server went before the death signal was set
        os._exit(1)
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    cwd = request.get("cwd")
    if cwd and cwd != os.getcwd():  # a standing server's client: `python -m` puts the
        # working directory first on the import path
        if sys.path and sys.path[0] == os.getcwd():
            sys.path[0] = cwd
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(max(1, int(threads)))
    sys.argv = [sys.argv[0], *request["argv"]]


def run_worker(module: str) -> None:
    """Run `python -m MODULE ARGV` as the main module, then end as Python would, less its
    finalization (quickexit.end: torch's teardown is about 2 s of a core). Exits with
    the worker's status."""
    import runpy
    import traceback

    from .quickexit import end, exit_code

    code, interrupted = 0, False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: BLE001 - as Python reports an uncaught exception
        traceback.print_exc()
        code = 1
    end(code, interrupted)


if __name__ == "__main__":
    from .proctitle import set_title

    args = sys.argv[1:]
    listen = None
    if args[:1] == ["--run-dir"]:  # names the run in `ps`; nothing else
        set_title("fork server", job=args[1])
        args = args[2:]
    elif args[:1] == ["--listen"]:  # a standing server: `ForkServer.connect`
        listen, args = args[1], args[2:]
        set_title("fork server", job=listen)
        die_with_parent()  # it lives as long as whoever started it
    server = os.getpid()
    request = serve(args, listen)
    become(request, server)
    run_worker(request.get("module", "rljob"))
