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

The converter (the ``_Converter`` walk over the schema, composition, enum/const and the public
API) is here. Its parts: ``scalars`` (strings, integers, numbers), ``containers``
(objects, arrays), ``rulebook`` (rule names, the size and time budget, repetition counts),
``canonical`` (local ``$ref`` targets, each schema object in one canonical form),
``common`` (errors, limits, reading keyword values), ``keywords`` (which keywords
are enforced or ignored), ``allof`` (merging allOf), ``instances`` (whether a value
satisfies a schema, for enum/const), ``gbnf`` (GBNF text and the shared JSON rules),
``patterns`` (``pattern`` and ``format``) and ``ranges`` (numeric ranges). Together
they import nothing else from llamaserve and nothing outside the standard library.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from llamaserve.grammar.allof import AllOfMerger
from llamaserve.grammar.canonical import LocalRefs, normalize_schema
from llamaserve.grammar.common import _MAX_DEPTH, SchemaError, _decimal, _err, _ptr, _unsat, _Unsatisfiable
from llamaserve.grammar.containers import ContainerRules
from llamaserve.grammar.gbnf import _json_value_gbnf
from llamaserve.grammar.instances import InstanceChecker, json_eq
from llamaserve.grammar.keywords import _FAMILIES
from llamaserve.grammar.patterns import _FORMATS
from llamaserve.grammar.scalars import ScalarRules

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "SchemaError",
    "json_grammar",
    "schema_to_grammar",
]
# --------------------------------------------------------------------------------------------
# The converter.


class _Converter(ScalarRules, ContainerRules):
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
