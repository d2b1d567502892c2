"""Agent tools, as llama-server offers them to its web UI: the seven built-in tools (`builtin.py`,
through the host or an isolate, `fileio.py`), MCP servers over stdio (`mcp.py`), and the
`Toolbox` that lists them and prepares each call (`registry.py`). No HTTP here: the routes
are `api/routes_tools.py`."""
