"""The import rules of docs/architecture.md, checked over the source tree.

Every `import` in llamaserve/ (module level, inside functions, and under
TYPE_CHECKING alike) must follow the table below; module-level imports must
not form a cycle. A change that breaks a rule fails here, with the offending
line named.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llamaserve"

# What the HTTP side may import of the engine: the front (`EngineClient`), the read-only slot
# views it hands out, and plain data (requests, events, sampling settings, model protocols,
# the reasoning budget's settings, the /metrics counters).
ENGINE_FRONT = {
    "engine.client",
    "engine.views",
    "engine.types",
    "engine.sampling",
    "engine.backend",
    "engine.reasoning_budget",
    "engine.stats",
}

# Which of our top-level parts each part may import (its own part is always allowed).
# "engine.sampling" allows just that module; "engine" allows the whole package.
ALLOWED: dict[str, set[str]] = {
    # jsondepth is a leaf (it imports nothing of ours) that bounds request nesting everywhere.
    "jsondepth": set(),
    # outbound decides which addresses a client-named URL may reach (media, the MCP proxy): a leaf.
    "outbound": set(),
    # sqlite_file opens the SQLite files of the stores (Responses, batches, usage) alike: a leaf.
    "sqlite_file": set(),
    # llama-server's build_info of our llama.cpp, a table by bindings release: the router reads it.
    "buildtag": set(),
    # grammar/ (JSON Schema → GBNF, patterns) is the ground floor of constrained decoding.
    "grammar": set(),
    "chat": {"jsondepth", "grammar"},
    "protocol": set(),
    "errors": set(),
    "sse": set(),
    "webui": set(),
    "engine": set(),
    # tools/ (agent tools, MCP clients) is plain Python under the HTTP side.
    "tools": set(),
    # llama/ implements the engine's seams, so it may see their plain types and protocols.
    "llama": {"engine.types", "engine.sampling", "engine.runner", "engine.backend"},
    "config": {"engine.sampling", "engine.spec_params"},
    "hub": {"config"},
    # serving/ sees the engine through its front (engine.client: generation, calls on the scheduler
    # thread, slot views, counters, slot files) and the plain data it trades in; never the
    # scheduler, its KV bookkeeping or its queue.
    # Of telemetry/ only the hook that hands finished choices to a request's trace (plain Python).
    "serving": {
        *ENGINE_FRONT,
        "chat",
        "grammar",
        "protocol",
        "errors",
        "sse",
        "config",
        "jsondepth",
        "outbound",
        "telemetry.hook",
        "sqlite_file",
    },
    # quota/ (named keys, their limits and usage) is plain bookkeeping under the HTTP side and the edge.
    "quota": {"config", "sqlite_file"},
    "api": {
        "serving",
        "protocol",
        "errors",
        "sse",
        "config",
        "webui",
        "jsondepth",
        "tools",
        "outbound",
        "quota",
        "telemetry",
    },
    "cli": {
        "config",
        "engine.sampling",
        "engine.spec_params",
        "hub",
        "model_load",
        "compose",
        "router",
        "scale",
        "quota.policy",
    },
    # What the processes at the edge share (edge/: the proxy, the app shell, the /metrics merge):
    # plain HTTP forwarding, with the API's key/CORS/site middleware in the shell; never the engine.
    "edge": {
        "config",
        "errors",
        "sse",
        "api.middleware",
        "api.cors",
        "api.site_guard",
        "api.quota",
        "telemetry",
        "api.prefix",
    },
    # OpenTelemetry traces (the optional extra): settings from the config, spans from the engine's
    # finished events; the processes reach it through api/ (start-up, app shell) and edge/.
    "telemetry": {"config", "engine.types"},
    # Router mode speaks HTTP to child processes of our own server and never imports the engine:
    # it reads the flag table (presets), the hub's cache listing, the web UI's files, forwards
    # through edge/, and of api/ takes only the start-up every process shares (api.run:
    # listeners, uvicorn, signals, logging), the child's marker (api.parent_watch) and the agent
    # tools it serves itself (api.edge_tools: the single server's /tools and /cors-proxy routes).
    "router": {
        "config",
        "hub",
        "errors",
        "sse",
        "webui",
        "edge",
        "cli.options",
        "cli.opt",
        "api.run",
        "api.parent_watch",
        "api.edge_tools",
        "buildtag",
    },
    # A front for several servers: forwarding through edge/ (streams unchanged), the shared
    # start-up and the agent tools its own flags turn on; never the engine, the router, or the rest of api/.
    "scale": {"config", "errors", "edge", "api.run", "api.edge_tools"},
    # Ray Serve: replicas run our server as a child process, the ingress chooses through scale/.
    "ray": {"config", "errors", "sse", "scale", "edge", "cli"},
    # `llama <command>`: serve goes through cli, download through hub, version asks llama/ of its build.
    "unified_cli": {"cli", "hub", "llama.buildinfo", "ray"},
    "compose": {"*"},  # the composition root wires everything together
    "spec_setup": {"*"},  # part of the composition root: the draft model under the engine's seams
    "model_load": {"*"},  # part of the composition root: the model's load, begun before the rest is imported
    "__main__": {"cli"},
    "__init__": set(),
}

# Third-party modules only some parts may import.
RESTRICTED: dict[str, set[str]] = {
    "llama_cpp": {"llama"},  # the native library stays behind llama/
    "ctypes": {"llama"},
    "pydantic": {"protocol", "serving", "api", "errors"},  # pydantic never reaches the engine
    "fastapi": {"api", "edge", "router", "scale", "ray"},
    "starlette": {"api", "webui", "edge", "router", "scale", "ray"},
    "uvicorn": {"api", "router", "scale"},
    "mcp": {"tools"},  # the MCP SDK speaks to MCP servers from tools/mcp.py only
    "ray": {"ray"},  # the optional extra stays behind llamaserve/ray/
    "opentelemetry": {"telemetry"},  # the optional extra stays behind llamaserve/telemetry/
}


@dataclass(frozen=True)
class Import:
    source: str  # dotted module that imports
    target: str  # dotted module imported
    line: int
    top_level: bool  # executed at import time (not in a function, not under TYPE_CHECKING)


def _module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(path: Path, package_root: Path) -> list[Import]:
    module = _module_name(path, package_root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = top_level
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
                isinstance(child, ast.If) and _is_type_checking(child)
            ):
                nested = False
            if isinstance(child, ast.Import):
                found.extend(Import(module, alias.name, child.lineno, top_level) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append(Import(module, target, child.lineno, top_level))
                # `from llamaserve.serving import generate` imports the submodule too.
                for alias in child.names:
                    candidate = f"{target}.{alias.name}"
                    if (package_root.parent / Path(*candidate.split("."))).with_suffix(".py").exists():
                        found.append(Import(module, candidate, child.lineno, top_level))
            visit(child, nested)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    return found


def all_imports(package_root: Path) -> list[Import]:
    return [imp for path in sorted(package_root.rglob("*.py")) for imp in _imports_of(path, package_root)]


# One folder per API family (llamaserve/families/<family>/) holds that family's request models,
# serving code and routes side by side; each module keeps the layer its name says.
FAMILIES = "families"
FAMILY_LAYERS = {"protocol": "protocol", "routes": "api"}


def _part(dotted: str, package: str) -> str:
    """`llamaserve.engine.scheduler` -> `engine`; `llamaserve.cli` -> `cli`; `llamaserve` -> `__init__`;
    `llamaserve.families.chat.routes` -> `api`, `...protocol` -> `protocol`, any other family module
    -> `serving`."""
    rest = dotted.split(".")[1:]
    if not rest:
        return "__init__"
    if rest[0] == FAMILIES:
        return FAMILY_LAYERS.get(rest[2], "serving") if len(rest) > 2 else "serving"
    return rest[0]


def violations(package_root: Path) -> list[str]:
    """Every import that breaks ALLOWED or RESTRICTED, as 'file:line: source -> target (rule)'."""
    package = package_root.name
    out: list[str] = []
    for imp in all_imports(package_root):
        src_part = _part(imp.source, package)
        where = f"{imp.source}:{imp.line}: {imp.source} -> {imp.target}"
        top = imp.target.split(".")[0]
        if top == package:
            dst_rest = imp.target.split(".")[1:]
            dst_part = _part(imp.target, package)
            if dst_part == src_part:
                continue
            allowed = ALLOWED.get(src_part)
            if allowed is None:
                out.append(f"{where} (part '{src_part}' has no rule in ALLOWED)")
                continue
            dotted = ".".join(dst_rest)
            if "*" in allowed or any(dotted == a or dotted.startswith(a + ".") for a in allowed):
                continue
            if dst_rest[:1] == [FAMILIES] and dst_part in allowed:
                continue  # a family's module counts as its layer
            # Where only some modules of that part are allowed, name the one refused.
            partly = any(a.startswith(dst_part + ".") for a in allowed)
            out.append(f"{where} ('{src_part}' may not import '{dotted if partly else dst_part}')")
        elif top in RESTRICTED and src_part not in RESTRICTED[top]:
            out.append(f"{where} ('{top}' is only for {sorted(RESTRICTED[top])})")
    return out


def cycles(package_root: Path) -> list[list[str]]:
    """Cycles among module-level imports of our own modules."""
    package = package_root.name
    graph: dict[str, set[str]] = {}
    modules = {_module_name(p, package_root) for p in package_root.rglob("*.py")}
    for imp in all_imports(package_root):
        if imp.top_level and imp.target in modules and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            # A package's __init__ importing its own submodules is how packages work, not a cycle.
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert package  # the graph holds only our package's modules
    return found


# The HTTP side must not hold the scheduler, even one an object handed it: an attribute so named,
# or a getattr() by name of the scheduler or its parts (that is how the prompt cache was reached).
SCHEDULER_ATTRIBUTES = {"scheduler", "_scheduler"}
SCHEDULER_PARTS_BY_NAME = {"scheduler", "_scheduler", "kv", "admission", "slots"}
HTTP_PARTS = ("serving", "api", FAMILIES)


def _engine_bypasses_in(path: Path, module: str) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute):
            if node.attr in SCHEDULER_ATTRIBUTES:
                out.append(f"{module}:{node.lineno}: .{node.attr} (use the engine's front)")
            # `rt.engine._x`: the front's private parts are the scheduler's by another name.
            elif node.attr.startswith("_") and isinstance(node.value, ast.Attribute) and node.value.attr == "engine":
                out.append(f"{module}:{node.lineno}: engine.{node.attr} (a private part of the front)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr"):
            named = node.args[1] if len(node.args) > 1 else None
            if isinstance(named, ast.Constant) and named.value in SCHEDULER_PARTS_BY_NAME:
                out.append(f"{module}:{node.lineno}: {node.func.id}(..., {named.value!r}) (use the engine's front)")
    return out


def engine_bypasses(package_root: Path) -> list[str]:
    """Places in serving/ and api/ that reach past the engine's front to the scheduler."""
    out: list[str] = []
    for part in HTTP_PARTS:
        for path in sorted((package_root / part).rglob("*.py")):
            out.extend(_engine_bypasses_in(path, _module_name(path, package_root)))
    return out


def test_serving_and_api_reach_the_engine_only_through_its_front() -> None:
    assert engine_bypasses(PACKAGE) == []


def test_the_front_check_catches_a_route_reaching_the_scheduler(tmp_path: Path) -> None:
    """Each way the HTTP side once reached the scheduler is reported, by import and by attribute."""
    pkg = tmp_path / "llamaserve"
    for sub in ("engine", "engine/kv", "serving", "api"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name in ("scheduler", "client", "admission"):
        (pkg / "engine" / f"{name}.py").write_text("")
    (pkg / "engine" / "kv" / "slot.py").write_text("Slot = object\n")
    (pkg / "serving" / "info.py").write_text(
        "from llamaserve.engine.kv.slot import Slot\n"
        "from llamaserve.engine.client import EngineClient\n"
        "def n(rt):\n    return len(rt.scheduler.slots)\n"
    )
    (pkg / "serving" / "state.py").write_text(
        "from llamaserve.engine.scheduler import Scheduler\n"
        "def q(rt):\n    return getattr(rt.engine, 'admission', None), rt.engine._slot_files\n"
    )
    (pkg / "api" / "routes.py").write_text("def busy(rt):\n    return [s.busy for s in rt.scheduler.slots]\n")
    imports = violations(pkg)
    assert any("serving.info -> llamaserve.engine.kv.slot" in v for v in imports), imports
    assert any("serving.state -> llamaserve.engine.scheduler" in v for v in imports), imports
    assert not any("engine.client" in v for v in imports), imports  # the front itself is allowed
    reached = engine_bypasses(pkg)
    assert any(v.startswith("llamaserve.serving.info:4: .scheduler") for v in reached), reached
    assert any(v.startswith("llamaserve.api.routes:2: .scheduler") for v in reached), reached
    assert any("getattr(..., 'admission')" in v for v in reached), reached
    assert any("engine._slot_files" in v for v in reached), reached


def test_every_import_follows_the_layering_rules() -> None:
    assert violations(PACKAGE) == []


def test_module_level_imports_form_no_cycle() -> None:
    assert cycles(PACKAGE) == []


def test_the_checker_catches_a_violation_and_a_cycle(tmp_path: Path) -> None:
    """The rules are not vacuous: a tree that breaks them is reported."""
    pkg = tmp_path / "llamaserve"
    for sub in ("engine", "serving", "llama"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "scheduler.py").write_text("from llamaserve.llama.model import Model\n")
    (pkg / "serving" / "chat.py").write_text("import ctypes\nfrom llamaserve.serving import generate\n")
    (pkg / "serving" / "generate.py").write_text("from llamaserve.serving.chat import x\n")
    (pkg / "llama" / "model.py").write_text("Model = object\n")
    found = violations(pkg)
    assert any("engine.scheduler" in v and "may not import 'llama'" in v for v in found), found
    assert any("serving.chat" in v and "'ctypes'" in v for v in found), found
    assert cycles(pkg) == [["llamaserve.serving.chat", "llamaserve.serving.generate", "llamaserve.serving.chat"]]


def test_the_forwarders_may_reach_only_their_listed_modules(tmp_path: Path) -> None:
    """scale/ sees neither the router nor api/ beyond the shared start-up; router/ sees api/ only
    through it too (the app shell's middleware is edge/'s to import)."""
    pkg = tmp_path / "llamaserve"
    for sub in ("api", "edge", "router", "scale"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for name in ("run", "listen", "server", "middleware"):
        (pkg / "api" / f"{name}.py").write_text("")
    (pkg / "edge" / "proxy.py").write_text("from llamaserve.api.middleware import x\n")
    (pkg / "router" / "registry.py").write_text("")
    (pkg / "scale" / "front.py").write_text(
        "from llamaserve.api.run import run_server\n"
        "from llamaserve.edge.proxy import Upstream\n"
        "from llamaserve.router.registry import Registry\n"
        "from llamaserve.api.listen import open_listeners\n"
    )
    (pkg / "router" / "server.py").write_text(
        "from llamaserve.api.run import run_server\n"
        "from llamaserve.api.middleware import x\n"
        "import llamaserve.api.server\n"
    )
    found = violations(pkg)
    assert any("scale.front:3:" in v and "may not import 'router'" in v for v in found), found
    assert any("scale.front:4:" in v and "may not import 'api.listen'" in v for v in found), found
    assert any("router.server:2:" in v and "may not import 'api.middleware'" in v for v in found), found
    assert any("router.server:3:" in v and "may not import 'api.server'" in v for v in found), found
    assert len(found) == 4, found  # api.run, edge.proxy and edge's own api.middleware are allowed


def _run_without_libllama(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter where importing llama_cpp fails."""
    guard = "import sys; sys.modules['llama_cpp'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", guard + code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_help_and_a_bad_flag_answer_without_the_native_library() -> None:
    helped = _run_without_libllama("from llamaserve.cli import main; raise SystemExit(main(['--help']))")
    assert helped.returncode == 0, helped.stderr
    assert "--ctx-size" in helped.stdout
    bad = _run_without_libllama("from llamaserve.cli import main; raise SystemExit(main(['--no-such-flag']))")
    assert bad.returncode == 1, bad.stderr
    assert "--no-such-flag" in bad.stderr and "llama_cpp" not in bad.stderr


@pytest.mark.parametrize("tests", [["tests/unit/test_scheduler.py", "tests/unit/test_kvcache.py"]])
def test_the_fake_runner_scheduler_tests_run_without_the_native_library(tests: list[str]) -> None:
    code = (
        "import pytest\n"
        f"code = pytest.main(['-q', '-p', 'no:cacheprovider', *{tests!r}])\n"
        "assert 'llama_cpp' not in sys.modules or sys.modules['llama_cpp'] is None\n"
        "raise SystemExit(code)\n"
    )
    run = _run_without_libllama(code)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
