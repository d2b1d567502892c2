"""A hand-written MCP server (one JSON-RPC message per line on stdio) that can echo, sleep or
crash, and appends its pid to the file named by $MCP_PID_LOG each time it starts."""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS = [
    {
        "name": "echo",
        "description": "Echo a message",
        "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    },
    {
        "name": "sleep",
        "description": "Sleep some seconds",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {"name": "crash", "description": "Exit without answering", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "fail", "description": "Answer with isError", "inputSchema": {"type": "object", "properties": {}}},
]


def reply(req_id: object, result: object) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result}) + "\n")
    sys.stdout.flush()


def main() -> None:
    with open(os.environ["MCP_PID_LOG"], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    for line in sys.stdin:
        req = json.loads(line)
        method, req_id = req.get("method"), req.get("id")
        if method == "initialize":
            reply(
                req_id,
                {
                    "protocolVersion": "2024-11-05",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            )
        elif method == "tools/list":
            reply(req_id, {"tools": TOOLS})
        elif method == "tools/call":
            name, args = req["params"]["name"], req["params"].get("arguments") or {}
            if name == "echo":
                reply(req_id, {"content": [{"type": "text", "text": f"echo: {args['message']} pid={os.getpid()}"}]})
            elif name == "sleep":
                time.sleep(float(args.get("seconds", 30)))
                reply(req_id, {"content": [{"type": "text", "text": "woke up"}]})
            elif name == "crash":
                os._exit(3)
            elif name == "fail":
                reply(req_id, {"content": [{"type": "text", "text": "it went wrong"}], "isError": True})
        elif req_id is not None:
            sys.stdout.write(
                json.dumps({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "Method not found"}})
                + "\n"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
