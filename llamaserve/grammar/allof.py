"""allOf (and $ref inside it) merged into one keyword group: how the converter reads a
conjunction of schemas before it writes rules."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from llamaserve.grammar.common import _MAX_DEPTH, _decimal, _err, _ptr, _unsat
from llamaserve.grammar.instances import Normalize, Resolve, json_eq
from llamaserve.grammar.keywords import _MAX_KEYWORDS, _MIN_KEYWORDS, _TYPES, _and
from llamaserve.grammar.patterns import _FORMATS


class AllOfMerger:
    """Flattens an allOf tree and merges its keyword groups; anyOf/oneOf parts are distributed."""

    def __init__(self, normalize: Normalize, resolve: Resolve, tick: Callable[[str], None], max_rules: int) -> None:
        self.normalize = normalize
        self.resolve = resolve
        self.tick = tick
        self.max_rules = max_rules

    def flatten(self, schema: Any, path: str, depth: int, out: list[tuple[dict[str, Any], str]]) -> None:
        """Collect the keyword groups of an allOf tree, inlining $refs and nested allOfs."""
        self.tick(path)
        if depth > _MAX_DEPTH:
            raise _err(path, "allOf/$ref nesting too deep (size budget exceeded)")
        if schema is True:
            return
        if schema is False:
            raise _unsat(path, "the schema 'false' matches nothing")
        if not isinstance(schema, dict):
            raise _err(path, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        rest = self.normalize(schema, path)
        subs = rest.pop("allOf", [])
        ref = rest.pop("$ref", None)
        if rest:
            out.append((rest, path))
        if ref is not None:
            target, pointer = self.resolve(ref, _ptr(path, "$ref"))
            self.flatten(target, pointer, depth + 1, out)
        for i, sub in enumerate(subs):
            self.flatten(sub, _ptr(path, "allOf", i), depth + 1, out)

    def merge_all(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        parts: list[tuple[dict[str, Any], str]] = []
        self.flatten(s, path, 0, parts)
        choices: list[list[Any]] = []
        merged: dict[str, Any] = {}
        for part, ppath in parts:
            part = dict(part)
            for key in ("anyOf", "oneOf"):
                if key in part:
                    choices.append(list(part.pop(key)))
            merged = self.merge_two(merged, part, ppath)
        if choices:
            # (A|B) & (C|D) = AC | AD | BC | BD: distribute, within the size budget.
            if math.prod(len(c) for c in choices) > self.max_rules:
                raise _err(path, f"allOf of anyOf/oneOf expands beyond the size budget of {self.max_rules} rules")
            merged["anyOf"] = [
                combo[0] if len(combo) == 1 else {"allOf": list(combo)} for combo in itertools.product(*choices)
            ]
        return merged

    def merge_two(self, a: dict[str, Any], b: dict[str, Any], path: str) -> dict[str, Any]:
        """Conjunction of two normalized keyword groups (no allOf/$ref/anyOf/oneOf in them)."""
        self.tick(path)
        out = dict(a)
        b = dict(b)
        for side in (out, b):
            if "const" in side:
                const = side.pop("const")
                side["enum"] = [v for v in side.get("enum", [const]) if json_eq(v, const)]
        object_keys = ("properties", "additionalProperties")
        if any(k in out for k in object_keys) and any(k in b for k in object_keys):
            self.merge_objects(out, b, path)
        array_keys = ("prefixItems", "items")
        if any(k in out for k in array_keys) and any(k in b for k in array_keys):
            self.merge_arrays(out, b, path)
        for key, value in b.items():
            kpath = _ptr(path, key)
            if key not in out:
                out[key] = value
                continue
            old = out[key]
            if key == "type":
                ta = set(old if isinstance(old, list) else [old])
                tb = set(value if isinstance(value, list) else [value])
                both = ta & tb
                if ("number" in ta and "integer" in tb) or ("integer" in ta and "number" in tb):
                    both.add("integer")
                if not both:
                    raise _unsat(kpath, "allOf requires incompatible types")
                out[key] = [t for t in _TYPES if t in both]
            elif key == "enum":
                out[key] = [v for v in old if any(json_eq(v, w) for w in value)]
            elif key in _MIN_KEYWORDS:
                out[key] = max(old, value, key=lambda v: _decimal(v, kpath))
            elif key in _MAX_KEYWORDS:
                out[key] = min(old, value, key=lambda v: _decimal(v, kpath))
            elif key == "required":
                out[key] = list(dict.fromkeys([*old, *value]))
            elif key == "uniqueItems":
                out[key] = bool(old) or bool(value)
            elif key == "format" and (old not in _FORMATS or value not in _FORMATS):
                out[key] = old if old in _FORMATS else value
            elif key == "properties":
                merged = dict(old)
                for name, sub in value.items():
                    merged[name] = _and(merged[name], sub) if name in merged else sub
                out[key] = merged
            elif not json_eq(old, value):
                raise _err(kpath, f"allOf combines two different {key!r} values, which is not supported")
        return out

    @staticmethod
    def merge_objects(a: dict[str, Any], b: dict[str, Any], path: str) -> None:
        """Merge object keywords of ``b`` into ``a`` (both sides have properties/additional).

        A property declared on one side only must also satisfy the other side's
        additionalProperties; ``false`` there forbids it (kept as a ``false`` property so it is
        never offered as an "additional" name either).
        """
        pa = a.get("properties", {})
        pb = b.pop("properties", {})
        if not isinstance(pa, dict) or not isinstance(pb, dict):
            raise _err(_ptr(path, "properties"), "expected an object")
        add_a = a.get("additionalProperties", True)
        add_b = b.pop("additionalProperties", True)
        merged = {}
        for name in dict.fromkeys([*pa, *pb]):
            merged[name] = _and(pa.get(name, add_a), pb.get(name, add_b))
        a["properties"] = merged
        add = _and(add_a, add_b)
        if add is True:
            a.pop("additionalProperties", None)
        else:
            a["additionalProperties"] = add

    @staticmethod
    def merge_arrays(a: dict[str, Any], b: dict[str, Any], path: str) -> None:
        pa = a.get("prefixItems", [])
        pb = b.pop("prefixItems", [])
        if not isinstance(pa, list) or not isinstance(pb, list):
            raise _err(_ptr(path, "prefixItems"), "expected an array")
        ia = a.get("items", True)
        ib = b.pop("items", True)
        n = max(len(pa), len(pb))
        if n:
            a["prefixItems"] = [_and(pa[i] if i < len(pa) else ia, pb[i] if i < len(pb) else ib) for i in range(n)]
        items = _and(ia, ib)
        if items is True:
            a.pop("items", None)
        else:
            a["items"] = items
