"""A download progress bar on stderr: percent, MiB done / total, MiB/s.

On a terminal one line is redrawn in place; anywhere else (a log file, a pipe)
a line is written at each quarter so logs stay short but still show progress.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

MIB = 1024 * 1024
_REDRAW_S = 0.2  # terminal redraws at most this often
_STEPS = 4  # lines per download when not on a terminal
_UNKNOWN_STEP = 256 * MIB  # without a total, one line per this many bytes off a terminal


class ProgressBar:
    """Shows one file's download; `start` is what a resumed `.part` already held."""

    def __init__(
        self, label: str, total: int | None, *, start: int = 0, stream: TextIO | None = None, tty: bool | None = None
    ) -> None:
        self.label = label
        self.total = total
        self.start = start
        self.done = start
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.began = time.monotonic()
        self._last_draw = 0.0
        self._next_step = self._step_after(start)
        self._finished = False

    def _step_after(self, done: int) -> int:
        if self.total:
            quarter = self.total / _STEPS
            return int((int(done / quarter) + 1) * quarter)
        return (done // _UNKNOWN_STEP + 1) * _UNKNOWN_STEP

    def speed(self) -> float:
        """MiB/s over this run's bytes only (a resumed part's bytes were not fetched now)."""
        elapsed = max(time.monotonic() - self.began, 1e-6)
        return (self.done - self.start) / MIB / elapsed

    def text(self) -> str:
        mib = self.done / MIB
        rate = f"{self.speed():.1f} MiB/s"
        if self.total:
            pct = 100.0 * self.done / self.total
            width = 24
            filled = min(width, int(width * self.done / self.total))
            bar = "#" * filled + "-" * (width - filled)
            return f"{self.label} [{bar}] {pct:5.1f}% {mib:.1f}/{self.total / MIB:.1f} MiB {rate}"
        return f"{self.label} {mib:.1f} MiB {rate}"

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= _REDRAW_S:
                self._last_draw = now
                self.stream.write("\r" + self.text() + "\033[K")
                self.stream.flush()
        elif done >= self._next_step and not (self.total and done >= self.total):
            self._next_step = self._step_after(done)
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """The last line (always written, so a log shows the 100% and the rate)."""
        if self._finished:
            return
        self._finished = True
        self.stream.write(("\r" if self.tty else "") + self.text() + ("\033[K\n" if self.tty else "\n"))
        self.stream.flush()

    def abandon(self) -> None:
        """End a terminal line left mid-redraw, so an error message starts on its own line."""
        if self.tty and not self._finished:
            self._finished = True
            self.stream.write("\n")
            self.stream.flush()
