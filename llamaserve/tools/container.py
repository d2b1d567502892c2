"""`--tools-runtime docker:IMAGE` / `podman:IMAGE`: a container spawned for the server, reused by
every call, and gone when the server stops. Its shell (pid 1) reads a stdin we keep open, so
closing that pipe ends the container and `--rm` removes it; one that dies is spawned again."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time

from llamaserve.tools.fileio import RuntimeRefused, parse_container_spec, valid_container_id

log = logging.getLogger("llamaserve.tools")


class SpawnedContainer:
    def __init__(self, spec: str) -> None:
        parsed = parse_container_spec(spec)
        if parsed is None or parsed[2]:
            raise RuntimeRefused(f"unknown --tools-runtime option: {spec}")
        self.engine, self.image = parsed[0], parsed[1]
        if not self.image:
            raise RuntimeRefused(f"--tools-runtime {self.engine}:<image> requires an image name")
        if self.image.startswith("-"):
            # The image lands on `<engine> run`'s command line: it must not read as an option.
            raise RuntimeRefused(f"invalid image name: {self.image}")
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self.container_id = ""
        self._spawn()

    def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="llamaserve-tools-cid-")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses to overwrite an existing cid file
        argv = [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, "--", self.image, "sh"]
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        except OSError as exc:
            raise RuntimeRefused(f"failed to spawn {self.engine} container for tools runtime: {exc}") from exc
        cid = ""
        for _ in range(100):
            try:
                with open(cidfile, encoding="ascii") as fh:
                    cid = fh.read().strip()
            except OSError:
                pass
            if cid or self._proc.poll() is not None:
                break
            time.sleep(0.1)
        try:
            os.unlink(cidfile)
        except OSError:
            pass
        if not valid_container_id(cid):
            self._proc.kill()
            raise RuntimeRefused(f"timed out waiting for {self.engine} container to start (image: {self.image})")
        self.container_id = cid

    def spec(self) -> str:
        """The runtime a call uses: the container, spawned again if it died."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                log.warning("%s tools runtime container %s died, respawning", self.engine, self.container_id)
                self._spawn()
            return f"{self.engine}-container:{self.container_id}"

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
