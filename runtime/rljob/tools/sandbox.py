"""Tool code in a sandbox: a separate process with limits, whatever the code does.

`run_python(code, limits)` runs `code` in a fresh interpreter (`python -I -S`: no
site-packages, no environment variables of ours) whose first lines, ours, close it
in before the code runs:

- resource limits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS: an
  allocation past it is a MemoryError), file size, open files, no core files and,
  as an unprivileged user, no new processes (RLIMIT_NPROC);
- no network: a network namespace of its own where the host allows one (as root;
  the loopback there is down), and, always, an audit hook (PEP 578) that refuses
  sockets, new processes, `exec` of programs and loading native libraries;
- a throwaway working directory (removed after the call), and, when we run as
  root, the uid and gid of `nobody`; the standard modules a calculation wants
  (math, fractions, statistics, itertools, re, ...) are loaded before, the rest
  of the standard library only where `nobody` can read it;
- from outside: a wall-clock limit, an output limit (bytes read from its stdout and
  stderr, then it is killed) and its whole process group killed at the end.

A call never raises for what the code does: it returns a `ToolResult` whose
`error` says what ended it (a timeout, the output limit, the CPU or memory limit,
an exception in the code), for the episode's observation.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

NOBODY = 65534


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 5.0
    cpu_seconds: int = 2
    memory_bytes: int = 256 << 20  # address space; an interpreter takes ~30 MB of it
    output_bytes: int = 16 << 10
    file_bytes: int = 1 << 20
    open_files: int = 32


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the code printed (stdout and stderr), cut at the output limit
    error: str = ""  # empty when the code ran to its end
    seconds: float = 0.0
    network_isolated: bool = False  # in a namespace of its own (else: the audit hook only)

    @property
    def ok(self) -> bool:
        return not self.error


# The sandbox's own first lines: they run in the child before the tool's code.
_PRELUDE = r'''
import json, os, resource, sys
cfg = json.loads(sys.stdin.readline())
isolated, ctypes, libc = False, None, None
try:  # a network namespace of its own (as root, or in a user namespace of its own)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    isolated = libc.unshare(0x40000000) == 0 or libc.unshare(0x10000000 | 0x40000000) == 0
except Exception:
    pass
# what a tool's code may use, loaded while the interpreter's files are readable
import collections, datetime, decimal, fractions, functools, itertools, math, random, re
import statistics, string
sys.stdout.write("\x00" + ("1" if isolated else "0"))
sys.stdout.flush()
for name, value in (("RLIMIT_CPU", cfg["cpu"]), ("RLIMIT_AS", cfg["memory"]),
                    ("RLIMIT_FSIZE", cfg["file"]), ("RLIMIT_NOFILE", cfg["files"]),
                    ("RLIMIT_CORE", 0)):
    # CPU: SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(getattr(resource, name), (value, value + (name == "RLIMIT_CPU")))
if os.getuid() == 0:
    os.setgroups([])
    os.setgid(cfg["nobody"])
    os.setuid(cfg["nobody"])
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # as nobody: no new process
_REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "os.fork", "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "signal.")
def _refuse(event, args):
    if event.startswith(_REFUSED):
        raise PermissionError(f"the tool sandbox refuses {event}")
for mod in ("ctypes", "_ctypes"):
    sys.modules[mod] = None
sys.addaudithook(_refuse)
del json, resource, cfg, ctypes, libc
code = sys.stdin.read()
exec(compile(code, "<tool>", "exec"), {"__name__": "__main__"})
'''


def run_python(code: str, limits: Limits = Limits()) -> ToolResult:
    """Run `code` in the sandbox and return what it printed and what ended it."""
    work = tempfile.mkdtemp(prefix="rljob-tool-")
    started = time.monotonic()
    try:
        if os.getuid() == 0:
            os.chown(work, NOBODY, NOBODY)
        cfg = {"cpu": max(1, int(limits.cpu_seconds)), "memory": limits.memory_bytes,
               "file": limits.file_bytes, "files": limits.open_files, "nobody": NOBODY}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PRELUDE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=work,
            env={"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8",
                 "PYTHONDONTWRITEBYTECODE": "1"},
            start_new_session=True, close_fds=True)
        try:
            proc.stdin.write((json.dumps(cfg) + "\n" + code).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        out, cut, timed_out = _read(proc, limits, started)
        _kill_group(proc)
        returncode = proc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    isolated = out[:2] == b"\x001"
    text = (out[2:] if out[:1] == b"\x00" else out).decode("utf-8", "replace")
    return ToolResult(text, _what_ended(returncode, text, cut, timed_out, limits),
                      time.monotonic() - started, isolated)


def _read(proc: subprocess.Popen, limits: Limits, started: float) -> tuple[bytes, bool, bool]:
    """Its output until it exits, passes the output limit (cut) or the wall clock."""
    chunks, size = [], 0
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = limits.wall_seconds - (time.monotonic() - started)
            if left <= 0:
                return b"".join(chunks), False, True
            if not sel.select(timeout=left):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                return b"".join(chunks), False, False
            chunks.append(data)
            size += len(data)
            if size > limits.output_bytes + 2:  # the prelude's two bytes aside
                return b"".join(chunks)[:limits.output_bytes + 2], True, False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _what_ended(returncode: int, text: str, cut: bool, timed_out: bool, limits: Limits) -> str:
    if timed_out:
        return f"timed out after {limits.wall_seconds:g} s"
    if cut:
        return f"output over {limits.output_bytes} bytes"
    if returncode == -signal.SIGXCPU:
        return f"CPU time over {limits.cpu_seconds} s"
    if returncode == 0:
        return ""
    last = (text.strip().splitlines() or [""])[-1]
    if last.startswith("MemoryError"):
        return f"memory over {limits.memory_bytes >> 20} MB"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return last or f"exit status {returncode}"
