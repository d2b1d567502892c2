"""Ray Serve: replicas of our engine behind one ingress with prefix-cache-aware routing.

`pip install llamaserve[ray]`. Run from the command line with `llama serve --ray
[--replicas N | --autoscale MIN:MAX] <llama-server flags>` (`cli.py`), or with Ray's own
tool: `serve run llamaserve.ray:app args="-m model.gguf -t 4 -np 4" replicas=2` (or
`autoscale=1:4`). `replica.py` runs one engine, `routing.py` is the request router that
picks a replica through `scale.Balancer`, `ingress.py` is the HTTP side, `deploy.py`
builds the application. See docs/scale-out.md.
"""

from __future__ import annotations

import shlex
from typing import Any


def parse_autoscale(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit() or int(high) < max(1, int(low)):
        raise ValueError(f"--autoscale wants MIN:MAX with 0 <= MIN <= MAX and MAX >= 1, not {text!r}")
    return int(low), int(high)


def app(args: dict[str, str]) -> Any:
    """The application builder `serve run llamaserve.ray:app args=... replicas=N|autoscale=MIN:MAX` calls."""
    unknown = set(args) - {"args", "replicas", "autoscale"}
    if unknown:
        raise ValueError(f"unknown arguments for llamaserve.ray:app: {', '.join(sorted(unknown))}")
    autoscale = parse_autoscale(args["autoscale"]) if args.get("autoscale") else None
    from llamaserve.ray.deploy import build_app  # deferred: ray only when deploying

    return build_app(shlex.split(args.get("args", "")), int(args.get("replicas", "1")), autoscale)
