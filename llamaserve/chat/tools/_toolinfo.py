"""What a parser knows of the offered tools: names, parameter schemas and the JSON type a
parameter expects, so that raw argument text becomes a typed value."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def tool_function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    """The function description of an OpenAI tool (``{"type":"function","function":{...}}``)
    or of a bare ``{"name":..., "parameters":...}``."""
    fn = tool.get("function")
    return fn if isinstance(fn, Mapping) else tool


def tool_name(tool: Mapping[str, Any]) -> str:
    name = tool_function(tool).get("name")
    return name if isinstance(name, str) else ""


def tool_parameters(tool: Mapping[str, Any]) -> Any:
    params = tool_function(tool).get("parameters")
    if params is None:
        return {"type": "object", "properties": {}}
    return params


class ToolInfo:
    """What the parsers know about the offered tools: names and parameter types.

    ``names`` is None when tools were offered but their list is unknown (any name is accepted).
    """

    def __init__(self, tools: Iterable[Mapping[str, Any]] | None) -> None:
        self.names: frozenset[str] | None = None
        self.params: dict[str, Any] = {}
        if tools is not None:
            names = []
            for t in tools:
                if isinstance(t, Mapping):
                    n = tool_name(t)
                    if n:
                        names.append(n)
                        self.params[n] = tool_parameters(t)
            self.names = frozenset(names)

    def accepts(self, name: str) -> bool:
        if not name:
            return False
        return self.names is None or name in self.names

    def param_is_string(self, tool: str, param: str) -> bool | None:
        """True when the parameter is declared as a string only, False when declared without
        ``string`` among its types, None when unknown."""
        schema = self.params.get(tool)
        if not isinstance(schema, Mapping):
            return None
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            return None
        p = props.get(param)
        if not isinstance(p, Mapping):
            return None
        types = _schema_types(p)
        if types is None:
            return None
        if types == {"string"}:
            return True
        return False if "string" not in types else None


def _schema_types(s: Mapping[str, Any]) -> set[str] | None:
    t = s.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return set(t)
    if "enum" in s and isinstance(s["enum"], list):
        return {_json_type(v) for v in s["enum"]}
    if "const" in s:
        return {_json_type(s["const"])}
    for key in ("anyOf", "oneOf"):
        alts = s.get(key)
        if isinstance(alts, list):
            out: set[str] = set()
            for a in alts:
                if not isinstance(a, Mapping):
                    return None
                ta = _schema_types(a)
                if ta is None:
                    return None
                out |= ta
            return out
    return None


def _json_type(v: Any) -> str:
    if isinstance(v, str):
        return "string"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if v is None:
        return "null"
    return "array" if isinstance(v, list) else "object"


def typed_value(info: ToolInfo, tool: str, param: str, raw: str) -> Any:
    """The JSON value of a parameter given as raw text (XML-style formats): a declared string
    stays text; otherwise JSON is tried and raw text is the fallback."""
    if info.param_is_string(tool, param):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def dump_args(args: Mapping[str, Any]) -> str:
    return json.dumps(args, ensure_ascii=False)
