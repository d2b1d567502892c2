"""A two-node Ray cluster on this machine for the Ray Serve tests: a head and a worker node.

Both nodes listen on 127.0.0.1 with explicit ports (two raylets on one host must not share
any), one CPU each, so two one-thread replicas land on different nodes. Each `ray start
--block` runs in a process group of its own; stopping kills those groups (the raylets,
object stores and workers they started), never other Ray processes of the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


@dataclass
class RayCluster:
    address: str
    temp_dir: Path
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
        deadline = time.time() + 5
        for node in self.nodes:
            try:
                node.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(node.pid, signal.SIGKILL)  # whatever of the group is left
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _ports(base: int) -> list[str]:
    return [
        f"--node-manager-port={base}",
        f"--object-manager-port={base + 1}",
        f"--dashboard-agent-listen-port={base + 2}",
        f"--dashboard-agent-grpc-port={base + 3}",
        f"--runtime-env-agent-port={base + 4}",
        f"--metrics-export-port={base + 5}",
        f"--min-worker-port={base + 10}",
        f"--max-worker-port={base + 29}",
    ]


def start_cluster(tmp: Path, gcs_port: int, base_port: int) -> RayCluster:
    """Head with the GCS on `gcs_port`; node ports from `base_port` (40 per node)."""
    temp_dir = Path("/tmp") / f"ray-t{os.getpid()}"  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
    address = f"127.0.0.1:{gcs_port}"
    cluster = RayCluster(address, temp_dir)
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--object-store-memory=100000000"]
    head = [RAY, "start", "--head", f"--port={gcs_port}", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
    head += [f"--ray-client-server-port={base_port + 35}", *common, *_ports(base_port)]
    worker = [RAY, "start", f"--address={address}", *common, *_ports(base_port + 40)]
    try:
        for i, cmd in enumerate((head, worker)):
            log = open(tmp / f"ray-node-{i}.log", "wb")  # noqa: SIM115 -- the node writes to it until it stops
            cluster.nodes.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            )
            _wait_nodes(address, i + 1, env, cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_nodes(address: str, count: int, env: dict[str, str], cluster: RayCluster, timeout: float = 90) -> None:
    probe = (
        "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        for node in cluster.nodes:
            if node.poll() is not None:
                raise RuntimeError(f"a ray node exited with {node.returncode}")
        out = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, env=env, timeout=60)
        if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= count:
            return
        time.sleep(1)
    raise RuntimeError(f"the Ray cluster did not reach {count} nodes")
