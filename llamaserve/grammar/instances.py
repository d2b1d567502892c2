"""Whether a JSON value satisfies a schema: how the converter filters enum and const values.

Its keywords follow the converter's reading of a schema (``normalize``, ``$ref``
resolution), which the converter hands in, so both agree on what a schema means.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from llamaserve.grammar.common import _MAX_DEPTH, _count, _decimal, _err, _ptr
from llamaserve.grammar.patterns import _FORMATS

Normalize = Callable[[Mapping[str, Any], str], dict[str, Any]]
Resolve = Callable[[Any, str], tuple[Any, str]]


def json_type_ok(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return name == "number" or isinstance(value, int) or float(value).is_integer()


def json_eq(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0) but booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


class InstanceChecker:
    def __init__(self, normalize: Normalize, resolve: Resolve) -> None:
        self.normalize = normalize
        self.resolve = resolve

    def valid(self, value: Any, schema: Any, path: str, depth: int = 0) -> bool:
        """Whether ``value`` is valid against ``schema``."""
        if depth > _MAX_DEPTH:
            raise _err(path, "schema nesting too deep (size budget exceeded)")
        if schema is True or schema is False:
            return schema
        if not isinstance(schema, dict):
            raise _err(path, "a schema must be an object or a boolean")
        s = self.normalize(schema, path)
        d = depth + 1
        if "$ref" in s:
            target, pointer = self.resolve(s["$ref"], _ptr(path, "$ref"))
            if not self.valid(value, target, pointer, d):
                return False
        if not all(self.valid(value, x, path, d) for x in s.get("allOf", [])):
            return False
        if "anyOf" in s and not any(self.valid(value, x, path, d) for x in s["anyOf"]):
            return False
        if "oneOf" in s and sum(self.valid(value, x, path, d) for x in s["oneOf"]) != 1:
            return False
        if "enum" in s and not any(json_eq(value, e) for e in s["enum"]):
            return False
        if "const" in s and not json_eq(value, s["const"]):
            return False
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            if not any(json_type_ok(value, t) for t in types):
                return False
        if json_type_ok(value, "number"):
            v = _decimal(value, path)
            checks = (
                ("minimum", v.__ge__),
                ("exclusiveMinimum", v.__gt__),
                ("maximum", v.__le__),
                ("exclusiveMaximum", v.__lt__),
            )
            for key, ok in checks:
                if key in s and not ok(_decimal(s[key], _ptr(path, key))):
                    return False
            if "multipleOf" in s and v % _decimal(s["multipleOf"], _ptr(path, "multipleOf")):
                return False
        elif isinstance(value, str):
            lo, hi = _count(s, "minLength", path), _count(s, "maxLength", path)
            if (lo is not None and len(value) < lo) or (hi is not None and len(value) > hi):
                return False
            if "pattern" in s:
                try:
                    if re.search(s["pattern"], value) is None:
                        return False
                except (re.error, TypeError) as exc:
                    raise _err(_ptr(path, "pattern"), f"invalid pattern: {exc}") from None
            fmt = s.get("format")
            # The format regexes are plain enough for Python's re; strip the ^...$ anchors.
            if fmt in _FORMATS and not re.fullmatch(_FORMATS[fmt][1:-1], value):
                return False
        elif isinstance(value, list):
            lo, hi = _count(s, "minItems", path), _count(s, "maxItems", path)
            if (lo is not None and len(value) < lo) or (hi is not None and len(value) > hi):
                return False
            prefix = s.get("prefixItems", [])
            for i, item in enumerate(value):
                sub = prefix[i] if i < len(prefix) else s.get("items", True)
                if not self.valid(item, sub, path, d):
                    return False
            if s.get("uniqueItems") and any(json_eq(x, y) for i, x in enumerate(value) for y in value[i + 1 :]):
                return False
        elif isinstance(value, dict):
            props = s.get("properties", {})
            if any(k not in value for k in s.get("required", [])):
                return False
            lo, hi = _count(s, "minProperties", path), _count(s, "maxProperties", path)
            if (lo is not None and len(value) < lo) or (hi is not None and len(value) > hi):
                return False
            for k, item in value.items():
                sub = props[k] if k in props else s.get("additionalProperties", True)
                if not self.valid(item, sub, path, d):
                    return False
        return True
