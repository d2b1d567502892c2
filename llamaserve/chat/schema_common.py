"""What every part of the JSON Schema converter shares: its errors, located by a JSON
pointer, and the limits that are not parameters."""

from __future__ import annotations

from typing import Final


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
