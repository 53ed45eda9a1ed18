"""Tools an MCP server serves (`rollout.mcpServers`), over stdio with the official
`mcp` SDK (the `mcp` extra), called as any other function tool.

A process that runs episodes starts each server once, on first use, in a thread
of its own (the SDK is asynchronous; the episodes' environments answer from a
thread pool): it lists the server's tools (their `inputSchema` becomes the
function's parameters, announced by the chat template like the built-ins) and
calls them. Calls go through a bounded pool of their own — at most
`maxConcurrentCalls` in flight per server, each cut at `timeoutSeconds` — apart
from the generation slots: a slow server holds up the episodes waiting on it,
never generation. A call the tool fails (`isError`) is an error message to the
model; a server that dies or stops answering ends the episodes whose calls were in
flight with the error (`ToolServerError`), and the next call starts it again. A call
cut at its time-out is followed by a ping: a server that answers it is only slow and
keeps running; one that does not is hung, and is stopped (the SDK ends its process)
so that the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout

from .functions import FunctionTool
from .sandbox import Limits, ToolResult

log = logging.getLogger("rljob.tools")


class ToolServerError(RuntimeError):
    """The server behind a tool died, cannot start or stopped answering: the episode
    that called it ends with this error."""


def _sdk():
    try:
        import mcp
        from mcp.client.stdio import stdio_client
    except ImportError:
        raise ValueError("rollout.mcpServers needs the mcp package: pip install "
                         "'rljob[mcp]'") from None
    return mcp, stdio_client


class MCPServer:
    """One stdio MCP server for this process: `tools()` lists its tools as
    FunctionTools; their calls go to `call`."""

    def __init__(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None,
                 cwd: str | None = None, timeout: float = 30.0, concurrency: int = 8,
                 only: Sequence[str] = ()):
        self.name, self.command, self.env, self.cwd = name, list(command), dict(env or {}), cwd
        self.timeout, self.concurrency, self.only = timeout, concurrency, list(only)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session = None
        self._stop: asyncio.Event | None = None
        self._ended: threading.Event | None = None
        self._sem: asyncio.Semaphore | None = None
        self.starts = 0  # how many times the server was started (a restart adds one)

    # --- the server's life: a task in the loop's thread holds the session ------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True,
                             name=f"rljob-mcp-{self.name}").start()
            self._loop = loop
        return self._loop

    def _start(self) -> None:
        """Start the server and open its session (under the lock); ToolServerError
        when it does not come up within the time-out."""
        mcp, stdio_client = _sdk()
        loop = self._ensure_loop()
        started = threading.Event()
        failure: list[BaseException] = []
        ended = threading.Event()

        async def hold() -> None:
            stop = self._stop = asyncio.Event()  # this start's: a restart makes another
            if self._sem is None:
                self._sem = asyncio.Semaphore(self.concurrency)
            params = mcp.StdioServerParameters(command=self.command[0], args=self.command[1:],
                                               env=self.env or None, cwd=self.cwd)
            mine = None
            try:
                async with stdio_client(params) as (read, write):
                    async with mcp.ClientSession(read, write) as session:
                        await session.initialize()
                        mine = self._session = session
                        started.set()
                        await stop.wait()
            except BaseException as exc:  # noqa: BLE001 - the server died or never started
                failure.append(exc)
            finally:
                if self._session is mine:  # a newer start's session stays
                    self._session = None
                started.set()
                ended.set()

        self._ended = ended
        self.starts += 1
        asyncio.run_coroutine_threadsafe(hold(), loop)
        if not started.wait(self.timeout) or self._session is None:
            why = f"{type(failure[0]).__name__}: {failure[0]}" if failure else "no answer"
            raise ToolServerError(f"the MCP server {self.name!r} ({' '.join(self.command)}) "
                                  f"did not start: {why}")

    def _session_now(self):
        with self._lock:
            if self._session is None or (self._ended is not None and self._ended.is_set()):
                self._start()
            return self._session

    def close(self) -> None:
        """Stop the server (its process ends with its session) and the loop."""
        loop, stop = self._loop, self._stop
        if loop is None:
            return
        if stop is not None and self._session is not None:
            loop.call_soon_threadsafe(stop.set)
            if self._ended is not None:
                self._ended.wait(5)
        loop.call_soon_threadsafe(loop.stop)
        self._loop = None

    def _run(self, coro_fn, *args, timeout: float):
        session = self._session_now()

        async def bounded():
            async with self._sem:  # the server's own pool: at most `concurrency` calls
                return await asyncio.wait_for(coro_fn(session, *args), timeout)

        future = asyncio.run_coroutine_threadsafe(bounded(), self._loop)
        try:
            return future.result(timeout + 5)
        except (asyncio.TimeoutError, FutureTimeout):
            future.cancel()
            if self._answers_ping(session):  # alive, only this call slow: it stays
                raise ToolServerError(f"the MCP server {self.name!r} did not answer within "
                                      f"{timeout:g} s") from None
            self._restart_later(session)  # hung: stopped (its process with it)
            log.warning("the MCP server %r answered neither a call within %g s nor a ping: "
                        "stopped, the next call starts it again", self.name, timeout)
            raise ToolServerError(f"the MCP server {self.name!r} did not answer within "
                                  f"{timeout:g} s, nor a ping after: it is started again "
                                  "for the next call") from None
        except Exception as exc:  # noqa: BLE001 - the transport broke: the server died
            self._restart_later(session)
            raise ToolServerError(f"the MCP server {self.name!r} failed: "
                                  f"{type(exc).__name__}: {exc}") from None

    def _answers_ping(self, session, seconds: float = 5.0) -> bool:
        """Whether the server answers a ping on `session` within `seconds` (outside the
        call pool, which hung calls may fill)."""
        async def ping():
            await asyncio.wait_for(session.send_ping(), seconds)

        try:
            asyncio.run_coroutine_threadsafe(ping(), self._loop).result(seconds + 2)
            return True
        except Exception:  # noqa: BLE001 - no answer, or the transport broke
            return False

    def _restart_later(self, session) -> None:
        """Forget `session` (a call on it failed): the next call starts the server
        again. A session started since is left as it is."""
        with self._lock:
            if self._session is not session:
                return
            if self._stop is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._stop.set)
            self._session = None

    # --- what episodes see ----------------------------------------------------------

    def tools(self) -> list[FunctionTool]:
        """The server's tools (those `only` names, when given) as function tools."""
        async def listed(session):
            return await session.list_tools()

        result = self._run(listed, timeout=self.timeout)
        tools = []
        for t in result.tools:
            if self.only and t.name not in self.only:
                continue
            schema = {"type": "function", "function": {
                "name": t.name, "description": (t.description or "").strip(),
                "parameters": dict(t.input_schema or {"type": "object", "properties": {}})}}
            tools.append(FunctionTool(schema, self._caller(t.name)))
        missing = sorted(set(self.only) - {t.name for t in tools})
        if missing:
            raise ValueError(f"rollout.mcpServers {self.name!r}: the server has no tool "
                             f"{', '.join(repr(m) for m in missing)} (it serves "
                             f"{', '.join(t.name for t in result.tools)})")
        return tools

    def _caller(self, tool: str):
        def run(arguments: dict, limits: Limits) -> ToolResult:
            started = time.monotonic()

            async def call(session):
                return await session.call_tool(tool, arguments)

            result = self._run(call, timeout=self.timeout)
            text = "\n".join(getattr(c, "text", "") or "" for c in result.content)
            seconds = time.monotonic() - started
            if result.is_error:
                return ToolResult("", text or f"{tool} failed", seconds)
            return ToolResult(text, "", seconds)
        return run


_SERVERS: dict[tuple, MCPServer] = {}
_SERVERS_LOCK = threading.Lock()


def server_for(spec) -> MCPServer:
    """This process's server for an `McpServerSpec` (one per spec: started once)."""
    key = (spec.name, tuple(spec.command), tuple(sorted(spec.env.items())), spec.working_dir)
    with _SERVERS_LOCK:
        if key not in _SERVERS:
            _SERVERS[key] = MCPServer(spec.name, spec.command, spec.env, spec.working_dir,
                                      spec.timeout_seconds, spec.max_concurrent_calls,
                                      spec.tools)
        return _SERVERS[key]


def close_all() -> None:
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()
