"""GBNF building blocks for tool-call grammars.

Several tools' argument schemas go into one grammar: each schema is converted by
:func:`llamaserve.grammar.json_schema.schema_to_grammar` and its rules are renamed with a per-tool
prefix (:func:`prefix_rules`), so ``root``/``ws``/``string``... of different tools do not collide.

A schema the converter rejects (``SchemaError``) -- or any other conversion failure -- does not
fail the request: that one tool's arguments fall back to "any JSON object". The grammar is then
looser than the schema for that tool only; everything else stays exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from llamaserve.grammar.json_schema import JSON_OBJECT_GRAMMAR, schema_to_grammar

_RULE_LINE = re.compile(r"^([a-zA-Z0-9-]+) ::= ")


def split_rules(gbnf: str) -> list[tuple[str, str]]:
    """``[(name, body), ...]`` of a GBNF text written one rule per line (continuation lines,
    which llama.cpp allows inside parentheses, are joined to their rule)."""
    rules: list[tuple[str, str]] = []
    for line in gbnf.splitlines():
        m = _RULE_LINE.match(line)
        if m:
            rules.append((m.group(1), line[m.end() :]))
        elif line.strip() and not line.lstrip().startswith("#"):
            if not rules:
                raise ValueError(f"GBNF line outside a rule: {line[:60]!r}")
            name, body = rules[-1]
            rules[-1] = (name, body + " " + line.strip())
    return rules


def rename_refs(body: str, mapping: Mapping[str, str]) -> str:
    """Rename rule references in a rule body, leaving string literals, character classes and
    comments untouched."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i : j + 1])
            i = j + 1
        elif c == "#":
            j = body.find("\n", i)
            j = n if j < 0 else j
            out.append(body[i:j])
            i = j
        elif c.isascii() and (c.isalnum() or c == "-"):
            j = i
            while j < n and body[j].isascii() and (body[j].isalnum() or body[j] == "-"):
                j += 1
            word = body[i:j]
            out.append(mapping.get(word, word))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def prefix_rules(gbnf: str, prefix: str) -> list[tuple[str, str]]:
    """The rules of ``gbnf`` with every rule name (definitions and references) prefixed."""
    rules = split_rules(gbnf)
    mapping = {name: f"{prefix}{name}" for name, _ in rules}
    return [(mapping[name], rename_refs(body, mapping)) for name, body in rules]


def lit(text: str) -> str:
    """A GBNF string literal."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _class_char(ch: str) -> str:
    if ch in "]\\^-[":
        return "\\" + ch
    if ch == "\n":
        return "\\n"
    if ch == "\r":
        return "\\r"
    if ch == "\t":
        return "\\t"
    if ord(ch) < 0x20:
        return f"\\x{ord(ch):02X}"
    return ch


def char_class(chars: Iterable[str], negate: bool = False) -> str:
    body = "".join(_class_char(c) for c in sorted(set(chars)))
    return f"[{'^' if negate else ''}{body}]"


def json_str_lit(text: str) -> str:
    """A GBNF literal for the JSON string encoding of ``text`` (as json.dumps writes it)."""
    import json

    return lit(json.dumps(text, ensure_ascii=False))


class GrammarBuilder:
    """Collects named rules; :meth:`text` writes ``root`` first."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._schema_ids = 0
        self.fallbacks: list[str] = []  # tools whose schema could not be converted

    def add(self, name: str, body: str) -> str:
        if name in self.rules and self.rules[name] != body:
            raise ValueError(f"grammar rule {name} defined twice")
        self.rules[name] = body
        return name

    def fresh(self, hint: str) -> str:
        self._schema_ids += 1
        return f"{hint}-{self._schema_ids}"

    def schema(self, schema: Any, hint: str, *, tool: str = "") -> str:
        """Rule name matching JSON instances of ``schema`` (any JSON object on failure)."""
        prefix = self.fresh(hint) + "-"
        try:
            text = schema_to_grammar(schema)
        except Exception:  # SchemaError, or a converter bug: degrade for this tool only
            self.fallbacks.append(tool or hint)
            text = JSON_OBJECT_GRAMMAR
        for name, body in prefix_rules(text, prefix):
            self.add(name, body)
        return f"{prefix}root"

    def schema_or_none(self, schema: Any, hint: str) -> str | None:
        """Like :meth:`schema` but None when the schema cannot be converted."""
        try:
            text = schema_to_grammar(schema)
        except Exception:
            return None
        prefix = self.fresh(hint) + "-"
        for name, body in prefix_rules(text, prefix):
            self.add(name, body)
        return f"{prefix}root"

    def json_value(self) -> str:
        """Rule for any JSON value (shared)."""
        if "anyjson-root" not in self.rules:
            for name, body in prefix_rules(schema_to_grammar(True), "anyjson-"):
                self.add(name, body)
        return "anyjson-root"

    def not_containing(self, stop: str, hint: str = "text") -> str:
        """Rule for any text (possibly empty) that does not contain ``stop``, built from the
        Knuth-Morris-Pratt automaton of ``stop`` (one rule per prefix state). Followed by
        ``stop`` this matches exactly "text up to the first occurrence of stop"."""
        key = f"{hint}-nc-" + "-".join(f"{ord(c):x}" for c in stop)
        first = f"{key}-0"
        if first in self.rules:
            return first
        n = len(stop)
        fail = [0] * (n + 1)
        k = 0
        for i in range(1, n):
            while k and stop[i] != stop[k]:
                k = fail[k]
            if stop[i] == stop[k]:
                k += 1
            fail[i + 1] = k

        def delta(state: int, ch: str) -> int:
            while state and stop[state] != ch:
                state = fail[state]
            return state + 1 if stop[state] == ch else 0

        alphabet = sorted(set(stop))
        for state in range(n):
            alts = ['""']
            for ch in alphabet:
                nxt = delta(state, ch)
                if nxt < n:
                    alts.append(f"{lit(ch)} {key}-{nxt}")
            alts.append(f"{char_class(alphabet, negate=True)} {key}-0")
            self.add(f"{key}-{state}", " | ".join(alts))
        return first

    def text(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n"


def alt(items: Iterable[str]) -> str:
    items = list(items)
    if len(items) == 1:
        return items[0]
    return "(" + " | ".join(items) + ")"


def repeat_calls(call: str, parallel: bool, sep: str = "") -> str:
    """``call`` once, or one or more times (separated by ``sep``) when parallel calls are on."""
    if not parallel:
        return call
    return f"{call} ({sep + ' ' if sep else ''}{call})*"


# Optional whitespace between calls (bounded: a grammar must never let the model loop on spaces).
SP = "sp"
SP_RULE = "[ \\t\\n]{0,8}"


def json_call_body(
    name: str, args_rule: str, *, name_key: str = "name", args_key: str = "arguments", extra: str = ""
) -> str:
    """GBNF for ``{"name": "NAME", "arguments": ARGS<extra>}`` (``extra`` is GBNF placed after
    the arguments, e.g. an id field)."""
    return (
        f'"{{" {SP} {json_str_lit(name_key)} {SP} ":" {SP} {json_str_lit(name)} {SP} "," {SP} '
        f'{json_str_lit(args_key)} {SP} ":" {SP} {args_rule} {extra} {SP} "}}"'
    ).replace("  ", " ")


def regex_escape(text: str) -> str:
    """Escape text for an ECMAScript regex (llama.cpp trigger patterns use std::regex)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)


def _is_text_schema(s: Any) -> bool:
    if not isinstance(s, Mapping):
        return True
    t = s.get("type")
    if t == "string":
        return True
    # No type and no constraint: unconstrained, written as text.
    return t is None and not any(
        k in s
        for k in ("properties", "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minimum", "maximum")
    )


def xml_params(g: GrammarBuilder, schema: Any, hint: str) -> tuple[list[tuple[str, str | None, bool]], bool]:
    """The parameters of a tool for XML-style formats (one tag per argument):
    ``([(name, value rule or None for raw text, required), ...], extra keys allowed)``.

    String (and unconstrained) parameters are raw text; others use the JSON grammar of their
    sub-schema, or raw text when it cannot be converted (looser, never failing)."""
    if not isinstance(schema, Mapping):
        return [], True
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    out: list[tuple[str, str | None, bool]] = []
    for j, (key, sub) in enumerate(props.items()):
        if not isinstance(key, str):
            continue
        rule: str | None = None
        if not _is_text_schema(sub):
            sub2 = dict(sub) if isinstance(sub, Mapping) else sub
            if isinstance(sub2, dict):
                sub2.update({k: v for k, v in defs.items() if k not in sub2})
            rule = g.schema_or_none(sub2, f"{hint}-p{j}")
        out.append((key, rule, key in required))
    extra = schema.get("additionalProperties", True) is not False and not props
    return out, extra


def xml_params_body(
    g: GrammarBuilder, params: list[tuple[str, str | None, bool]], extra: bool, hint: str, one: Any
) -> str:
    """A sequence of parameter tags in declared order (required ones mandatory). ``one(key_gbnf,
    value_gbnf)`` writes one parameter; ``key_gbnf`` is a literal or a name rule."""
    parts = []
    for j, (key, rule, req) in enumerate(params):
        r = g.add(f"{hint}-arg{j}", one(lit(key), rule))
        parts.append(r if req else f"{r}?")
    if extra:
        name = g.add("xml-key", "[a-zA-Z0-9_.-]{1,64}")
        r = g.add(f"{hint}-argx", one(name, None))
        parts.append(f"{r}*")
    return " ".join(parts) if parts else '""'


COMMA = f'{SP} ","'
