"""MCP tools (rollout.mcpServers) against a real MCP server over stdio (the official
SDK on both sides: examples/tools/table_server.py): its tools are listed with their
schemas and called as any other tool; a tool's own failure is an error message; the
calls of one server go through its bounded pool; a server killed while a call is in
flight ends the episode that made it with the error, the other episodes go on, and the
next call starts the server again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.tiers import import_or_skip  # noqa: E402

import_or_skip("mcp", "mcp", "the mcp extra (pip install 'rljob[mcp]')")

from rljob.api.spec import McpServerSpec  # noqa: E402
from rljob.environments import environment_factory  # noqa: E402
from rljob.environments.chat import ChatTurns  # noqa: E402
from rljob.rollout.engine import Generation, RolloutEngine, SamplingParams  # noqa: E402
from rljob.rollout.episodes import run_episodes  # noqa: E402
from rljob.tools.mcp import MCPServer, ToolServerError  # noqa: E402
from tests import zoo  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, str(REPO / "examples/tools/table_server.py")]


@pytest.fixture
def server():
    s = MCPServer("table", SERVER, timeout=20, concurrency=2)
    yield s
    s.close()


def _pids(name: str) -> list[int]:
    """The processes running `name` (the server's script)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if name in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return [p for p in out if p != os.getpid()]


def test_the_servers_tools_are_listed_with_their_schemas_and_called(server):
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == {"lookup", "slow"}
    fn = tools["lookup"].schema["function"]
    assert fn["description"].startswith("The population of a city, in thousands.")
    assert fn["parameters"]["required"] == ["city"]
    assert fn["parameters"]["properties"]["city"]["type"] == "string"
    assert tools["lookup"]({"city": "Avalon"}).output == "89"
    bad = tools["lookup"]({"city": "Nowhere"})
    assert not bad.ok and bad.error.endswith("no city 'Nowhere' in the table")
    assert tools["lookup"]({}).error == "lookup: missing argument 'city'"
    assert server.starts == 1


def test_a_servers_calls_go_through_its_bounded_pool(server):
    slow = {t.name: t for t in server.tools()}["slow"]
    done = []

    def call():
        done.append((slow({"seconds": 1.0}).output, time.monotonic()))

    t0 = time.monotonic()
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # four 1 s calls, two at a time: two rounds
    assert [o for o, _ in done] == ["waited 1 s"] * 4
    assert sorted(t - t0 for _, t in done)[2] >= 1.9


def test_only_the_named_tools_and_a_clear_line_for_a_missing_one():
    s = MCPServer("table", SERVER, timeout=20, only=["lookup"])
    try:
        assert [t.name for t in s.tools()] == ["lookup"]
    finally:
        s.close()
    s = MCPServer("table", SERVER, timeout=20, only=["lookup", "weather"])
    try:
        with pytest.raises(ValueError, match="the server has no tool 'weather'"):
            s.tools()
    finally:
        s.close()
    s = MCPServer("broken", [sys.executable, "-c", "import sys; sys.exit(3)"], timeout=5)
    try:
        with pytest.raises(ToolServerError, match="the MCP server 'broken'"):
            s.tools()
    finally:
        s.close()


class Calls(RolloutEngine):
    """Every episode asks the slow tool first (episode 0 of each prompt: long enough
    to be killed during it), then answers."""

    def __init__(self, tok):
        self.tok, self.turn = tok, 0

    def generate(self, prompts, params):
        self.turn += 1
        outs = []
        for k, _ in enumerate(prompts):
            if self.turn == 1:
                seconds = 5 if k == 0 else 0.1
                text = ('<tool_call>\n{"name": "slow", "arguments": {"seconds": %s}}\n'
                        '</tool_call>' % seconds)
            else:
                text = "done"
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            outs.append([Generation(ids, [-0.1] * len(ids)) for _ in range(params.n)])
        return outs

    def load_weights(self, state_dict, version, epoch=0):
        pass


def test_a_server_killed_mid_episode_ends_that_episode_and_the_next_call_restarts_it():
    from rljob.inputs.data import prompt_ids
    from rljob.tools import mcp as mcp_tools

    spec = McpServerSpec(name="table-kill", command=SERVER, timeout_seconds=20)
    tools = mcp_tools.server_for(spec).tools()
    server = mcp_tools.server_for(spec)
    try:
        tok = zoo._tokenizer("bytelevel", 400, zoo.TEMPLATES["qwen2.5"], tuple(zoo.QWEN_ADDED))
        schemas = [t.schema for t in tools]
        make_env = environment_factory("tools", tools, "hermes")
        prompts = [prompt_ids(tok, f"q{k}", schemas) for k in range(3)]
        assert ChatTurns.of(tok, schemas) is not None
        [pid] = _pids("table_server.py") or [None]

        def kill():  # while episode 0's 5 s call is in flight
            time.sleep(2)
            os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill)
        killer.start()
        groups = run_episodes(Calls(tok), tok, prompts, [{"prompt": "q"}] * 3,
                              SamplingParams(n=1, seeds=(1, 2, 3)), make_env, 3, 256)
        killer.join()
        episodes = [g[0] for g in groups]
        # the killed call's episode ends with the server's error, after its one turn
        assert "the MCP server 'table-kill' failed" in episodes[0].error
        assert len(episodes[0].turns) == 1 and episodes[0].done
        # the others had their answers before the kill and went on to their end
        assert [e.error for e in episodes[1:]] == ["", ""]
        assert all(e.turns[-1] == "done" and e.tool_calls == 1 for e in episodes[1:])
        # the next call starts the server again
        look = {t.name: t for t in tools}["lookup"]
        assert look({"city": "Avalon"}).output == "89"
        assert server.starts == 2
    finally:
        mcp_tools.close_all()


def test_a_relative_command_is_read_from_the_job_files_directory():
    """`command: [python, tools/table_server.py]` in a job beside examples/tools: the
    server runs in the job file's directory (preflight.resolve_paths sets workingDir),
    and `rljob validate` announces its tools with the job's."""
    import yaml

    from rljob.api.resource import RLJob
    from rljob.preflight import check, resolve_paths
    from rljob.tools import mcp as mcp_tools
    from rljob.tools.catalog import job_tools

    doc = yaml.safe_load((REPO / "examples/agentic-tools.yaml").read_text())
    doc["spec"]["rollout"]["mcpServers"] = [
        {"name": "table-relative", "command": [sys.executable, "tools/table_server.py"],
         "tools": ["lookup"]}]
    job = resolve_paths(RLJob.model_validate(doc), REPO / "examples")
    [server] = job.spec.rollout.mcp_servers
    assert server.working_dir == str(REPO / "examples")
    try:
        assert [t.name for t in job_tools(job.spec.rollout)] == ["calculator", "lookup"]
        # the server's tool is announced too: the example's prompts (the RL's and the
        # warm-up's) grow from 146 tokens to more than the tiny model's 256 positions,
        # and validate says so for each file
        problems = check(job)
        assert [p.split(":")[0] for p in problems] == ["dataset.path", "dataset.warmupPath"]
        assert all(": the longest prompt is 313 tokens, but the model has 256 positions" in p
                   for p in problems), problems
    finally:
        mcp_tools.close_all()


def test_a_hung_server_is_stopped_after_its_time_out_and_the_next_call_gets_a_new_one():
    """A call cut at its time-out is followed by a ping: a server that is only slow
    (it answers the ping) keeps running; one that answers nothing is stopped (its
    process killed) and the next call is answered by a new one."""
    hanging = [sys.executable, str(Path(__file__).with_name("hanging_server.py"))]
    server = MCPServer("hanging", hanging, timeout=30, concurrency=4)
    try:
        tools = {t.name: t for t in server.tools()}
        first = tools["add"]({"a": 1, "b": 2}).output
        server.timeout = 2  # the calls' time-out from here (a start took its own above)
        assert first.startswith("3 from ")
        # slow but alive: the call fails at its time-out, the server stays
        with pytest.raises(ToolServerError, match=r"did not answer within 2 s$"):
            tools["wait"]({"seconds": 30})
        assert tools["add"]({"a": 2, "b": 2}).output == f"4 from {first.split()[-1]}"
        assert server.starts == 1
        # hung: no answer to the call nor to the ping; stopped, and its process goes
        [pid] = _pids("hanging_server.py")
        with pytest.raises(ToolServerError, match="nor a ping after: it is started again"):
            tools["hang"]({})
        deadline = time.monotonic() + 10
        while pid in _pids("hanging_server.py") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid not in _pids("hanging_server.py"), "the hung server still runs"
        server.timeout = 30  # room for the new server's start on a busy machine
        again = tools["add"]({"a": 3, "b": 4}).output
        assert again.startswith("7 from ") and again != f"7 from {pid}"
        assert server.starts == 2
    finally:
        server.close()


def _mcp1_python() -> str:
    """An environment of the MCP SDK's 1.x line (locks/mcp1.txt), made once per lock and
    Python under ~/.cache/rljob/mcp1 by the pinned uv: where a server from PyPI that
    pins `mcp<2` runs."""
    import hashlib
    import shutil

    lock = REPO / "locks/mcp1.txt"
    key = hashlib.sha256(lock.read_bytes() + sys.version.encode()).hexdigest()[:16]
    root = Path(os.environ.get("RLJOB_MCP1_CACHE", Path.home() / ".cache/rljob/mcp1"))
    env = root / key
    if not (env / ".complete").exists():
        uv = subprocess.run(["bash", str(REPO / "scripts/uv.sh")], capture_output=True,
                            text=True, check=True).stdout.strip().splitlines()[-1]
        shutil.rmtree(env, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        done = subprocess.run([uv, "pip", "sync", "-q", "--python", str(env / "bin/python"),
                               str(lock)], capture_output=True, text=True)
        assert done.returncode == 0, f"the 1.x SDK's environment: {done.stderr[-2000:]}"
        (env / ".complete").touch()
        for old in root.iterdir():  # those of older locks go
            if old.name != key:
                shutil.rmtree(old, ignore_errors=True)
    return str(env / "bin/python")


def test_a_server_on_the_1x_sdk_runs_from_its_own_environment_for_our_2x_client():
    """examples/tools/legacy_sdk_server.py (FastMCP of the SDK's 1.x line, as servers on
    PyPI pinned to it are written) from an environment of its own: our client, on the
    2.x SDK, lists its tool with the server's own names and calls it."""
    import mcp as sdk
    from importlib.metadata import version

    python = _mcp1_python()
    assert version("mcp").split(".")[0] == "2" and sdk is not None  # the client's side
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert out.split(".")[0] == "1", out  # the server's side
    server = MCPServer("units", [python, str(REPO / "examples/tools/legacy_sdk_server.py")],
                       timeout=30)
    try:
        [tool] = server.tools()
        fn = tool.schema["function"]
        assert fn["name"] == "to_celsius" and fn["parameters"]["required"] == ["fahrenheit"]
        assert tool({"fahrenheit": 212}).output == "100.0"
        assert "fahrenheit" in tool({}).error  # the server's own argument names
    finally:
        server.close()
