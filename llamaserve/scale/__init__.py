"""Scale-out: one front for several of our servers, with prefix-cache-aware routing.

`prefix_index.py` (chained block hashes of recent prompts per server), `balancer.py` (the
choice: conversation affinity, longest prefix, least loaded; health and load counts),
`health.py` (each member's `/health`), `front.py` (the HTTP side, forwarding through
`edge.proxy`), `server.py` (the `--upstreams` process). `llamaserve.ray` runs the same
choice in a Ray Serve ingress in front of replicas.
"""

from __future__ import annotations

from llamaserve.config import ServerConfig


def serve_upstreams(config: ServerConfig) -> int:
    from llamaserve.scale.server import serve

    return serve(config)
