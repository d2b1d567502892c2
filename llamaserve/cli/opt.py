"""One flag of llama-server's: spellings, value check, environment variable, group, and what it sets.

The rows themselves are in the `options_*.py` modules. A few stand for features that are filed
but not built: they parse and check their value, and then
the server refuses to start with a message that names the missing feature, never ignoring them.

Every other row's value reaches code that acts on it (`tests/unit/test_flags_reach.py` checks
that the config field it fills is read outside `cli/` and `config.py`). A row whose value can
reach nothing says why in the row itself: `feature` (refused: not built), `removed` (refused:
llama-server removed it) or `noop` (accepted with a warning: llama-server reads it nowhere
either). There is no other list of exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["value", "list", "flag", "pair", "two", "action", "preset"]

COMMON = "common params"
SAMPLING = "sampling params"
SERVER = "server-specific params"


@dataclass(frozen=True)
class Opt:
    """One flag.

    kind: "value" takes one argument; "list" takes one and may repeat (values accumulate);
    "two" takes two; "flag" sets `const`; "pair" is an on/off switch whose `neg` spellings turn
    it off; "action" runs and exits (--version); "preset" applies `const` (a dict of settings).
    """

    names: tuple[str, ...]
    dest: str
    kind: Kind = "value"
    type: Callable[[str], Any] = str
    metavar: str = ""
    env: str | None = None
    const: Any = True
    neg: tuple[str, ...] = ()
    help: str = ""
    group: str = COMMON
    feature: str | None = None  # not built yet: giving it exits 1, naming the feature
    removed: str | None = None  # llama-server removed it: giving it exits 1 with this advice
    hardware: bool = False  # acts only where llama.cpp has a GPU backend
    inert: tuple[Any, ...] = ()  # values of a pending feature's flag that leave the feature off
    noop: str | None = None  # llama-server parses it and reads it nowhere: giving it warns with this reason

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.names + self.neg


def row(names: str, dest: str, kind: Kind = "value", **kw: Any) -> Opt:
    """A row: `names` and `neg` are space-separated spellings."""
    neg = tuple(kw.pop("neg", "").split())
    return Opt(tuple(names.split()), dest, kind, neg=neg, **kw)


def preset(name: str, settings: dict[str, Any], helptext: str, feature: str | None = None) -> Opt:
    return row(name, "preset", "preset", const=settings, help=helptext, group=SERVER, feature=feature)
