"""Convert a JSON Schema into a llama.cpp GBNF grammar that only admits valid instances.

This is how ``response_format: {"type": "json_schema", ...}`` / ``json_schema`` become a grammar
for the sampler. It is written from scratch for llamaserve (it shares no code with llama.cpp's
converter); what it shares is the target: GBNF text that ``llama_sampler_init_grammar`` accepts.

The guiding rule: **never produce a grammar that lets the model write something the schema
rejects**. A grammar may be *stricter* than the schema (it may admit only a subset of the valid
documents -- e.g. no ``\\u`` escapes in property names, at most 16 integer digits), because every
output is then still valid; but a constraint the converter cannot express is a
:class:`SchemaError`, never silently dropped.

Public API
----------
- :func:`schema_to_grammar` -- schema (dict or bool) -> GBNF text with a ``root`` rule.
- :class:`SchemaError` -- a ``ValueError`` whose message starts with a JSON-pointer-like path to the
  offending part, e.g. ``#/properties/age/minimum: ...``.
- :data:`JSON_OBJECT_GRAMMAR` / :func:`json_grammar` -- any JSON object, for
  ``response_format: {"type": "json_object"}``.

What is enforced
----------------
- ``type`` (string or list), inferred from keywords when absent (``properties`` -> object, ...;
  no typed keyword at all -> any JSON value). ``{}`` / ``true`` -> any JSON value.
- ``enum`` / ``const`` (values are also checked against the sibling keywords and dropped if they
  fail them; an empty result is an error).
- objects: ``properties`` in declared order, ``required`` vs optional (each optional property may be
  omitted; the construction is linear in the number of properties), ``additionalProperties``
  (``false`` / ``true`` / schema). Absent ``additionalProperties`` next to ``properties`` offers
  no extra properties, as llama.cpp's converter does (JSON Schema would allow them; chosen on
  purpose: models offered free keys invent them until max_tokens). An object schema without
  ``properties`` takes any members. Extra property names can never be a declared name (so an
  omitted optional property cannot reappear with a wrong type) and are written without
  backslash escapes. With ``maxProperties`` set and ``additionalProperties`` absent, extra
  properties are not offered either.
  ``minProperties`` / ``maxProperties`` only when implied by ``required`` / the closed property
  set, plus ``minProperties: 1`` (the member list is then non-empty).
- arrays: ``items``, ``prefixItems`` (and the old list form of ``items`` + ``additionalItems``),
  ``minItems`` / ``maxItems`` (any size: large counts are written as base-10 blocks so the grammar
  stays small and within llama.cpp's 2000-repetition limit). ``uniqueItems: true`` only when
  ``maxItems <= 1``.
- strings: ``minLength`` / ``maxLength`` (counted in code points), ``pattern`` (ECMA-262 subset:
  literals, classes, ``.``, ``\\d \\w \\s`` and their negations -- narrowed to what ECMA-262,
  Python ``re`` and Rust ``regex`` all agree on, e.g. ``\\W`` = ASCII non-word characters, since
  validators run one of those --, groups incl. ``(?:`` and named ones, alternation,
  ``? * + {m} {m,} {m,n}`` (lazy too), ``^`` / ``$`` at the ends of top-level branches; an
  unanchored side accepts any text there, as JSON Schema requires). A pattern together with
  ``minLength``/``maxLength`` is combined by narrowing the pattern's repetitions until every
  match has an allowed length (e.g. ``^[a-z]+@[a-z]+$`` with ``maxLength: 9`` shares the spare
  length between the two ``+``): exact for a single variable part, a valid subset otherwise.
- ``format``: ``date``, ``time``, ``date-time`` (RFC 3339, real calendar incl. leap years),
  ``uuid``, ``email`` (a practical dot-atom subset), ``ipv4``, combined with length limits like a
  pattern (a known format next to a ``pattern`` is an error: they cannot be intersected). Other
  formats are annotations in JSON Schema 2020-12 and are ignored.
- integers: ``minimum`` / ``maximum`` / ``exclusiveMinimum`` / ``exclusiveMaximum`` (also the
  draft-4 boolean form) exactly, for any bounds. Numbers: the same bounds exactly, including
  fractional bounds; bounded numbers are written without exponent and with at most 15
  significant digits, so the comparison also holds after a consumer parses them as doubles.
  ``multipleOf: 1`` = integer.
- ``anyOf`` / ``oneOf`` as alternatives (oneOf's "exactly one" is *not* enforced -- the same choice
  llama.cpp and other constrained decoders make), with sibling keywords distributed into each
  alternative; ``allOf`` by merging (properties, bounds, items, ... ; an unmergeable combination,
  e.g. two different patterns, is an error).
- ``$ref`` to any local JSON pointer (``#``, ``#/$defs/..``, ``#/definitions/..``, ...), recursive
  references included (named rules). A reference cycle that consumes no input (left recursion) is
  an error, as llama.cpp would reject the grammar.

Rejected (SchemaError): unknown ``type`` names, ``false`` schemas, unsatisfiable combinations,
``not``, ``if``+``then``/``else``, ``patternProperties`` / ``propertyNames`` with real constraints,
``dependentRequired`` / ``dependentSchemas`` / ``dependencies``, ``contains``, ``uniqueItems: true``
(unless ``maxItems <= 1``), ``multipleOf`` other than 1, ``unevaluated*`` next to composition,
``$dynamicRef`` / ``$recursiveRef``, non-local or unresolvable ``$ref``, regex features outside the
subset (lookarounds, backreferences, ``\\b``, ``\\p{..}``, ...), and schemas that exceed the size
budget (``max_rules`` llama.cpp rules after expansion, ``max_grammar_bytes``, nesting depth) or the
time budget (``deadline_s``).

Ignored (purely descriptive): ``title``, ``description``, ``examples``, ``default``, ``$schema``,
``$id``, ``$anchor``, ``$comment``, ``$defs``/``definitions`` (used only as ``$ref`` targets),
``deprecated``, ``readOnly``, ``writeOnly``, ``content*``, unknown formats, ``then``/``else``
without ``if``, ``if`` without ``then``/``else``, and any keyword JSON Schema does not define
(e.g. OpenAPI's ``nullable``) -- unknown keywords are annotations per the specification.

Whitespace: one optional whitespace slot after every token, ``| " " | "\\n"{1,2} [ \\t]{0,20}``
(llama.cpp's rule), so the model may pretty-print but can never loop on whitespace.

The converter (the ``_Converter`` walk over the schema and the public API) is here; its parts
are ``gbnf_rules`` (rule names, the size and time budget, repetition counts), ``schema_read``
(local ``$ref`` targets, each schema object in one canonical form),
``schema_common`` (errors, limits, reading keyword values), ``schema_keywords`` (which keywords
are enforced or ignored), ``schema_allof`` (merging allOf), ``schema_instances`` (whether a value
satisfies a schema, for enum/const), ``gbnf_text`` (GBNF text and the shared JSON rules),
``schema_regex`` (``pattern`` and ``format``) and ``schema_numbers`` (numeric ranges). Together
they import nothing else from llamaserve and nothing outside the standard library.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, Final

from llamaserve.chat.gbnf_rules import RuleBook
from llamaserve.chat.gbnf_text import (
    _JSON_SPECIAL,
    _class_expr,
    _gbnf_literal,
    _group,
    _iv,
    _iv_complement,
    _iv_intersect,
    _json_char_expr,
    _json_text_literal,
    _json_value_gbnf,
    _seq,
)
from llamaserve.chat.schema_allof import AllOfMerger
from llamaserve.chat.schema_common import (
    _MAX_DEPTH,
    SchemaError,
    _count,
    _decimal,
    _err,
    _ptr,
    _unsat,
    _Unsatisfiable,
)
from llamaserve.chat.schema_instances import InstanceChecker, json_eq
from llamaserve.chat.schema_keywords import _FAMILIES
from llamaserve.chat.schema_numbers import _SIGNIFICANT_DIGITS, _int_range_alts, _number_range_alts
from llamaserve.chat.schema_read import LocalRefs, normalize_schema
from llamaserve.chat.schema_regex import (
    _FORMATS,
    _RAlt,
    _re_branches,
    _re_fit_length,
    _re_len,
    _re_nonempty,
    _re_nullable,
    _RegexParser,
    _RNode,
    _RRep,
    _RSeq,
    _RSet,
)

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "SchemaError",
    "json_grammar",
    "schema_to_grammar",
]
# --------------------------------------------------------------------------------------------
# The converter.


class _Converter(RuleBook):
    """One schema's walk: each part of the schema becomes a rule of the grammar."""

    def __init__(self, root: Any, *, max_rules: int, max_grammar_bytes: int, deadline_s: float) -> None:
        super().__init__(max_rules=max_rules, max_grammar_bytes=max_grammar_bytes, deadline_s=deadline_s)
        self.root = root
        self.depth = 0
        self.ref_rules: dict[str, str] = {}
        # $refs entered since the last consumed token: meeting one again is left recursion.
        self.no_progress: set[str] = set()
        self.refs = LocalRefs(root)
        self.instances = InstanceChecker(normalize_schema, self.refs.resolve)  # filters enum/const values
        self.allof = AllOfMerger(normalize_schema, self.refs.resolve, self.tick, max_rules)

    @contextmanager
    def progress(self) -> Iterator[None]:
        """Children of an object/array come after a consumed ``{``/``[``: not left-recursive."""
        saved = self.no_progress
        self.no_progress = set()
        try:
            yield
        finally:
            self.no_progress = saved

    # ---- visiting --------------------------------------------------------------------------

    def convert(self) -> str:
        self.rules["root"] = ""
        self.ref_rules["#"] = "root"
        self.no_progress.add("#")
        self.define("root", self.body(self.root, "#", "root"), "#")
        lines = [f"root ::= {self.rules['root']}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items() if name != "root"]
        return "\n".join(lines) + "\n"

    def visit(self, schema: Any, path: str, hint: str) -> str:
        """A single GBNF symbol for JSON values valid against ``schema`` (trailing ws included)."""
        return self.rule(hint, self.body(schema, path, hint), path)

    def body(self, schema: Any, path: str, hint: str) -> str:
        self.tick(path)
        self.depth += 1
        try:
            if self.depth > _MAX_DEPTH:
                raise _err(path, f"schema nesting deeper than {_MAX_DEPTH} levels exceeds the size budget")
            return self.body_inner(schema, path, hint)
        finally:
            self.depth -= 1

    def body_inner(self, schema: Any, path: str, hint: str) -> str:
        if schema is True:
            return self.builtin("value")
        if schema is False:
            raise _unsat(path, "the schema 'false' matches nothing")
        if not isinstance(schema, dict):
            raise _err(path, f"a schema must be an object or a boolean, not {type(schema).__name__}")
        s = normalize_schema(schema, path)
        if "$ref" in s:
            if len(s) == 1:
                return self.ref(s["$ref"], _ptr(path, "$ref"))
            # Since 2019-09, keywords next to $ref apply too: it is an allOf of both.
            s = {"allOf": [{"$ref": s.pop("$ref")}, s]}
        if "allOf" in s:
            s = self.allof.merge_all(s, path)
        if "anyOf" in s or "oneOf" in s:
            return self.alternatives(s, path, hint)
        if "enum" in s or "const" in s:
            return self.enum(s, path)
        types = self.types(s, path)
        if types is None:
            return self.builtin("value")
        bodies = [self.typed(t, s, path, hint if len(types) == 1 else f"{hint}-{t}") for t in types]
        if len(bodies) == 1:
            return bodies[0]
        named = (self.rule(f"{hint}-{t}", b, path) for t, b in zip(types, bodies, strict=True))
        return " | ".join(named)

    def ref(self, ref: Any, path: str) -> str:
        target, pointer = self.refs.resolve(ref, path)
        if pointer in self.no_progress:
            raise _err(path, f"$ref {ref!r} refers back to itself without consuming input (left recursion)")
        if pointer in self.ref_rules:
            return self.ref_rules[pointer]
        name = self.fresh("ref-" + pointer.rsplit("/", 1)[-1])
        self.ref_rules[pointer] = name
        self.no_progress.add(pointer)
        try:
            self.define(name, self.body(target, pointer, name), pointer)
        finally:
            self.no_progress.discard(pointer)
        return name

    def types(self, s: Mapping[str, Any], path: str) -> list[str] | None:
        """The JSON types to generate, or None for "any value, unconstrained".

        Without ``type``, the types whose keywords appear are generated: a subset of what the
        schema allows (it allows every other type too), so every output stays valid.
        """
        if "type" in s:
            raw = s["type"] if isinstance(s["type"], list) else [s["type"]]
            types = list(dict.fromkeys(raw))
        else:
            fmt = s.get("format")
            types = [fam for fam, kws in _FAMILIES.items() if any(k in s for k in kws)]
            if fmt in _FORMATS and "string" not in types:
                types.append("string")
            if not types:
                return None
        if "number" in types and "integer" in types:
            types.remove("integer")
        mult = s.get("multipleOf")
        if mult is not None and any(t in ("number", "integer") for t in types):
            m = _decimal(mult, _ptr(path, "multipleOf"))
            if m <= 0:
                raise _err(_ptr(path, "multipleOf"), "must be greater than 0")
            if m != 1:
                raise _err(_ptr(path, "multipleOf"), "only multipleOf 1 is supported")
            types = ["integer" if t == "number" else t for t in types]
        return types

    def typed(self, t: str, s: Mapping[str, Any], path: str, hint: str) -> str:
        if t in ("null", "boolean"):
            return self.builtin(t)
        if t == "string":
            return self.string(s, path, hint)
        if t == "integer":
            return self.integer(s, path)
        if t == "number":
            return self.number(s, path)
        if t == "object":
            return self.object(s, path, hint)
        return self.array(s, path, hint)

    # ---- composition ----------------------------------------------------------------------

    def alternatives(self, s: dict[str, Any], path: str, hint: str) -> str:
        base = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf")}
        options: list[tuple[Any, str]] = []
        if "anyOf" in s and "oneOf" in s:
            options = [
                ({"allOf": [x, y]}, _ptr(path, "anyOf", i)) for i, x in enumerate(s["anyOf"]) for y in s["oneOf"]
            ]
        else:
            key = "anyOf" if "anyOf" in s else "oneOf"
            options = [(x, _ptr(path, key, i)) for i, x in enumerate(s[key])]
        symbols: list[str] = []
        first_error: _Unsatisfiable | None = None
        for i, (option, opath) in enumerate(options):
            sub = {"allOf": [base, option]} if base else option
            try:
                symbols.append(self.visit(sub, opath, f"{hint}-{i}"))
            except _Unsatisfiable as exc:  # an impossible branch just contributes nothing
                first_error = first_error or exc
        if not symbols:
            assert first_error is not None
            raise first_error
        return " | ".join(dict.fromkeys(symbols))

    # ---- enum / const ----------------------------------------------------------------------

    def enum(self, s: dict[str, Any], path: str) -> str:
        values: list[Any] = list(s["enum"]) if "enum" in s else [s["const"]]
        if "enum" in s and "const" in s:
            values = [v for v in values if json_eq(v, s["const"])]
        rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
        literals: dict[str, None] = {}
        size = 0
        ws = self.builtin("ws")
        for i, value in enumerate(values):
            if i % 64 == 0:
                self.tick(path)
            if rest and not self.instances.valid(value, rest, path):
                continue
            try:
                lit = _json_value_gbnf(value, ws)
            except (TypeError, ValueError) as exc:
                raise _err(path, f"enum/const value is not JSON: {exc}") from None
            if lit not in literals:
                literals[lit] = None
                size += len(lit) + 3
                if size > self.max_bytes:
                    raise _err(path, f"grammar exceeds the size budget of {self.max_bytes} bytes")
        if not literals:
            raise _unsat(path, "no enum/const value satisfies the schema")
        alts = list(literals)
        return f"{alts[0]} {ws}" if len(alts) == 1 else f"({' | '.join(alts)}) {ws}"

    # ---- strings ---------------------------------------------------------------------------

    def string(self, s: Mapping[str, Any], path: str, hint: str) -> str:
        min_len = _count(s, "minLength", path) or 0
        max_len = _count(s, "maxLength", path)
        if max_len is not None and max_len < min_len:
            raise _unsat(path, "maxLength is smaller than minLength")
        pattern = s.get("pattern")
        fmt = s.get("format")
        ws = self.builtin("ws")
        branches: list[_RNode] | None = None
        if pattern is not None and fmt in _FORMATS:
            # Two regular languages cannot be intersected in a grammar this simple; rather than
            # drop the format (which format-asserting validators check), refuse.
            raise _err(_ptr(path, "format"), f"format {fmt!r} together with a pattern is not supported")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise _err(_ptr(path, "pattern"), "expected a string")
            ppath = _ptr(path, "pattern")
            node = _RegexParser(pattern, ppath).parse()
            branches = self.fit_branches(_re_branches(node, ppath), min_len, max_len, ppath)
        elif fmt in _FORMATS:
            fpath = _ptr(path, "format")
            node = _RegexParser(_FORMATS[fmt], fpath).parse()
            branches = self.fit_branches(_re_branches(node, fpath), min_len, max_len, fpath)
        if branches is None:
            if min_len == 0 and max_len is None:
                return self.builtin("string")
            content = self.repeat(self.builtin("char"), min_len, max_len, path)
        else:
            exprs = [self.regex(b, f"{hint}-re", path) for b in branches]
            content = exprs[0] if len(exprs) == 1 else "(" + " | ".join(exprs) + ")"
        return _seq(r'"\""', content, r'"\""', ws)

    @staticmethod
    def fit_branches(branches: list[_RNode], min_len: int, max_len: int | None, path: str) -> list[_RNode]:
        if min_len == 0 and max_len is None:
            return branches
        fitted = [b for b in (_re_fit_length(x, min_len, max_len) for x in branches) if b is not None]
        if fitted:
            return fitted
        if all(
            _re_len(b)[0] > (max_len if max_len is not None else math.inf) or (_re_len(b)[1] or math.inf) < min_len
            for b in branches
        ):
            raise _unsat(path, "no string matches both the pattern and the length limits")
        raise _err(path, "cannot combine this pattern with minLength/maxLength")

    def regex(self, node: _RNode, hint: str, path: str) -> str:
        """GBNF for the JSON-encoded text of the strings ``node`` matches."""
        self.tick(path)
        if isinstance(node, _RSet):
            if len(node.chars) == 1 and node.chars[0][0] == node.chars[0][1]:
                return _json_text_literal(chr(node.chars[0][0]))
            expr = _json_char_expr(node.chars)
            if expr is None:
                raise _unsat(path, "character class matches nothing")
            return expr
        if isinstance(node, _RSeq):
            parts: list[str] = []
            text = ""
            for child in node.items:
                if isinstance(child, _RSet) and len(child.chars) == 1 and (child.chars[0][0] == child.chars[0][1]):
                    text += chr(child.chars[0][0])  # runs of literal characters: one literal
                    continue
                if text:
                    parts.append(_json_text_literal(text))
                    text = ""
                parts.append(_group(self.regex(child, hint, path)))
            if text:
                parts.append(_json_text_literal(text))
            return _seq(*parts) or '""'
        if isinstance(node, _RAlt):
            return "(" + " | ".join(self.regex(o, hint, path) for o in node.options) + ")"
        if isinstance(node, _RRep):
            item: _RNode | None = node.item
            lo, hi = node.lo, node.hi
            if _re_nullable(node.item):
                # X{m,n} == X'{0,n} for the non-empty part X' (pad with empty words).
                item, lo = _re_nonempty(node.item), 0
            if item is None or hi == 0:
                return '""'
            sym = self.symbol(self.regex(item, hint, path), hint, path)
            return self.repeat(sym, lo, hi, path) or '""'
        return '""'  # pragma: no cover - anchors are removed before conversion

    # ---- numbers ---------------------------------------------------------------------------

    def integer(self, s: Mapping[str, Any], path: str) -> str:
        lo: int | None = None
        hi: int | None = None
        if "minimum" in s:
            lo = math.ceil(_decimal(s["minimum"], _ptr(path, "minimum")))
        if "exclusiveMinimum" in s:
            v = math.floor(_decimal(s["exclusiveMinimum"], _ptr(path, "exclusiveMinimum"))) + 1
            lo = v if lo is None else max(lo, v)
        if "maximum" in s:
            hi = math.floor(_decimal(s["maximum"], _ptr(path, "maximum")))
        if "exclusiveMaximum" in s:
            v = math.ceil(_decimal(s["exclusiveMaximum"], _ptr(path, "exclusiveMaximum"))) - 1
            hi = v if hi is None else min(hi, v)
        if lo is None and hi is None:
            return self.builtin("integer")
        if lo is not None and hi is not None and lo > hi:
            raise _unsat(path, "no integer lies within the bounds")
        alts = _int_range_alts(lo, hi)
        return f"({' | '.join(alts)}) {self.builtin('ws')}"

    def number(self, s: Mapping[str, Any], path: str) -> str:
        lo: Decimal | None = None
        lo_excl = False
        hi: Decimal | None = None
        hi_excl = False
        for key, excl in (("minimum", False), ("exclusiveMinimum", True)):
            if key in s:
                v = _decimal(s[key], _ptr(path, key))
                if lo is None or v > lo or (v == lo and excl):
                    lo, lo_excl = v, excl
        for key, excl in (("maximum", False), ("exclusiveMaximum", True)):
            if key in s:
                v = _decimal(s[key], _ptr(path, key))
                if hi is None or v < hi or (v == hi and excl):
                    hi, hi_excl = v, excl
        if lo is None and hi is None:
            return self.builtin("number")
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
            raise _unsat(path, "no number lies within the bounds")
        alts = _number_range_alts(lo, lo_excl, hi, hi_excl)
        if not alts:
            raise _err(
                path,
                f"no number within the bounds can be written with at most {_SIGNIFICANT_DIGITS} significant digits",
            )
        return f"({' | '.join(alts)}) {self.builtin('ws')}"

    # ---- objects ---------------------------------------------------------------------------

    def object(self, s: Mapping[str, Any], path: str, hint: str) -> str:
        props = s.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(k, str) for k in props):
            raise _err(_ptr(path, "properties"), "expected an object with string keys")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise _err(_ptr(path, "required"), "expected an array of strings")
        required_set = set(required)
        explicit_extra = "additionalProperties" in s
        extra: Any = s.get("additionalProperties", True)
        entries: list[tuple[str, Any, str]] = [(k, v, _ptr(path, "properties", k)) for k, v in props.items()]
        for k in dict.fromkeys(required):
            if k not in props:  # required but only allowed through additionalProperties
                if not explicit_extra:
                    entries.append((k, True, _ptr(path, "required")))  # any value, as JSON Schema says
                    continue
                if extra is False:
                    raise _unsat(
                        _ptr(path, "required"), f"required property {k!r} is forbidden by additionalProperties"
                    )
                entries.append((k, extra, _ptr(path, "additionalProperties")))
        for k, v, kpath in entries:
            if v is False and k in required_set:
                raise _unsat(kpath, f"required property {k!r} can have no valid value")
        declared = [k for k, _, _ in entries]
        live = [(k, v, p) for k, v, p in entries if v is not False]
        n_required = sum(1 for k, _, _ in live if k in required_set)
        min_props = _count(s, "minProperties", path)
        max_props = _count(s, "maxProperties", path)
        if not explicit_extra and props:
            # Declared properties and no word on others: only the declared ones are offered, as
            # llama.cpp's converter does. JSON Schema would allow any extra key; a model offered
            # that freedom invents keys until max_tokens (seen with SmolLM2 on instructor's
            # typical Person schema), so `additionalProperties: true` or a schema asks for it.
            extra = False
        if max_props is not None and not explicit_extra:
            extra = False  # implicit extras cannot be counted: offer none (stricter, still valid)
        if min_props is not None and min_props > max(n_required, 1):
            raise _err(
                _ptr(path, "minProperties"), "minProperties above the number of required properties is not supported"
            )
        # minProperties 1 without required properties: the member list must not be empty.
        non_empty = min_props is not None and min_props >= 1
        if max_props is not None:
            if max_props < n_required:
                raise _unsat(_ptr(path, "maxProperties"), "fewer than the required properties")
            if extra is not False or len(live) > max_props:
                raise _err(
                    _ptr(path, "maxProperties"),
                    "maxProperties below the number of possible properties is not supported",
                )
        ws = self.builtin("ws")
        kvs: list[tuple[str, bool]] = []
        with self.progress():
            for k, v, kpath in live:
                value = self.visit(v, kpath, f"{hint}-{k}")
                key_lit = _gbnf_literal(json.dumps(k, ensure_ascii=False))
                kv = self.rule(f"{hint}-{k}-kv", f'{key_lit} {ws} ":" {ws} {value}', kpath)
                kvs.append((kv, k in required_set))
            extra_kv = extra_next = None
            if extra is not False:
                epath = _ptr(path, "additionalProperties")
                key = self.not_keys(declared, f"{hint}-key", epath)
                value = self.visit(extra, epath, f"{hint}-additional")
                extra_kv = self.rule(f"{hint}-additional-kv", f'{key} ":" {ws} {value}', epath)
                extra_next = self.rule(f"{hint}-additional-next", f'"," {ws} {extra_kv}', epath)
        extra_tail = f"{extra_next}*" if extra_next else ""

        def item(i: int) -> str:
            kv, req = kvs[i]
            return f'"," {ws} {kv}' if req else f'("," {ws} {kv})?'

        # The first member written has no comma. With optional members, "the first one written"
        # can be any of them up to (and including) the first required one: one alternative each,
        # followed by a shared tail rule for the rest -- linear in the number of properties.
        n = len(kvs)
        first_req = next((i for i, (_, req) in enumerate(kvs) if req), None)
        last_head = n - 1 if first_req is None else first_req
        heads: list[str] = []
        if n:
            tails: dict[int, str] = {}
            tail = _seq(*(item(i) for i in range(last_head + 1, n)), extra_tail)
            # Referenced twice (by the last head and the previous tail) only if last_head > 0.
            tails[last_head + 1] = self.rule(f"{hint}-tail", tail, path) if (tail and last_head > 0) else tail
            for i in range(last_head, 0, -1):
                tails[i] = self.rule(f"{hint}-tail", _seq(item(i), tails[i + 1]), path)
            heads = [_seq(kvs[j][0], tails[j + 1]) for j in range(last_head + 1)]
        if first_req is None and extra_kv:
            heads.append(_seq(extra_kv, extra_tail))
        if not heads:
            if non_empty:
                raise _unsat(_ptr(path, "minProperties"), "no property is allowed")
            return f'"{{" {ws} "}}" {ws}'
        head = heads[0] if len(heads) == 1 else self.rule(f"{hint}-members", " | ".join(heads), path)
        if first_req is None and not non_empty:
            head = f"({head})?" if " " in head else f"{head}?"
        return f'"{{" {ws} {head} "}}" {ws}'

    def not_keys(self, names: Sequence[str], hint: str, path: str) -> str:
        """A JSON string (with ws) that is none of ``names``, written without escapes.

        A trie over the names: at each node the next character may leave the trie (then anything
        may follow), follow an edge, or end the string unless the node spells a declared name.
        """
        if not names:
            return self.builtin("string")
        rest = self.builtin("key-rest")
        ws = self.builtin("ws")
        trie: dict[str, Any] = {}
        for name in names:
            if any(c in '"\\' or ord(c) < 0x20 for c in name):
                continue  # cannot be spelled with raw characters anyway
            node = trie
            for c in name:
                node = node.setdefault(c, {})
            node[""] = {}  # end marker

        def build(node: dict[str, Any]) -> str:
            self.tick(path)
            children = sorted(c for c in node if c)
            leave = _iv_intersect(
                _iv_complement(_iv([(ord(c), ord(c)) for c in children])),
                _iv_complement(_JSON_SPECIAL),
            )
            alts = [f"{_class_expr(leave)} {rest}"] if leave else []
            alts += [f"{_gbnf_literal(c)} {build(node[c])}" for c in children]
            if "" not in node:
                alts.append(f'"\\"" {ws}')
            return self.rule(hint, " | ".join(alts), path)

        return self.rule(hint, f'"\\"" {build(trie)}', path)

    # ---- arrays ----------------------------------------------------------------------------

    def array(self, s: Mapping[str, Any], path: str, hint: str) -> str:
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise _err(_ptr(path, "prefixItems"), "expected an array")
        items: Any = s.get("items", True)
        min_items = _count(s, "minItems", path) or 0
        max_items = _count(s, "maxItems", path)
        for i, p in enumerate(prefix):
            if p is False:  # no valid value at position i: the array ends before it
                prefix = prefix[:i]
                max_items = i if max_items is None else min(max_items, i)
                break
        k = len(prefix)
        if items is False:
            max_items = k if max_items is None else min(max_items, k)
        if max_items is not None and min_items > max_items:
            raise _unsat(path, "no array length satisfies the item count limits")
        if s.get("uniqueItems") is True and (max_items is None or max_items > 1):
            raise _err(_ptr(path, "uniqueItems"), "uniqueItems is not supported")
        ws = self.builtin("ws")
        if max_items == 0:
            return f'"[" {ws} "]" {ws}'
        with self.progress():
            syms = [self.visit(p, _ptr(path, "prefixItems", i), f"{hint}-{i}") for i, p in enumerate(prefix)]
            item_sym = None
            if max_items is None or max_items > k:
                item_sym = self.visit(items, _ptr(path, "items"), f"{hint}-item")

        def following(i: int) -> str:
            """Elements from index i on (i elements already written), each after a comma."""
            if max_items is not None and i >= max_items:
                return ""
            if i >= k:
                if item_sym is None:
                    return ""
                nxt = self.rule(f"{hint}-next", f'"," {ws} {item_sym}', path)
                hi = None if max_items is None else max_items - i
                return self.repeat(nxt, max(0, min_items - i), hi, path)
            inner = _seq(f'"," {ws}', syms[i], following(i + 1))
            return inner if i < min_items else f"({inner})?"

        if k:
            content = _seq(syms[0], following(1))
        else:
            assert item_sym is not None
            content = _seq(item_sym, following(1))
        if min_items == 0:
            content = f"({content})?" if " " in content else f"{content}?"
        return f'"[" {ws} {content} "]" {ws}'


def schema_to_grammar(
    schema: dict[str, Any] | bool,
    *,
    max_rules: int = 5000,
    max_grammar_bytes: int = 1_000_000,
    deadline_s: float = 2.0,
) -> str:
    """Convert ``schema`` to GBNF text whose ``root`` rule matches exactly-valid JSON (a subset).

    ``max_rules`` bounds the rules llama.cpp will build (after expanding repetitions),
    ``max_grammar_bytes`` the text size and ``deadline_s`` the conversion time; exceeding any of
    them raises :class:`SchemaError` saying so.
    """
    converter = _Converter(schema, max_rules=max_rules, max_grammar_bytes=max_grammar_bytes, deadline_s=deadline_s)
    try:
        return converter.convert()
    except RecursionError:
        raise SchemaError("#: schema is nested too deeply (size budget exceeded)") from None


def json_grammar() -> str:
    """GBNF for any JSON object (``response_format: {"type": "json_object"}``)."""
    return JSON_OBJECT_GRAMMAR


JSON_OBJECT_GRAMMAR: Final[str] = schema_to_grammar({"type": "object"})
