"""`--help` and `--completion-bash`: every spelling, grouped as llama-server groups them."""

from __future__ import annotations

from typing import Any

from llamaserve.cli.options import COMMON, OPTIONS, SAMPLING, SERVER, Opt
from llamaserve.config import ServerConfig
from llamaserve.engine.sampling import SCALAR_KNOBS, SamplingParams

_GROUPS = (COMMON, SAMPLING, SERVER)
_LEFT = 44
_CONFIG = ServerConfig()
_SAMPLING = SamplingParams()


def _default(dest: str) -> Any:
    """The config's default for a destination (None where the flag sets no config field)."""
    if dest in SCALAR_KNOBS:
        return getattr(_SAMPLING, dest)
    value: Any = _CONFIG
    for name in dest.split("."):
        value = getattr(value, name, None)
    return value


def _describe(opt: Opt) -> str:
    text = opt.help
    if opt.feature:
        text += f" [not built yet: {opt.feature}]"
    if opt.removed:
        text = f"removed in llama-server: {opt.removed}"
    if opt.hardware:
        text += " [GPU builds]"
    if opt.noop:
        text += f" [no effect: {opt.noop}]"
    if opt.kind in ("value", "pair") and "default:" not in text and not opt.feature:
        default = _default(opt.dest)
        if isinstance(default, bool):
            text += f" (default: {'enabled' if default else 'disabled'})"
        elif default not in (None, "", ()):
            shown = ",".join(str(x) for x in default) if isinstance(default, tuple) else default
            text += f" (default: {shown})"
    if opt.env:
        text += f" (env: {opt.env})"
    return text


def _left(opt: Opt) -> str:
    spelled = ", ".join(opt.spellings)
    return f"{spelled} {opt.metavar}".rstrip()


def render_help(prog: str) -> str:
    lines = [
        f"usage: {prog} [options]",
        "",
        "An OpenAI-, Anthropic- and llama-server-compatible LLM server.",
        "",
    ]
    for group in _GROUPS:
        lines += [f"----- {group} -----", ""]
        for opt in OPTIONS:
            if opt.group != group:
                continue
            left = _left(opt)
            description = _describe(opt)
            if len(left) < _LEFT:
                lines.append(f"{left.ljust(_LEFT)}{description}")
            else:
                lines += [left, f"{'':{_LEFT}}{description}"]
        lines.append("")
    return "\n".join(lines)


def render_completion(prog: str) -> str:
    """A bash completion script for every spelling."""
    words = " ".join(name for opt in OPTIONS for name in opt.spellings)
    function = "_" + prog.replace("-", "_")
    return (
        f"{function}() {{\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}"\n'
        '    local prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
        '    case "$prev" in\n'
        "        -m|--model|--lora|--chat-template-file|--grammar-file|-jf|--json-schema-file|--log-file)\n"
        '            COMPREPLY=( $(compgen -f -- "$cur") ); return 0 ;;\n'
        "    esac\n"
        f'    COMPREPLY=( $(compgen -W "{words}" -- "$cur") )\n'
        "}\n"
        f"complete -F {function} {prog}\n"
    )
