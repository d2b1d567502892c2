"""An MCP server built with the official SDK (MCPServer, formerly FastMCP), over stdio."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

app = MCPServer("sdk-test")


@app.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@app.tool()
def where() -> str:
    """The server's working directory and its MCP_TEST_VAR."""
    return f"{os.getcwd()}|{os.environ.get('MCP_TEST_VAR', '')}"


if __name__ == "__main__":
    app.run()
