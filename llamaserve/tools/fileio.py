"""Where a tool's file and process operations happen: the host, or an isolate (a container
through `docker|podman exec`, a remote host through `ssh`).

Every command is an argv list. Values that reach a command line as words of their own (a
container id, an ssh target) are checked first: one starting with '-' would be read as an
option (`-oProxyCommand=...` runs anything on this machine, `--privileged` widens a container).
Inside an isolate paths travel as positional arguments of a fixed `sh -c` script ("$1"), never
spliced into the script; over ssh, whose far side re-parses the line, the whole argv is quoted.

On the host an optional root (LLAMASERVE_TOOLS_ROOT) confines the file tools: a path is
resolved (`~`, the working directory, `..`, then every symlink) and refused unless it lies
inside the root, so neither `../..` nor a link pointing out reaches other files.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from llamaserve.tools import proc
from llamaserve.tools.proc import ExecResult

Kind = Literal["files", "dirs", "all"]

GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024
LIST_TIMEOUT = 15.0  # seconds for one listing, git and walker alike
ISOLATE_EXEC_TIMEOUT = 15.0
ISOLATE_READ_MAX = 64 * 1024 * 1024
# Listed but never walked: they can be enormous.
JUNK_DIRS = frozenset(
    {".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target", ".cache"}
    | {".idea", ".vscode"}
)


class RuntimeRefused(Exception):
    """A runtime spec that cannot be used (unknown scheme, option injection): a 500, as llama-server."""


class PathRefused(Exception):
    """A path outside the tools root: the tool answers with this error."""


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-separated relative path, is_dir)
    err: str = ""
    truncated: bool = False


def _depth(rel: str) -> int:
    return 1 + rel.count("/")


class ToolIO:
    """The operations the built-in tools need; `cwd` resolves relative paths."""

    cwd: str
    isolated: bool = False

    def resolve(self, path: str) -> str:
        raise NotImplementedError

    def is_dir(self, path: str) -> bool:
        raise NotImplementedError

    def is_file(self, path: str) -> bool:
        raise NotImplementedError

    def file_size(self, path: str) -> int | None:
        raise NotImplementedError

    def read(self, path: str) -> bytes | None:
        raise NotImplementedError

    def write(self, path: str, content: bytes) -> bool:
        raise NotImplementedError

    def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        raise NotImplementedError

    def run(
        self, argv: list[str], max_output: int, timeout: float, on_chunk: proc.ChunkSink | None = None
    ) -> ExecResult:
        raise NotImplementedError


class HostIO(ToolIO):
    def __init__(self, cwd: str = "", root: str | None = None) -> None:
        self.root = os.path.realpath(root) if root else None
        self.cwd = cwd or (self.root or "")
        if self.root is not None:
            self.check(self.cwd)

    def resolve(self, path: str) -> str:
        if path == "~" or path.startswith("~/"):
            home = os.environ.get("HOME", "")
            if home:
                path = home + path[1:]
        if not os.path.isabs(path):
            path = os.path.join(self.cwd or os.getcwd(), path)
        return os.path.normpath(path)

    def check(self, path: str) -> str:
        """The resolved path, refused outside the root (after following every symlink)."""
        full = self.resolve(path)
        if self.root is not None:
            real = os.path.realpath(full)
            if real != self.root and not real.startswith(self.root.rstrip("/") + "/"):
                raise PathRefused(f"access denied: {path} is outside the tools root {self.root}")
        return full

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.check(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.check(path))

    def file_size(self, path: str) -> int | None:
        try:
            st = os.stat(self.check(path))
        except OSError:
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def read(self, path: str) -> bytes | None:
        try:
            with open(self.check(path), "rb") as fh:
                return fh.read()
        except OSError:
            return None

    def write(self, path: str, content: bytes) -> bool:
        full = self.check(path)
        try:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            # Checked again once the parents exist: a link among them could lead out.
            self.check(full)
            with open(full, "wb") as fh:
                fh.write(content)
        except OSError:
            return False
        return True

    def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        out = Listing()
        full = self.check(base)
        if not os.path.isdir(full):
            out.err = "path does not exist or is not a directory"
            return out
        deadline = time.monotonic() + LIST_TIMEOUT
        if kind == "files":
            res = self.run(
                ["git", "-C", full, "ls-files", "--cached", "--others", "--exclude-standard"],
                GIT_LS_FILES_MAX_OUTPUT,
                LIST_TIMEOUT,
            )
            if res.exit_code == 0 and not res.timed_out:
                for line in res.output.splitlines():
                    rel = line.rstrip("\r").replace("\\", "/")
                    if not rel or (max_depth > 0 and _depth(rel) > max_depth):
                        continue
                    if os.path.isfile(os.path.join(full, rel)) and self._inside(os.path.join(full, rel)):
                        out.entries.append((rel, False))
                return out
        self._walk(full, max_depth, kind, deadline, out)
        return out

    def _inside(self, path: str) -> bool:
        try:
            self.check(path)
        except PathRefused:
            return False
        return True

    def _walk(self, base: str, max_depth: int, kind: Kind, deadline: float, out: Listing) -> None:
        stack: list[tuple[str, str, int]] = [(base, "", 0)]
        while stack:
            if time.monotonic() >= deadline:
                out.truncated = True
                return
            folder, rel_dir, depth = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                out.truncated = True
                continue
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                try:
                    is_dir = entry.is_dir()
                    is_link = entry.is_symlink()
                except OSError:
                    continue
                if is_dir:
                    if kind != "files":
                        out.entries.append((rel, True))
                    # A link can loop back to an ancestor or lead out of the root: never walked.
                    if entry.name in JUNK_DIRS or is_link:
                        continue
                    if max_depth == 0 or depth + 1 < max_depth:
                        stack.append((entry.path, rel, depth + 1))
                elif kind != "dirs" and entry.is_file() and (not is_link or self._inside(entry.path)):
                    out.entries.append((rel, False))

    def run(
        self, argv: list[str], max_output: int, timeout: float, on_chunk: proc.ChunkSink | None = None
    ) -> ExecResult:
        return proc.run(argv, max_output, timeout, on_chunk, cwd=self.cwd or None)


def shell_quote_join(argv: list[str]) -> str:
    """One string a POSIX shell splits back into exactly `argv`."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


_FIND_PRUNE = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIRS))


class IsolateIO(ToolIO):
    """Every operation as a command in a POSIX isolate (sh, cat, wc, mkdir, dirname, find, timeout)."""

    isolated = True

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return self.cwd + "/" + path

    def _exec(self, inner: list[str], max_output: int, combine_stderr: bool = True) -> ExecResult:
        return proc.run(self.build_argv(inner, False), max_output, ISOLATE_EXEC_TIMEOUT, None, combine_stderr)

    def _test(self, flag: str, path: str) -> bool:
        res = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.resolve(path)], 4096)
        return res.exit_code == 0 and not res.timed_out

    def is_dir(self, path: str) -> bool:
        return self._test("-d", path)

    def is_file(self, path: str) -> bool:
        return self._test("-f", path)

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out:
            return None
        try:
            return int(res.output.strip())
        except ValueError:
            return None

    def read(self, path: str) -> bytes | None:
        res = self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_MAX, combine_stderr=False)
        if res.exit_code != 0 or res.timed_out:
            return None
        return res.output.encode("utf-8")

    def write(self, path: str, content: bytes) -> bool:
        # The content goes on stdin: no argv for the far side to re-parse, no temporary file.
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        argv = self.build_argv(["sh", "-c", script, "_", self.resolve(path)], True)
        res = proc.run(argv, 4096, ISOLATE_EXEC_TIMEOUT, None, True, None, content)
        return res.exit_code == 0 and not res.timed_out

    def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        out = Listing()
        full = self.resolve(base)
        if not self.is_dir(base):
            out.err = "path does not exist or is not a directory"
            return out
        if kind == "files":
            script = 'cd "$1" && git ls-files --cached --others --exclude-standard'
            res = self._exec(["sh", "-c", script, "_", full], GIT_LS_FILES_MAX_OUTPUT)
            if res.exit_code == 0 and not res.timed_out:
                for rel in _lines(res.output, strip_dot=False):
                    if max_depth <= 0 or _depth(rel) <= max_depth:
                        out.entries.append((rel, False))
                return out
        if kind != "files":
            out.entries += [(rel, True) for rel in self._find(full, max_depth, True, out)]
        if kind != "dirs":
            out.entries += [(rel, False) for rel in self._find(full, max_depth, False, out)]
        return out

    def _find(self, base: str, max_depth: int, dirs: bool, out: Listing) -> list[str]:
        # -mindepth/-maxdepth/-prune: what busybox's find knows as well as GNU's.
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {int(max_depth)}"
        cmd += f" \\( {_FIND_PRUNE} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = self._exec(["sh", "-c", cmd, "_", base], GIT_LS_FILES_MAX_OUTPUT)
        out.truncated = out.truncated or res.timed_out
        return _lines(res.output, strip_dot=True)

    def run(
        self, argv: list[str], max_output: int, timeout: float, on_chunk: proc.ChunkSink | None = None
    ) -> ExecResult:
        # `timeout` inside the isolate: killing our client does not stop what runs over there.
        inner = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:
            # 127: what a shell reports for a command it could not run.
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return proc.run(self.build_argv(inner, True), max_output, timeout + 5, on_chunk)


def _lines(text: str, strip_dot: bool) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if not line:
            continue
        if strip_dot and line.startswith("./"):
            line = line[2:]
        out.append(line.replace("\\", "/"))
    return out


class ContainerIO(IsolateIO):
    """An already running container, through `<engine> exec` (docker and podman alike)."""

    def __init__(self, engine: str, container_id: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.engine = engine
        self.container_id = container_id

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


class SshIO(IsolateIO):
    """A remote POSIX host over ssh: remoting, not isolation (the target account can do anything)."""

    # No terminal to answer a prompt: key-based login and a host key trusted beforehand.
    SSH: ClassVar[tuple[str, ...]] = (
        "ssh",
        *("-o", "BatchMode=yes", "-o", "PasswordAuthentication=no"),
        *("-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes"),
    )

    def __init__(self, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # "--" ends ssh's options even if a target check were ever loosened.
        return [*self.SSH, *([] if needs_stdin else ["-n"]), "--", self.target, shell_quote_join(inner)]


def valid_ssh_target(target: str) -> bool:
    return bool(target) and target[0] != "-" and all(c.isascii() and (c.isalnum() or c in ".-_@") for c in target)


def valid_container_id(cid: str) -> bool:
    return (
        bool(cid)
        and cid[0].isascii()
        and cid[0].isalnum()
        and all(c.isascii() and (c.isalnum() or c in ".-_") for c in cid)
    )


ENGINES = ("docker", "podman")


def parse_container_spec(spec: str) -> tuple[str, str, bool] | None:
    """`<engine>-container:<id>` → (engine, id, True); `<engine>:<image>` → (engine, image, False)."""
    for engine in ENGINES:
        if spec.startswith(engine + "-container:"):
            return engine, spec[len(engine) + len("-container:") :], True
        if spec.startswith(engine + ":"):
            return engine, spec[len(engine) + 1 :], False
    return None


def make_io(cwd: str, runtime: str, root: str | None) -> ToolIO:
    """The IO for one call: the host (confined to `root` if set) or the named isolate."""
    if not runtime:
        return HostIO(cwd, root)
    container = parse_container_spec(runtime)
    if container is not None:
        engine, arg, attach = container
        if not attach:
            # Spawning belongs to the runtime that owns the container; a call only attaches.
            raise RuntimeRefused(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(arg):
            raise RuntimeRefused(f"invalid container id: {arg}")
        return ContainerIO(engine, arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:") :]
        if not valid_ssh_target(target):
            raise RuntimeRefused(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    # Never fall back to the host: the caller asked for an isolate.
    raise RuntimeRefused(f"unknown tool runtime: {runtime}")
