"""llama.cpp's RPC backend: `--rpc` with `-ngl 99` gives the same temperature-0 text as without.

Uses the RPC build of scripts/bootstrap (scripts/build_rpc.sh: .rpc/lib, a libllama with
GGML_RPC=ON, and .rpc/bin/rpc-server). rpc-server runs in a network namespace of its own (a
veth pair: 10.77.0.1 here, 10.77.0.2 there) when the tests run as root with `ip netns`,
else on 127.0.0.1. Our server answers the same temperature-0 completion three ways on the
embedded SmolLM2: with the installed llama-cpp-python library, with the RPC library alone,
and with the RPC library, `--rpc HOST:PORT -ngl 99` (every layer on the RPC device).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import REPO, start_server, stop_server

RPC = REPO / ".rpc"
HOST_IP, NS_IP = "10.77.0.1", "10.77.0.2"
PROMPT = "The three primary colors are"


def _ip(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True).returncode == 0


class Namespace:
    def __init__(self) -> None:
        self.name = f"lsrpc{os.getpid()}"
        self.veth = f"vrpc{os.getpid() % 100000}"

    def create(self) -> bool:
        if os.geteuid() != 0 or not _ip("netns", "add", self.name):
            return False
        a, b, ns = self.veth + "a", self.veth + "b", self.name
        steps = [
            ("link", "add", a, "type", "veth", "peer", "name", b),
            ("link", "set", b, "netns", ns),
            ("addr", "add", f"{HOST_IP}/24", "dev", a),
            ("link", "set", a, "up"),
            ("netns", "exec", ns, "ip", "addr", "add", f"{NS_IP}/24", "dev", b),
            ("netns", "exec", ns, "ip", "link", "set", b, "up"),
            ("netns", "exec", ns, "ip", "link", "set", "lo", "up"),
        ]
        if all(_ip(*s) for s in steps):
            return True
        self.drop()
        return False

    def drop(self) -> None:
        _ip("netns", "del", self.name)
        _ip("link", "del", self.veth + "a")


@pytest.fixture(scope="module")
def rpc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a running rpc-server."""
    binary = RPC / "bin" / "rpc-server"
    assert binary.is_file() and (RPC / "lib" / "libllama.so").is_file(), "no RPC build: run scripts/bootstrap"
    tmp = tmp_path_factory.mktemp("rpc")
    ns = Namespace()
    namespaced = ns.create()
    host = NS_IP if namespaced else "127.0.0.1"
    prefix = ["ip", "netns", "exec", ns.name] if namespaced else []
    port = 19050
    with open(tmp / "rpc-server.log", "wb") as log:
        proc = subprocess.Popen([*prefix, str(binary), "-H", host, "-p", str(port), "-t", "1"], stdout=log, stderr=log)
    try:
        yield f"{host}:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        if namespaced:
            ns.drop()


def _text(args: list[str], env: dict[str, str], tmp: Path, model_path: str) -> tuple[str, str]:
    srv = start_server(["-m", model_path, "-t", "1", "-c", "512", *args], tmp, env=env)
    try:
        body = {"prompt": PROMPT, "n_predict": 24, "temperature": 0}
        return str(httpx.post(f"{srv.url}/completion", json=body, timeout=120).json()["content"]), srv.log()
    finally:
        stop_server(srv)


def test_rpc_offload_gives_the_same_text_as_without(rpc_server: str, model_path: str, tmp_path: Path) -> None:
    rpc_lib = {"LLAMA_CPP_LIB_PATH": str(RPC / "lib")}
    plain, _ = _text([], {}, tmp_path, model_path)
    local, _ = _text([], rpc_lib, tmp_path, model_path)
    remote, log = _text(["--rpc", rpc_server, "-ngl", "99", "-v"], rpc_lib, tmp_path, model_path)
    assert plain and plain == local == remote
    # llama.cpp's load log (-v) says where the layers went.
    assert f"using device RPC0 ({rpc_server})" in log
    assert "layer  29 assigned to device RPC0" in log


def test_an_unreachable_rpc_server_is_a_clear_error(model_path: str, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"cannot reach the RPC server 127\.0\.0\.1:1"):
        start_server(["-m", model_path, "--rpc", "127.0.0.1:1"], tmp_path, env={"LLAMA_CPP_LIB_PATH": str(RPC / "lib")})
    with pytest.raises(RuntimeError, match="no RPC backend"):
        start_server(["-m", model_path, "--rpc", "127.0.0.1:1"], tmp_path)
