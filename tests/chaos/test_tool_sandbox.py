"""The tool sandbox (tools/sandbox.py) against code that hangs, crashes, forks,
floods its output, allocates 10 GB, writes a big file or tries the network: each
call ends with an error for that call only, in about its limits, and the next call
runs as if nothing happened. Real processes, no mocks."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time

import pytest

from rljob.tools import TOOLS, Limits, run_python

LIMITS = Limits(wall_seconds=4.0, cpu_seconds=1, memory_bytes=256 << 20, output_bytes=4096)
# for code that is stopped by its CPU time: on a loaded machine a second of CPU time
# takes several seconds of wall time, so the wall limit stands well out of its way
CPU_LIMITS = dataclasses.replace(LIMITS, wall_seconds=60.0)


def still_works():
    r = run_python("import math\nprint(math.gcd(12, 18))", LIMITS)
    assert (r.ok, r.output) == (True, "6\n"), r


@pytest.mark.parametrize("name,code,error", [
    ("spins", "while True:\n    pass", "CPU time over 1 s"),
    ("sleeps", "import time\ntime.sleep(60)", "timed out after 4 s"),
    ("raises", "raise ValueError('no')", "ValueError: no"),
    ("aborts", "import os\nos.abort()", "killed by SIGABRT"),
    ("floods", "print('x' * 10**8)", "output over 4096 bytes"),
    ("floods in a loop", "while True:\n    print('y' * 100)", "output over 4096 bytes"),
    ("allocates 10 GB", "b = bytearray(10 * 2**30)", "memory over 256 MB"),
    ("writes 8 MB", "open('big', 'wb').write(b'z' * (8 << 20))", "File too large"),
    ("forks", "import os\nwhile True:\n    os.fork()", "refuses os.fork"),
    ("runs a program", "import os\nos.system('touch /tmp/rljob-sandbox-escaped')",
     "refuses os.system"),
])
def test_bad_code_ends_its_own_call_and_the_next_runs(name, code, error):
    limits = CPU_LIMITS if "CPU time" in error else LIMITS
    started = time.monotonic()
    r = run_python(code, limits)
    assert not r.ok and error in r.error, (name, r)
    assert time.monotonic() - started < limits.wall_seconds + 3, name
    assert len(r.output.encode()) <= LIMITS.output_bytes
    assert not os.path.exists("/tmp/rljob-sandbox-escaped")
    still_works()


def test_the_network_is_out_of_reach():
    """A listener on this machine's loopback: the tool's connection never arrives."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "s.sendall(b'leak')\nprint('connected')")
        r = run_python(code, LIMITS)
        assert not r.ok and "connected" not in r.output, r
        if os.getuid() == 0:  # a namespace of its own, beside the audit hook
            assert r.network_isolated
        time.sleep(0.5)
        assert accepted == []
    finally:
        stop.set()
        t.join()
        server.close()
    still_works()


def test_a_call_leaves_nothing_behind():
    """The working directory goes with the call; no process of it survives."""
    r = run_python("import os\nopen('x', 'w').write('1')\nprint(os.getcwd())", LIMITS)
    assert r.ok, r
    assert not os.path.exists(r.output.strip())
    r = run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", LIMITS)
    assert r.error.startswith("timed out") and r.output == "started\n"


def test_calculator_evaluates_arithmetic_and_refuses_the_rest():
    calc = TOOLS.get("calculator")
    assert calc("(3 + 4) * 2 ** 10").output == "7168"
    assert calc("7 / 2").output == "3.5"
    assert "not arithmetic" in calc("__import__('os').system('true')").error
    assert "exponent" in calc("9 ** 9 ** 9").error
    assert "division by zero" in calc("1 / 0").error
    # a negative number's root is complex: refused, so no later operator meets it
    assert "not a real number" in calc("(-8) ** 0.5").error
    assert "not a real number" in calc("(-8) ** 0.5 % 3").error
    assert "not a real number" in calc("1 // (-1) ** .5").error


def test_a_bad_program_in_an_episode_is_that_episodes_error_observation():
    """The python environment in episodes (a scripted policy): a program that spins,
    floods or forks ends as `<out>error: ...</out>` for its episode, which goes on to
    its next turn; the batch's other episodes are answered as usual."""
    from rljob.environments import Python
    from rljob.rollout.engine import Generation, SamplingParams
    from rljob.rollout.episodes import run_episodes
    from tests.unit.test_episodes import TOK, Scripted, enc

    class Quick(Python):
        limits = CPU_LIMITS  # the spinning program ends on its CPU time, however loaded

    programs = ["<py>while True:\n    pass</py>", "<py>print('x' * 10**7)</py>",
                "<py>import os\nos.fork()</py>", "<py>print(6 * 7)</py>"]

    class PerPrompt(Scripted):
        """Turn 1: prompt i's program; turn 2: every episode ends."""

        def generate(self, prompts, params):
            self.calls += 1
            texts = programs if self.calls == 1 else ["done"] * len(prompts)
            ends = [] if self.calls == 1 else [TOK.eos_token_id]
            return [[Generation(enc(texts[i]) + ends, [-0.1] * (len(enc(texts[i])) + len(ends)))]
                    for i in range(len(prompts))]

    rows = [{"prompt": f"q{i}", "answer": ""} for i in range(4)]
    started = time.monotonic()
    groups = run_episodes(PerPrompt([]), TOK, [enc(r["prompt"]) for r in rows], rows,
                          SamplingParams(n=1, seeds=(1, 2, 3, 4)), Quick, 3, 512)
    assert time.monotonic() - started < CPU_LIMITS.wall_seconds  # no call ran to its wall
    texts = [TOK.decode(g[0].response_ids) for g in groups]
    assert "<out>error: CPU time over 1 s</out>done" in texts[0]
    assert "<out>error: output over 4096 bytes</out>done" in texts[1]
    assert "refuses os.fork" in texts[2]
    assert "<out>42\n</out>done" in texts[3]
    assert [g[0].tool_errors for g in groups] == [1, 1, 1, 0]
    assert all(len(g[0].turns) == 2 and not g[0].error for g in groups)
