"""Every flag's value reaches code that acts on it.

A row of the flag table (`llamaserve/cli/options*.py`) fills a field of `ServerConfig` (or of its
parts, or of the default `SamplingParams`). That field must be read somewhere outside `cli/` and
`config.py`: else the flag is parsed, checked and then ignored, which is a bug. A row whose value
cannot reach anything says so in the row itself (`feature`: refused, not built; `removed`:
refused, llama-server removed it; `noop`: llama-server reads it nowhere either, accepted with a
warning). This test keeps no list of exceptions of its own.

"Read" is static: the field's name appears as an attribute (`config.load.fit`) or a
`getattr(…, "name")` in llamaserve's code outside the command line and the config module, or
in a property or method of `config.py` whose own name is read so (`effective_threads` reads
`threads`). `cli/build.py` turns a few flags into other fields before the config exists
(`--lora` and `--lora-scaled` into `lora`); `DERIVED` names those, and the field each becomes
must be read in turn.
"""

from __future__ import annotations

import ast
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from llamaserve.cli.opt import Opt
from llamaserve.cli.options import OPTIONS
from llamaserve.config import ServerConfig
from llamaserve.engine.sampling import SCALAR_KNOBS, SamplingParams

ROOT = Path(__file__).resolve().parents[2] / "llamaserve"

# Destinations cli/build.py turns into other fields before ServerConfig is built.
DERIVED: dict[str, tuple[str, ...]] = {
    "lora_plain": ("lora",),
    "lora_scaled": ("lora",),
    "sampler_seq": ("samplers",),
    "dry_breakers": ("dry_sequence_breakers",),
    "default_grammar_file": ("default_grammar",),
    "default_json_schema_file": ("default_json_schema",),
    "api_key": ("api_keys",),
    "api_key_file": ("api_keys",),
    "agent": ("tools", "ui_mcp_proxy"),
}
# Destinations that name no field: a preset's settings, markers of flags refused before a config exists.
NOT_FIELDS = frozenset({"preset", "spec", "mtmd_pending", "removed"})


def _names_read(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            names.add(node.args[1].value)
    return names


def _read_outside_config() -> set[str]:
    read: set[str] = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("cli/") or rel == "config.py":
            continue
        read |= _names_read(ast.parse(path.read_text()))
    # config.py's properties and methods: what one reads counts once its own name is read.
    config_tree = ast.parse((ROOT / "config.py").read_text())
    functions = [n for n in ast.walk(config_tree) if isinstance(n, ast.FunctionDef)]
    grew = True
    while grew:
        grew = False
        for fn in functions:
            if fn.name in read:
                new = _names_read(fn) - read
                if new:
                    read |= new
                    grew = True
    return read


READ = _read_outside_config()


def _part_type(owner: Any, name: str) -> Any:
    """The dataclass of a config part (`load` → LoadConfig), else None."""
    kind = get_type_hints(owner)[name]
    return kind if is_dataclass(kind) else None


def _checked_rows() -> list[Opt]:
    return [
        o
        for o in OPTIONS
        if o.kind not in ("action", "preset") and o.dest not in NOT_FIELDS and not (o.feature or o.removed or o.noop)
    ]


def _unread(opt: Opt) -> list[str]:
    targets = DERIVED.get(opt.dest, (opt.dest,))
    return [t for t in targets if t.split(".")[-1] not in READ]


def test_every_flag_reaches_code_that_reads_it() -> None:
    unread = {"/".join(o.names): _unread(o) for o in _checked_rows() if _unread(o)}
    assert not unread, (
        "flags whose config field nothing outside cli/ and config.py reads (honour them, or refuse "
        f"them in their Opt row with feature=/removed=/noop=): {unread}"
    )


def test_destinations_are_config_fields() -> None:
    """The scan looks for the right names: each checked row's destination (or what build.py
    makes of it) is a real field, so a typo cannot pass as 'read'."""
    wrong = []
    for o in _checked_rows():
        for target in DERIVED.get(o.dest, (o.dest,)):
            if not _leaf_is_field(target):
                wrong.append((o.names[0], target))
    assert not wrong, wrong


def _leaf_is_field(dest: str) -> bool:
    if dest in SCALAR_KNOBS or dest in {f.name for f in fields(SamplingParams)}:
        return True
    owner: Any = ServerConfig
    for part in dest.split("."):
        if owner is None or part not in {f.name for f in fields(owner)}:
            return False
        owner = _part_type(owner, part)
    return True


def test_derived_destinations_are_the_build_steps() -> None:
    """DERIVED names only destinations the table has and build.py handles by name."""
    build = (ROOT / "cli" / "build.py").read_text()
    dests = {o.dest for o in OPTIONS}
    for dest in DERIVED:
        assert dest in dests, dest
        assert f'"{dest}"' in build, dest


def test_refused_rows_say_why() -> None:
    """A row exempt from the check carries its reason, shown by --help."""
    from llamaserve.cli.usage import render_help

    text = render_help("llama-server")
    for o in OPTIONS:
        for reason in (o.feature, o.removed, o.noop):
            if reason:
                assert len(reason) > 10
                assert reason in text, (o.names, reason)


def test_the_scan_sees_reads_and_misses() -> None:
    assert {"n_gpu_layers", "ctx_size", "effective_threads", "threads"} <= READ
    assert "no_such_config_field" not in READ
