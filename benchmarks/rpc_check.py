"""llama.cpp's RPC backend end to end: `--rpc` with `-ngl 99` gives the same temperature-0 text as without.

Needs the RPC build (`scripts/bootstrap --rpc`: .rpc/lib and .rpc/bin/rpc-server), which takes
too long to build in CI, so this is a script and not part of the test suite. rpc-server runs
in a network namespace of its own (a veth pair, 10.77.0.1 here and 10.77.0.2 there) when
this runs as root with `ip netns`, else on 127.0.0.1. Our server is started three times on
the embedded SmolLM2: with the normal llama-cpp-python library, with the RPC library and no
`--rpc`, and with the RPC library, `--rpc HOST:PORT -ngl 99` (every layer on the RPC device);
each answers the same temperature-0 completion, and the three texts must be equal.

    flock -s /tmp/llamaserve-heavy.lock .venv/bin/python benchmarks/rpc_check.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llamaserve.config import embedded_default_model  # noqa: E402

RPC = ROOT / ".rpc"
NS = f"lsrpc{os.getpid()}"
VETH = f"vrpc{os.getpid() % 100000}"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"
RPC_PORT = 19050
PROMPT = "The three primary colors are"


def _ip(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True).returncode == 0


def make_namespace() -> bool:
    if os.geteuid() != 0 or not _ip("netns", "add", NS):
        return False
    steps = [
        ("link", "add", VETH + "a", "type", "veth", "peer", "name", VETH + "b"),
        ("link", "set", VETH + "b", "netns", NS),
        ("addr", "add", f"{HOST_IP}/24", "dev", VETH + "a"),
        ("link", "set", VETH + "a", "up"),
        ("netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/24", "dev", VETH + "b"),
        ("netns", "exec", NS, "ip", "link", "set", VETH + "b", "up"),
        ("netns", "exec", NS, "ip", "link", "set", "lo", "up"),
    ]
    if all(_ip(*s) for s in steps):
        return True
    drop_namespace()
    return False


def drop_namespace() -> None:
    _ip("netns", "del", NS)
    _ip("link", "del", VETH + "a")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def completion(args: list[str], env: dict[str, str], log: Path) -> str:
    port = _port()
    cmd = [sys.executable, "-m", "llamaserve", "-m", embedded_default_model() or "", "-t", "1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*cmd, *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"server not ready: {log}")
            time.sleep(0.2)
        body = {"prompt": PROMPT, "n_predict": 24, "temperature": 0}
        return str(httpx.post(f"{url}/completion", json=body, timeout=120).json()["content"])
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    if not (RPC / "bin" / "rpc-server").is_file() or not (RPC / "lib" / "libllama.so").is_file():
        print("no RPC build: run scripts/bootstrap --rpc first", file=sys.stderr)
        return 1
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"rpc-check-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    namespaced = make_namespace()
    host = NS_IP if namespaced else "127.0.0.1"
    prefix = ["ip", "netns", "exec", NS] if namespaced else []
    rpc_log = open(logs / "rpc-server.log", "wb")  # noqa: SIM115 -- rpc-server writes to it until it stops
    server = subprocess.Popen(
        [*prefix, str(RPC / "bin" / "rpc-server"), "-H", host, "-p", str(RPC_PORT), "-t", "1"],
        stdout=rpc_log,
        stderr=subprocess.STDOUT,
    )
    try:
        time.sleep(1.0)
        if server.poll() is not None:
            raise SystemExit(f"rpc-server exited: {(logs / 'rpc-server.log').read_text()}")
        rpc_env = {"LLAMA_CPP_LIB_PATH": str(RPC / "lib")}
        plain = completion([], {}, logs / "plain.log")
        local = completion([], rpc_env, logs / "rpc-lib.log")
        remote = completion(["--rpc", f"{host}:{RPC_PORT}", "-ngl", "99"], rpc_env, logs / "rpc.log")
        offloaded = "RPC" in (logs / "rpc.log").read_text()
        print(f"rpc-server at {host}:{RPC_PORT} ({'its own network namespace' if namespaced else 'loopback'})")
        print(f"without --rpc (installed library): {plain!r}")
        print(f"without --rpc (RPC library):       {local!r}")
        print(f"--rpc -ngl 99:                     {remote!r}")
        same = plain == local == remote
        print("same text: " + ("yes" if same else "NO") + ("" if offloaded else " (the log does not mention RPC)"))
        return 0 if same else 1
    finally:
        server.terminate()
        server.wait(10)
        if namespaced:
            drop_namespace()


if __name__ == "__main__":
    raise SystemExit(main())
