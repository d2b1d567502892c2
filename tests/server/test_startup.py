"""Start-up: a default server loads none of the optional subsystems, and is healthy only once it
can answer (the model loads while the app is imported: api/server.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.server.conftest import REPO, free_port

# Run in the server's own process: once /health says 200, one completion at once, then what
# the process has imported, then SIGTERM (a clean stop).
_WATCHED_SERVER = """
import http.client, json, os, signal, sys, threading, time
from llamaserve.cli import main

PORT = int(sys.argv[1])
OPTIONAL = ("mcp", "httpx", "ray", "opentelemetry.sdk", "opentelemetry.exporter", "llamaserve.tools.mcp_client",
            "llamaserve.hub.resolve", "llamaserve.router", "llamaserve.scale", "llamaserve.telemetry.provider")

def ask(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()

def watch():
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ask("GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.01)
    status, body = ask("POST", "/completion", json.dumps({"prompt": "Hello", "n_predict": 2}))
    loaded = sorted(m for m in sys.modules if any(m == o or m.startswith(o + ".") for o in OPTIONAL))
    print(json.dumps({"status": status, "content": json.loads(body).get("content"), "loaded": loaded}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
sys.exit(main(["--port", str(PORT), "-t", "1"]))
"""


def test_a_default_server_answers_once_healthy_and_loads_no_optional_subsystem() -> None:
    """README's first command (no flags: the embedded model): the MCP SDK, the HTTP client
    (downloads, the proxies, remote media), Ray, the OpenTelemetry SDK, the router and the
    front stay unloaded, each costing start-up time only where its feature is on; and the
    first request sent when /health turns 200 is answered."""
    run = subprocess.run(
        [sys.executable, "-c", _WATCHED_SERVER, str(free_port())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["status"] == 200, report
    assert isinstance(report["content"], str) and report["content"], report
    assert report["loaded"] == [], report
