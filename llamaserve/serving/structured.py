"""Structured output: `grammar`, `json_schema` and OpenAI `response_format` → one GBNF grammar.

Conversion and llama.cpp's own parse run off the event loop with a time and
size bound; anything that cannot be honoured is a 400 naming the part, never
an unconstrained answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from llamaserve.config import ConfigError
from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.sampling import GrammarError
from llamaserve.errors import APIError
from llamaserve.grammar.json_schema import SchemaError, json_grammar, schema_to_grammar

MAX_GRAMMAR_CHARS = 1_000_000


def _schema_from_response_format(fmt: dict[str, Any]) -> tuple[bool, Any]:
    """(constrained?, schema or None for any JSON object) from an OpenAI response_format."""
    kind = fmt.get("type")
    if kind in (None, "text"):
        return False, None
    if kind == "json_object":
        # llama-server also accepts an inline "schema" here.
        return True, fmt.get("schema")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise APIError("response_format.json_schema.schema is required")
        return True, spec["schema"]
    raise APIError(f"response_format.type: unsupported value '{kind}' (use text, json_object or json_schema)")


def _convert(schema: Any, where: str) -> str:
    if schema is None:
        return json_grammar()
    if not isinstance(schema, (dict, bool)):
        raise APIError(f"{where}: a JSON schema must be an object")
    try:
        return schema_to_grammar(schema)
    except SchemaError as exc:
        raise APIError(f"{where}: {exc}") from None


async def resolve_grammar(
    model: Vocabulary,
    *,
    grammar: str | None = None,
    json_schema: Any = None,
    response_format: dict[str, Any] | None = None,
) -> str | None:
    """The grammar a request asks for, checked by llama.cpp; None when unconstrained."""
    constrained_rf, rf_schema = _schema_from_response_format(response_format) if response_format else (False, None)
    asked = [
        name
        for name, on in (
            ("grammar", grammar is not None),
            ("json_schema", json_schema is not None),
            ("response_format", constrained_rf),
        )
        if on
    ]
    if len(asked) > 1:
        raise APIError(
            f"only one of grammar, json_schema and response_format may constrain output (got {', '.join(asked)})"
        )
    if not asked:
        return None
    if grammar is not None:
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise APIError(f"grammar: longer than {MAX_GRAMMAR_CHARS} characters")
        text = grammar
    elif json_schema is not None:
        text = await asyncio.to_thread(_convert, json_schema, "json_schema")
    else:
        text = await asyncio.to_thread(_convert, rf_schema, "response_format")
    try:
        await asyncio.to_thread(model.check_grammar, text)
    except GrammarError:
        raise APIError(
            "Failed to parse grammar"
            if grammar is not None
            else "the grammar built from the JSON schema was rejected by llama.cpp"
        ) from None
    return text


def server_default_grammar(model: Vocabulary, grammar: str | None, json_schema: str | None) -> str | None:
    """--grammar/--grammar-file or -j/--json-schema-file as the grammar of requests that bring none.

    Converted and checked once at startup, so a bad one stops the server instead of failing
    every request. A request's own grammar, json_schema, response_format or tool-call grammar
    replaces it, as in llama-server.
    """
    if grammar is not None and json_schema is not None:
        raise ConfigError("give one of --grammar/--grammar-file and -j/--json-schema/--json-schema-file")
    text = grammar
    if json_schema is not None:
        try:
            schema = json.loads(json_schema)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--json-schema is not JSON: {exc}") from None
        if isinstance(schema, dict) and not schema:
            schema = {"type": "object"}  # an empty schema means any object, as in llama-server
        if not isinstance(schema, (dict, bool)):
            raise ConfigError("--json-schema must be a JSON object")
        try:
            text = schema_to_grammar(schema)
        except SchemaError as exc:
            raise ConfigError(f"--json-schema: {exc}") from None
    if not text:
        return None
    try:
        model.check_grammar(text)
    except GrammarError:
        raise ConfigError("--grammar: llama.cpp could not parse the grammar") from None
    return text
