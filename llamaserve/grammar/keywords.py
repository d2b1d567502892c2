"""The JSON Schema keywords the converter knows: which it enforces, which it ignores, how
they group by type, and the conjunction of two subschemas."""

from __future__ import annotations

from typing import Any, Final

_IGNORED: Final = frozenset(
    {
        "title",
        "description",
        "examples",
        "default",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "$dynamicAnchor",
        "$recursiveAnchor",
        "$vocabulary",
        "$defs",
        "definitions",
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
_SUPPORTED: Final = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
    }
)
_TYPES: Final = ("null", "boolean", "object", "array", "string", "number", "integer")
_FAMILIES: Final[dict[str, frozenset[str]]] = {
    "object": frozenset({"properties", "required", "additionalProperties", "minProperties", "maxProperties"}),
    "array": frozenset({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}
_MIN_KEYWORDS: Final = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_MAX_KEYWORDS: Final = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


def _trivial(schema: Any) -> bool:
    """A subschema that accepts everything (true, or only annotations)."""
    return schema is True or (isinstance(schema, dict) and all(k in _IGNORED for k in schema))


def _and(a: Any, b: Any) -> Any:
    """Conjunction of two subschemas, lazily (as allOf) unless one side is trivial."""
    if a is False or b is False:
        return False
    if _trivial(a):
        return b
    if _trivial(b):
        return a
    return {"allOf": [a, b]}
