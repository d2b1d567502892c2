"""The events one step produces, gathered per request and sent once per request at its end:
one hand-off to the event loop per request and step, not one per event."""

from __future__ import annotations

from llamaserve.engine.kv.slot import Task
from llamaserve.engine.types import Event, EventSink

# task id -> (its sink, the events for it so far)
Outbox = dict[int, tuple[EventSink, list[Event]]]


def events_for(outbox: Outbox, task: Task) -> list[Event]:
    """The list a step appends ``task``'s events to."""
    entry = outbox.get(task.id)
    if entry is None:
        entry = outbox[task.id] = (task.sink, [])
    return entry[1]


def deliver(outbox: Outbox) -> None:
    """Send each request the events gathered for it (none to a request that got none)."""
    for sink, events in outbox.values():
        if events:
            sink(events)
