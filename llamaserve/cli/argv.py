"""Reading a llama-server command line and its LLAMA_ARG_* variables, exactly as llama-server does.

Not argparse: argparse abbreviates long options (`--reasoning` would match `--reasoning-format`)
and reads `-ctk q8_0` as `-c tk`, both of which break llama-server command lines. Here a spelling
matches only itself, `--a_b` is read as `--a-b` as llama-server does, a value is always the next
word (so `-1` can be one), and a command-line flag beats its environment variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamaserve.cli.options import BY_SPELLING, OPTIONS, Opt
from llamaserve.cli.values import parse_bool


class UsageError(ValueError):
    """The command line or an environment variable cannot be used; the message says why."""


@dataclass(frozen=True)
class Given:
    """One flag that was set, where it came from, and the value it got."""

    opt: Opt
    source: str  # the spelling used, or the environment variable's name
    value: Any


@dataclass
class Parsed:
    values: dict[str, Any] = field(default_factory=dict)  # dest -> value
    given: list[Given] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)  # dests of informational flags, in order


def _convert(opt: Opt, source: str, text: str) -> Any:
    try:
        return opt.type(text)
    except ValueError as exc:
        raise UsageError(f'error while handling argument "{source}": {exc}') from exc


def _store(parsed: Parsed, opt: Opt, source: str, value: Any) -> None:
    if opt.removed:
        raise UsageError(f'argument "{source}": the argument has been removed. {opt.removed}')
    parsed.given.append(Given(opt, source, value))
    if opt.kind == "list":
        parsed.values.setdefault(opt.dest, []).append(value)
    elif opt.kind == "preset":
        parsed.values.update(value)
    else:
        parsed.values[opt.dest] = value


def _from_env(parsed: Parsed, environ: Mapping[str, str]) -> None:
    for opt in OPTIONS:
        if not opt.env or opt.env not in environ:
            continue
        raw = environ[opt.env]
        try:
            if opt.kind == "flag":
                if not parse_bool(raw):
                    continue
                value: Any = opt.const
            elif opt.kind == "pair":
                value = parse_bool(raw)
            else:
                value = opt.type(raw)
        except ValueError as exc:
            raise UsageError(f'error while handling environment variable "{opt.env}": {exc}') from exc
        _store(parsed, opt, opt.env, value)


def _spelling(arg: str) -> str:
    # llama-server reads `--ctx_size` as `--ctx-size`; short flags are left alone.
    return arg.replace("_", "-") if arg.startswith("--") else arg


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> Parsed:
    """Environment first, then the command line over it."""
    parsed = Parsed()
    _from_env(parsed, environ)
    cli_set: set[str] = set()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = _spelling(args[i])
        attached: str | None = None
        if arg not in BY_SPELLING and arg.startswith("--") and "=" in arg:
            arg, attached = arg.split("=", 1)  # `--port=8080`, for users coming from other tools
        found = BY_SPELLING.get(arg)
        if found is None:
            raise UsageError(f"invalid argument: {args[i]}")
        opt, positive = found
        i += 1
        if opt.kind in ("value", "list", "two"):
            needed = 2 if opt.kind == "two" else 1
            words = [attached] if attached is not None else []
            while len(words) < needed:
                if i >= len(args):
                    raise UsageError(f'error while handling argument "{arg}": expected value for argument')
                words.append(args[i])
                i += 1
            value: Any = tuple(words) if opt.kind == "two" else _convert(opt, arg, words[0])
        elif attached is not None:
            raise UsageError(f'argument "{arg}" takes no value')
        elif opt.kind == "pair":
            value = positive
        else:
            value = opt.const
        if opt.kind == "action":
            parsed.actions.append(opt.dest)
            continue
        if opt.kind == "list" and opt.dest not in cli_set:
            parsed.values.pop(opt.dest, None)  # the command line replaces the variable's list
        cli_set.add(opt.dest)
        _store(parsed, opt, arg, value)
    return parsed


def pending_features(parsed: Parsed) -> list[tuple[str, str]]:
    """(spelling, feature) for each flag that asks for a feature llamaserve does not have yet."""
    out: list[tuple[str, str]] = []
    for given in parsed.given:
        opt = given.opt
        if not opt.feature:
            continue
        # A switch turned off, or a value that leaves the feature off (`--spec-type none`), asks for nothing.
        if not (given.value is False or given.value in opt.inert):
            out.append((given.source, opt.feature))
    return out


def noop_flags(parsed: Parsed) -> list[tuple[str, str]]:
    """(spelling, why) for each flag given that llama-server itself reads nowhere."""
    return [(g.source, g.opt.noop) for g in parsed.given if g.opt.noop]


def hardware_flags(parsed: Parsed) -> list[str]:
    """The spellings given that act only on a GPU build."""
    return [g.source for g in parsed.given if g.opt.hardware]
