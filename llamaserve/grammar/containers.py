"""The JSON Schema converter's rules for containers: objects (declared, required, optional and
additional properties, in linear size) and arrays (``prefixItems``, ``items`` and the item count
limits). Their members are schemas again, so these rules call back into the converter's walk
(`visit`) inside `progress()`, which tells the walk that a ``{`` or ``[`` was consumed."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from llamaserve.grammar.common import _count, _err, _ptr, _unsat
from llamaserve.grammar.gbnf import (
    _JSON_SPECIAL,
    _class_expr,
    _gbnf_literal,
    _iv,
    _iv_complement,
    _iv_intersect,
    _seq,
)
from llamaserve.grammar.rulebook import RuleBook


class ContainerRules(RuleBook):
    """Objects and arrays, whose members the converter's walk turns into rules of their own."""

    def visit(self, schema: Any, path: str, hint: str) -> str:
        """A symbol for the values valid against ``schema``: the converter's walk provides it."""
        raise NotImplementedError

    def progress(self) -> AbstractContextManager[None]:
        """Entered around the members: input was consumed, so no left recursion from here on."""
        raise NotImplementedError

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
