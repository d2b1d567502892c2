"""Several servers' `/metrics` as one: the router's (every loaded child's, labelled `model`), the
front's (each member's, relabelled `upstream`) and Ray's ingress's, plus the edge's own gauges.

Each child's Prometheus text is read family by family (a `# HELP`/`# TYPE` pair and the
samples after it); the families of all children are written once each, every sample
labelled with the model that produced it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(.*)$")


@dataclass
class _Family:
    help: str = ""
    type: str = ""
    samples: list[str] = field(default_factory=list)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labelled(line: str, model: str) -> str | None:
    match = _SAMPLE.match(line)
    if match is None:
        return None
    name, labels, rest = match.groups()
    inner = f'model="{_label(model)}"' + ("," + labels[1:-1] if labels and labels[1:-1] else "")
    return f"{name}{{{inner}}} {rest}"


def merge_metrics(texts: dict[str, str], own: list[tuple[str, str, str, float]]) -> str:
    """`texts`: each model's exposition text; `own`: (name, help, type, value) of the router itself."""
    families: dict[str, _Family] = {}
    for model, text in texts.items():
        current: _Family | None = None
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                parts = line.split(" ", 3)
                if len(parts) < 3:
                    continue
                current = families.setdefault(parts[2], _Family())
                value = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    current.help = current.help or value
                else:
                    current.type = current.type or value
                continue
            if not line.strip() or line.startswith("#"):
                continue
            sample = _labelled(line, model)
            if sample is None:
                continue
            if current is None:
                current = families.setdefault(sample.split("{", 1)[0], _Family())
            current.samples.append(sample)
    out: list[str] = []
    for metric, doc, kind, number in own:
        out += [f"# HELP {metric} {doc}", f"# TYPE {metric} {kind}", f"{metric} {number:g}"]
    for name, fam in families.items():
        if fam.help:
            out.append(f"# HELP {name} {fam.help}")
        if fam.type:
            out.append(f"# TYPE {name} {fam.type}")
        out += fam.samples
    return "\n".join(out) + "\n"
