"""`llama serve --ray [--replicas N | --autoscale MIN:MAX] <llama-server flags>`.

The flags are checked here as `llama-server` checks them (a bad one exits 1 before Ray
starts), then the application is deployed on the Ray cluster named by `RAY_ADDRESS` (or
one already running on this host, else a new local one). The ingress listens on the
flags' `--host`/`--port` (one HTTP proxy, on the head node); each replica's server
listens on a loopback port of its own node. Ctrl-C or SIGTERM deletes the application.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType

from llamaserve.cli import config_from_args
from llamaserve.config import ConfigError
from llamaserve.ray import parse_autoscale

log = logging.getLogger("llamaserve.ray")

APP_NAME = "llamaserve"


def split_args(args: list[str]) -> tuple[list[str], int, tuple[int, int] | None]:
    """Our three flags out of a command line; the rest is llama-server's. ValueError on a bad value."""
    rest: list[str] = []
    replicas = 1
    autoscale: tuple[int, int] | None = None
    given_replicas = False
    it = iter(args)
    for arg in it:
        if arg == "--ray":
            continue
        if arg in ("--replicas", "--autoscale"):
            value = next(it, None)
            if value is None:
                raise ValueError(f"{arg} needs a value")
            if arg == "--replicas":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"--replicas wants a whole number >= 1, not {value!r}")
                replicas, given_replicas = int(value), True
            else:
                autoscale = parse_autoscale(value)
            continue
        rest.append(arg)
    if given_replicas and autoscale is not None:
        raise ValueError("--replicas and --autoscale exclude each other")
    return rest, replicas, autoscale


def _absolute_model(argv: list[str]) -> list[str]:
    """Replicas start in Ray's working folders: a relative model path is made absolute here."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("-m", "--model") and not os.path.isabs(out[i + 1]):
            out[i + 1] = os.path.abspath(out[i + 1])
    return out


def ray_main(args: list[str]) -> int:
    try:
        rest, replicas, autoscale = split_args(args)
        config = config_from_args(rest)
        if config.upstreams or config.router:
            raise ConfigError("--ray serves one model (-m/-hf): not with --upstreams or router mode")
    except (ValueError, ConfigError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import ray  # deferred: the optional extra, only here
    from ray import serve

    from llamaserve.ray.deploy import build_app

    address = os.environ.get("RAY_ADDRESS")
    try:
        ray.init(address=address or "auto", logging_level=logging.WARNING)
    except ConnectionError:
        if address:
            raise
        ray.init(logging_level=logging.WARNING)  # no cluster running here: a local one
    argv = _absolute_model(rest)
    if config.model and "-m" not in argv and "--model" not in argv:
        argv += ["-m", config.model]  # resolved from -hf or the embedded default
    serve.start(proxy_location="HeadOnly", http_options={"host": config.host, "port": config.port})
    serve.run(build_app(argv, replicas, autoscale), name=APP_NAME, route_prefix="/")
    log.info(
        "server listening on http://%s:%d (Ray Serve, %s)",
        config.host,
        config.port,
        f"autoscale {autoscale[0]}:{autoscale[1]}" if autoscale else f"{replicas} replicas",
    )
    done = threading.Event()

    def stop(sig: int, frame: FrameType | None) -> None:
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    try:
        done.wait()
    finally:
        serve.delete(APP_NAME)
        ray.shutdown()
    return 0
