"""Reading a schema before it is converted: local ``$ref`` pointers followed to their target,
and each schema object brought to one canonical form (legacy keywords rewritten, keywords that
cannot be honoured rejected, annotations dropped)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from llamaserve.grammar.common import _err, _ptr, _unsat
from llamaserve.grammar.keywords import _SUPPORTED, _TYPES, _trivial


class LocalRefs:
    """The ``$ref`` targets inside one root schema (``#``, ``#/$defs/..``, its own ``$id``)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.root_id = root.get("$id") if isinstance(root, dict) else None

    def resolve(self, ref: Any, path: str) -> tuple[Any, str]:
        """Follow a local ``$ref``; returns the target and its pointer (used as its path)."""
        if not isinstance(ref, str):
            raise _err(path, "$ref must be a string")
        target_ref = ref
        if isinstance(self.root_id, str) and ref.startswith(self.root_id.split("#")[0] + "#"):
            target_ref = ref[len(self.root_id.split("#")[0]) :]
        if not target_ref.startswith("#"):
            raise _err(path, f"only local references ('#/...') are supported, got {ref!r}")
        fragment = urllib.parse.unquote(target_ref[1:])
        if fragment and not fragment.startswith("/"):
            raise _err(path, f"anchor references are not supported, got {ref!r}")
        node: Any = self.root
        pointer = "#"
        for raw in fragment.split("/")[1:] if fragment else []:
            token = raw.replace("~1", "/").replace("~0", "~")
            pointer = _ptr(pointer, token)
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise _err(path, f"cannot resolve $ref {ref!r}")
        return node, pointer


def normalize_schema(schema: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Keep the keywords that constrain, in one canonical form; reject what cannot be honoured.

    Legacy forms are rewritten (``items: [..]`` -> ``prefixItems``, draft-4 boolean
    ``exclusiveMinimum``) so the rest of the converter sees one dialect.
    """
    out: dict[str, Any] = {}
    for key, value in schema.items():
        kpath = _ptr(path, key)
        if key in _SUPPORTED:
            out[key] = value
        elif key in ("patternProperties",):
            if not isinstance(value, dict) or not all(_trivial(v) for v in value.values()):
                raise _err(kpath, "patternProperties is not supported")
        elif key == "propertyNames":
            if not _trivial(value):
                raise _err(kpath, "propertyNames is not supported")
        elif key in ("dependentRequired", "dependentSchemas", "dependencies"):
            if value not in ({}, None):
                raise _err(kpath, f"{key} is not supported")
        elif key == "if":
            if "then" in schema or "else" in schema:
                raise _err(kpath, "if/then/else is not supported")
        elif key == "not":
            raise _err(kpath, "'not' is not supported")
        elif key == "contains":
            if schema.get("minContains") != 0:
                raise _err(kpath, "contains is not supported")
        elif key in ("$dynamicRef", "$recursiveRef"):
            raise _err(kpath, f"{key} is not supported")
        elif key in ("unevaluatedProperties", "unevaluatedItems"):
            if _trivial(value):
                continue
            if any(k in schema for k in ("allOf", "anyOf", "oneOf", "$ref")):
                raise _err(kpath, f"{key} next to allOf/anyOf/oneOf/$ref is not supported")
            # Without composition, "unevaluated" is exactly "additional"; and when the
            # additional keyword is present it evaluates everything, leaving nothing.
            plain = "additionalProperties" if key == "unevaluatedProperties" else "items"
            if plain not in schema:
                out[plain] = value
        # Everything else (annotations, unknown keywords, then/else without if,
        # minContains/maxContains without contains) does not constrain instances.
    if isinstance(out.get("items"), list):
        if "prefixItems" in out:
            raise _err(_ptr(path, "items"), "items as a list together with prefixItems")
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in schema:
            out["items"] = schema["additionalItems"]
    for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = out.get(excl)
        if isinstance(flag, bool):  # draft 4: a flag on the plain bound
            del out[excl]
            if flag:
                if bound not in out:
                    raise _err(_ptr(path, excl), f"boolean {excl} without {bound}")
                out[excl] = out.pop(bound)
    if "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        for i, t in enumerate(types):
            if t not in _TYPES:
                tpath = _ptr(path, "type", i) if isinstance(out["type"], list) else _ptr(path, "type")
                raise _err(tpath, f"unknown type {t!r}")
        if not types:
            raise _unsat(_ptr(path, "type"), "empty type list matches nothing")
    for key in ("anyOf", "oneOf", "allOf"):
        if key in out and (not isinstance(out[key], list) or not out[key]):
            raise _err(_ptr(path, key), "expected a non-empty array of schemas")
    if "enum" in out and not isinstance(out["enum"], list):
        raise _err(_ptr(path, "enum"), "expected an array")
    return out
