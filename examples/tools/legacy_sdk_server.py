"""An MCP server written for the SDK's 1.x line (`mcp.server.fastmcp`), as many servers
on PyPI are: it runs from an environment of its own, beside the job's 2.x client. Make
the environment once and name its interpreter in the job:

    python3 -m venv /opt/mcp-legacy && /opt/mcp-legacy/bin/pip install 'mcp<2'

    rollout:
      mcpServers:
        - name: units
          command: [/opt/mcp-legacy/bin/python, tools/legacy_sdk_server.py]

(`uvx --from 'PACKAGE==VERSION' COMMAND` does the same for a server published as a
package.) Its one tool converts Fahrenheit to Celsius."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("units", log_level="ERROR")


@server.tool()
def to_celsius(fahrenheit: float) -> str:
    """Degrees Celsius of a Fahrenheit temperature, to one decimal."""
    return f"{(fahrenheit - 32) * 5 / 9:.1f}"


if __name__ == "__main__":
    server.run()
