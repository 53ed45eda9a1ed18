"""A worker's quick end (rljob/infra/quickexit.py) loses nothing a normal exit keeps:
unflushed writes reach their files, atexit functions run, non-daemon threads are
joined, and the status is the one asked for."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(RUNTIME)!r})
        from rljob.infra.quickexit import end, exit_code
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)


def test_the_end_flushes_files_runs_atexit_joins_threads_and_keeps_the_status(tmp_path):
    out = _run("""
        import atexit, threading, time
        f = open("buffered.txt", "w")
        f.write("every byte")                       # left in the buffer
        atexit.register(lambda: print("atexit ran", flush=True))
        def late():
            time.sleep(0.3)
            open("thread.txt", "w").write("joined")
        threading.Thread(target=late).start()       # not a daemon: joined first
        end(7)
    """, tmp_path)
    assert out.returncode == 7, out.stderr
    assert (tmp_path / "buffered.txt").read_text() == "every byte"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert "atexit ran" in out.stdout


def test_a_file_opened_before_the_heap_was_settled_is_flushed_too(tmp_path):
    """A worker settles its heap after its imports (infra/heap.py): files opened by
    then are out of the collector's lists, and the end still finds them."""
    out = _run("""
        from rljob.infra.heap import settle_heap
        f = open("before.txt", "w")
        settle_heap()
        f.write("written after")
        end(0)
    """, tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "before.txt").read_text() == "written after"


def test_a_system_exit_message_is_printed_and_ends_with_status_1(tmp_path):
    out = _run("""
        try:
            sys.exit("no such job file")
        except SystemExit as exc:
            end(exit_code(exc))
    """, tmp_path)
    assert out.returncode == 1 and "no such job file" in out.stderr
    assert _run("end(exit_code(SystemExit(None)))", tmp_path).returncode == 0


def test_a_worker_command_ends_quickly_with_its_status(tmp_path):
    """`rljob worker ...` (a pod's main process) takes the quick end: a bad argument
    still exits 2, as click says, with its message."""
    out = subprocess.run([sys.executable, "-m", "rljob", "worker", "trainer", "--no-such"],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ,
                              "PYTHONPATH": str(RUNTIME)})
    assert out.returncode == 2, out.stderr
    assert "--no-such" in out.stderr
