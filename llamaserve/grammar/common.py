"""What every part of the JSON Schema converter shares: its errors, located by a JSON
pointer, and the limits that are not parameters."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final


class SchemaError(ValueError):
    """The schema cannot be turned into a grammar; the message starts with ``#/path: ``."""


class _Unsatisfiable(SchemaError):
    """No JSON value satisfies this (sub)schema.

    A separate type because inside ``anyOf`` such an alternative is simply dropped, while at the
    top level it is an error like any other.
    """


# --------------------------------------------------------------------------------------------
# Limits that are not parameters.

# Schema nesting depth. Each level costs a handful of Python frames; 64 levels keeps the converter
# far from the interpreter's recursion limit even when called deep inside a server stack, and no
# real response schema nests that deeply.
_MAX_DEPTH: Final = 64
# Repetition counts up to this are written directly as ``x{m,n}``; llama.cpp expands ``{m,n}`` into
# n-m rules and refuses counts >= 2000, so anything larger is decomposed into base-10 blocks.
_DIRECT_REPEAT: Final = 32


# --------------------------------------------------------------------------------------------
# JSON pointers for error messages.


def _ptr(path: str, *tokens: str | int) -> str:
    """Append JSON-pointer tokens (escaped per RFC 6901) to ``path``."""
    for tok in tokens:
        path += "/" + str(tok).replace("~", "~0").replace("/", "~1")
    return path


def _err(path: str, message: str) -> SchemaError:
    return SchemaError(f"{path}: {message}")


def _unsat(path: str, message: str) -> _Unsatisfiable:
    return _Unsatisfiable(f"{path}: {message}")


# --------------------------------------------------------------------------------------------
# Reading keyword values.


def _decimal(value: Any, path: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(path, "expected a number")
    try:
        d = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:  # pragma: no cover - repr of a float always parses
        raise _err(path, "expected a finite number") from None
    if not d.is_finite():
        raise _err(path, "expected a finite number")
    return d


def _count(schema: Mapping[str, Any], key: str, path: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _err(_ptr(path, key), "expected a non-negative integer")
    return value
