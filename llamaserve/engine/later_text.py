"""The text half of one step's tokens whose requests surely go on, made while the next step
runs (`token_outcome.goes_on_whatever_its_text`)."""

from __future__ import annotations

from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.outbox import Outbox, deliver, events_for
from llamaserve.engine.runner import Runner, Sample
from llamaserve.engine.token_outcome import take_text


class LaterText:
    """The scheduler hands `run` to the next step as its `meanwhile`, so the detokenizing, the
    events and the wakeup of the event loop leave the path from one step to the next. Each
    slot's text still comes in order and before anything else of its request: it runs before
    the next step's results are taken, and before any message is handled. `run` works once.
    """

    def __init__(self, rows: list[tuple[Slot, Sample]], now: float, runner: Runner) -> None:
        self._rows = rows
        self._now = now
        self._runner = runner
        self._done = False

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        outbox: Outbox = {}
        for slot, sample in self._rows:
            task = slot.task
            assert task is not None  # nothing ends a request before its later text has run
            take_text(slot, sample, self._now, self._runner, events_for(outbox, task))
        deliver(outbox)
