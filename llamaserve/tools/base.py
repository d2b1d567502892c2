"""What every tool is (a name, a JSON schema, whether it writes) and one call's context."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from llamaserve.tools.fileio import ToolIO, make_io
from llamaserve.tools.proc import ChunkSink

JSON = dict[str, Any]


class ParamError(Exception):
    """A bad `params` value: a 400 naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"params.{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Call:
    """One POST /tools: the params, and what the headers set (x-tool-cwd, x-tool-runtime,
    x-resp-type). The model cannot set these through the params: they are dropped there."""

    params: JSON
    cwd: str = ""
    runtime: str = ""
    resp_type: str = ""
    root: str | None = None

    def io(self) -> ToolIO:
        return make_io(self.cwd, self.runtime, self.root)


class Tool:
    name: str = ""
    display_name: str = ""
    permission_write: bool = False
    support_stream: bool = False
    uses_cwd: bool = False
    kind: str = "server"

    def definition(self) -> JSON:
        raise NotImplementedError

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        """Run in a worker thread; a streamed call pushes its output to `sink`."""
        raise NotImplementedError

    async def call(self, call: Call, sink: ChunkSink | None = None) -> JSON:
        return await asyncio.to_thread(self.invoke, call, sink)

    def to_json(self) -> JSON:
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": self.kind,
            "permissions": {"write": self.permission_write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition(),
        }


def function(name: str, description: str, properties: JSON, required: list[str] | None = None) -> JSON:
    parameters: JSON = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def check_value(schema: JSON, value: Any, where: str) -> None:
    kind = schema.get("type")
    expected = _TYPES.get(kind) if isinstance(kind, str) else None
    # bool is an int to Python, not to JSON Schema.
    if expected is not None and (not isinstance(value, expected) or (kind == "integer" and isinstance(value, bool))):
        raise ParamError(where, f"expected {'an' if kind in ('integer', 'array', 'object') else 'a'} {kind}")
    if kind == "array" and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            check_value(schema["items"], item, f"{where}[{i}]")
    if kind == "object" and isinstance(value, dict):
        check_object(schema, value, where + ".")


def check_object(schema: JSON, value: JSON, prefix: str = "") -> None:
    """`value` against a tool's parameter schema: required fields, their types, no strangers."""
    props: JSON = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            raise ParamError(prefix + name, "required")
    for name, item in value.items():
        if name not in props:
            raise ParamError(prefix + name, "unknown parameter")
        check_value(props[name], item, prefix + name)
