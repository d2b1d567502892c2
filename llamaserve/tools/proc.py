"""One child process for a tool: argv (never a shell string we build), a size cap on what it
prints, a timeout that kills its whole process group, and output handed over as it arrives."""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

ChunkSink = Callable[[str], bool]  # gets each piece of output; False stops the child


class StreamSink:
    """A ChunkSink for a reader that can go away: once `closed`, the child is stopped (within
    0.1 s, even if it prints nothing more)."""

    def __init__(self, push: Callable[[str], object]) -> None:
        self._push = push
        self.closed = False

    def __call__(self, chunk: str) -> bool:
        if not self.closed:
            self._push(chunk)
        return not self.closed


@dataclass
class ExecResult:
    output: str
    exit_code: int = -1
    timed_out: bool = False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The child leads its own session, so a shell's children (and anything holding our pipes)
    # go with it; otherwise a grandchild would keep the read below open past the timeout.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    argv: list[str],
    max_output: int,
    timeout: float,
    on_chunk: Callable[[str], bool] | None = None,
    combine_stderr: bool = True,
    cwd: str | None = None,
    stdin_data: bytes | None = None,
) -> ExecResult:
    """Run `argv`; `on_chunk` sees each piece of output and stops the child by returning False."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,
        )
    except (OSError, ValueError):
        return ExecResult("failed to spawn process")
    timed_out = threading.Event()
    finished = threading.Event()

    def watch() -> None:
        # The deadline, and a reader that went away (a closed StreamSink) even while the
        # command prints nothing: either ends the child's whole group.
        deadline = time.monotonic() + timeout
        while not finished.wait(0.1):
            if time.monotonic() >= deadline:
                timed_out.set()
                _kill_group(proc)
                return
            if getattr(on_chunk, "closed", False):
                _kill_group(proc)
                return

    threading.Thread(target=watch, daemon=True).start()
    if stdin_data is not None and proc.stdin is not None:
        # A writer thread: a child that prints before it has read everything must not deadlock us.
        threading.Thread(target=_feed, args=(proc.stdin, stdin_data), daemon=True).start()
    out = bytearray()
    truncated = False
    # Whole UTF-8 characters only go to on_chunk; one cut between reads waits for its tail.
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        while True:
            data = os.read(fd, 4096)
            if not data:
                break
            if truncated:
                continue  # keep draining, or the child blocks on a full pipe
            room = max_output - len(out)
            piece = data[:room]
            out += piece
            if len(data) > room:
                truncated = True
            if on_chunk is not None and piece:
                text = decoder.decode(piece)
                if text and not on_chunk(text):
                    _kill_group(proc)
                    break
    finally:
        proc.stdout.close()
    code = proc.wait()
    finished.set()
    tail = decoder.decode(b"", final=True)
    if on_chunk is not None and tail:
        on_chunk(tail)
    text = out.decode("utf-8", "replace")
    if truncated:
        text += "\n[output truncated]"
    return ExecResult(text, code, timed_out.is_set())


def _feed(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass
