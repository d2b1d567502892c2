"""--upstreams: a request sent to a server that refuses the connection goes to another one."""

from __future__ import annotations

import asyncio
import socket

import httpx

from llamaserve.api.edge_tools import EdgeTools
from llamaserve.config import ServerConfig
from llamaserve.edge.proxy import Upstream
from llamaserve.scale.balancer import Balancer
from llamaserve.scale.front import UPSTREAM_HEADER, create_front_app

ANSWER = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def closed_port() -> int:
    """A port nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(ANSWER)
    await writer.drain()
    writer.close()


def test_a_refused_connection_fails_over_to_a_healthy_server() -> None:
    async def main() -> None:
        server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
        alive = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        dead = f"http://127.0.0.1:{closed_port()}"
        balancer = Balancer([dead, alive])  # both healthy until a probe or a request says otherwise
        upstream = Upstream(30.0)
        app = create_front_app(ServerConfig(), balancer, upstream, EdgeTools(None, False))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as client:
            # The first request goes to the first idle server: the dead one.
            answer = await client.post("/v1/chat/completions", json={"messages": []})
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"ok": True}
            assert answer.headers[UPSTREAM_HEADER] == alive
        assert not balancer.members[dead].healthy and balancer.members[alive].healthy
        await upstream.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
