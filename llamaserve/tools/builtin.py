"""llama-server's seven built-in tools: their schemas and what each call answers.

Answers are llama-server's: `plain_text_response` is what the model reads, `entries`/`base`
feed the UI's folder picker, and a failure the model should hear about is `{"error": ...}`
with status 200. Each runs in a worker thread through the call's `ToolIO` (host or isolate).
"""

from __future__ import annotations

import base64
import os
import time
from typing import Any

import regex

from llamaserve.tools.base import JSON, Call, ParamError, Tool, function
from llamaserve.tools.edit import EditError, apply_edits
from llamaserve.tools.fileio import Kind, PathRefused
from llamaserve.tools.glob import path_glob_match
from llamaserve.tools.proc import ChunkSink

READ_MAX = 16 * 1024
READ_MAX_BASE64 = 32 * 1024 * 1024
SEARCH_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100
GREP_TIMEOUT = 10.0  # seconds of regular-expression matching per search
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60
GET_INFO_MAX_OUTPUT = 4096
GET_INFO_TIMEOUT = 5


def _lines(text: str) -> list[str]:
    """Lines as std::getline yields them: no empty last line after a final newline."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return parts


def _int(params: JSON, name: str, default: int) -> int:
    value = params.get(name, default)
    return int(value)


class ReadFile(Tool):
    name = "read_file"
    display_name = "Read file"
    uses_cwd = True

    def definition(self) -> JSON:
        return function(
            self.name,
            "Read the contents of a file. Optionally specify a 1-based line range. "
            'If append_loc is true, each line is prefixed with its line number (e.g. "1\u2192...").',
            {
                "path": {"type": "string", "description": "Path to the file"},
                "start_line": {"type": "integer", "description": "First line to read, 1-based (default: 1)"},
                "end_line": {
                    "type": "integer",
                    "description": "Last line to read, 1-based inclusive (default: end of file)",
                },
                "append_loc": {"type": "boolean", "description": "Prefix each line with its line number"},
            },
            ["path"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        p = call.params
        path: str = p["path"]
        start, end = _int(p, "start_line", 1), _int(p, "end_line", -1)
        append_loc = bool(p.get("append_loc", False))
        io = call.io()
        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if call.resp_type == "base64":
            if size > READ_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
            data = io.read(path)
            if data is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
        if size > READ_MAX and end == -1:
            return {
                "error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."
            }
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        out: list[str] = []
        used = 0
        for lineno, line in enumerate(_lines(data.decode("utf-8", "replace")), 1):
            if lineno < start:
                continue
            if end != -1 and lineno > end:
                break
            piece = f"{lineno}\u2192{line}\n" if append_loc else line + "\n"
            if used + len(piece.encode()) > READ_MAX:
                out.append("[output truncated]")
                break
            out.append(piece)
            used += len(piece.encode())
        return {"plain_text_response": "".join(out)}


_KINDS: dict[str, Kind] = {"file": "files", "dir": "dirs", "all": "all"}


class FileGlobSearch(Tool):
    name = "file_glob_search"
    display_name = "File search"
    uses_cwd = True

    def definition(self) -> JSON:
        return function(
            self.name,
            "Recursively search for files matching a glob pattern under a directory. "
            "Skips files ignored by .gitignore (inside a git repository) and common junk directories "
            "(.git, node_modules, build, dist, ...). A pattern with no '/' (e.g. \"*.cpp\") matches the basename "
            "at any depth; a pattern with '/' matches the whole relative path, prefixed with \"**/\" unless it "
            'starts with "**/" or \'/\'. type="dir" or "all" also lists directories (suffixed with \'/\' in the '
            "output; directory listings ignore .gitignore).",
            {
                "path": {"type": "string", "description": "Base directory to search in"},
                "include": {
                    "type": "string",
                    "description": 'Glob pattern for files to include (e.g. "*.cpp" or "src/**/*.cpp"). Default: **',
                },
                "exclude": {"type": "string", "description": "Glob pattern for files to exclude"},
                "type": {"type": "string", "description": 'Entry type to return: "file" (default), "dir" or "all"'},
                "max_depth": {
                    "type": "integer",
                    "description": "Maximum depth to descend into subdirectories "
                    "(default: 0 = unlimited; 1 = direct children only)",
                },
                "limit": {
                    "type": "integer",
                    "description": f"Maximum number of results to return, capped at {SEARCH_MAX_RESULTS} "
                    f"(default {SEARCH_MAX_RESULTS})",
                },
            },
            ["path"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        p = call.params
        io = call.io()
        path: str = p["path"]
        base = io.resolve(path)
        include: str = p.get("include", "**")
        exclude: str = p.get("exclude", "")
        kind_name: str = p.get("type", "file")
        max_depth = max(0, _int(p, "max_depth", 0))
        limit_req = _int(p, "limit", SEARCH_MAX_RESULTS)
        if limit_req < 1:
            return {"error": f"invalid limit: {limit_req} (expected 1 or more)"}
        limit = min(limit_req, SEARCH_MAX_RESULTS)
        kind = _KINDS.get(kind_name)
        if kind is None:
            return {"error": f'invalid type: {kind_name} (expected "file", "dir" or "all")'}
        listing = io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches = [
            (rel, is_dir)
            for rel, is_dir in listing.entries
            if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))
        ]
        shown = matches[:limit]
        text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (
                f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                "Refine the glob pattern to narrow the search.]\n"
            )
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        entries = [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]
        return {"plain_text_response": text, "entries": entries, "base": base}


class GrepSearch(Tool):
    name = "grep_search"
    display_name = "Grep search"
    uses_cwd = True

    def definition(self) -> JSON:
        return function(
            self.name,
            "Search for a pattern in files under a path. Returns matching lines with file paths "
            "(relative to the given directory unless searching a single file). Skips files ignored by "
            ".gitignore (inside a git repository) and common junk directories (.git, node_modules, build, dist, "
            "...). include/exclude: a pattern with no '/' matches the basename at any depth; one with '/' matches "
            'the whole relative path (anchored with "**/" unless it already is).',
            {
                "path": {"type": "string", "description": "File or directory to search in"},
                "pattern": {
                    "type": "string",
                    "description": "Pattern to search for (regular expression unless literal is true)",
                },
                "include": {"type": "string", "description": "Glob pattern to filter files (default: **)"},
                "exclude": {"type": "string", "description": "Glob pattern to exclude files"},
                "return_line_numbers": {"type": "boolean", "description": "If true, include line numbers in results"},
                "literal": {
                    "type": "boolean",
                    "description": "Treat pattern as a literal string instead of a regular expression (default: false)",
                },
                "ignore_case": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
                "context_lines": {
                    "type": "integer",
                    "description": "Number of lines of context to show before and after each match (default: 0)",
                },
            },
            ["path", "pattern"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        p = call.params
        path: str = p["path"]
        source: str = p["pattern"]
        include: str = p.get("include", "**")
        exclude: str = p.get("exclude", "")
        show_num = bool(p.get("return_line_numbers", False))
        ctx = max(0, _int(p, "context_lines", 0))
        if p.get("literal", False):
            source = regex.escape(source)
        try:
            pattern = regex.compile(source, regex.IGNORECASE if p.get("ignore_case", False) else 0)
        except regex.error as exc:
            return {"error": f"invalid regex: {exc}"}
        # A pattern such as (a+)+$ can take exponential time on one line: the whole search
        # has a budget, which `regex` (unlike `re`) can enforce inside a match.
        deadline = time.monotonic() + GREP_TIMEOUT
        io = call.io()
        full = io.resolve(path)
        files: list[tuple[str, str]] = []
        if io.is_file(full):
            files.append((full, path))
        elif io.is_dir(full):
            listing = io.list_entries(full, 0, "files")
            if listing.err:
                return {"error": f"{listing.err}: {path}"}
            for rel, _ in listing.entries:
                if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel)):
                    files.append((full.rstrip("/") + "/" + rel, rel))
        else:
            return {"error": f"path does not exist: {path}"}
        show_num = show_num or ctx > 0
        out: list[str] = []
        total = 0
        limit_reached = False
        for fpath, shown in files:
            if limit_reached:
                break
            try:
                data = io.read(fpath)
            except PathRefused:
                continue
            if data is None:
                continue
            lines = _lines(data.decode("utf-8", "replace"))
            for i, line in enumerate(lines):
                if total >= GREP_MAX_RESULTS:
                    limit_reached = True
                    break
                try:
                    found = pattern.search(line, timeout=max(0.001, deadline - time.monotonic()))
                except TimeoutError:
                    return {"error": f"grep_search timed out after {GREP_TIMEOUT:g} s: simplify the pattern"}
                if not found:
                    continue
                lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx else (i, i)
                for j in range(lo, hi + 1):
                    mark = ":" if j == i else "-"
                    out.append(f"{shown}{mark}{f'{j + 1}{mark}' if show_num else ''}{lines[j]}\n")
                if ctx:
                    out.append("--\n")
                total += 1
        text = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if limit_reached:
            text += f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
        return {"plain_text_response": text}


class ExecShellCommand(Tool):
    name = "exec_shell_command"
    display_name = "Execute shell command"
    uses_cwd = True
    permission_write = True
    support_stream = True

    def definition(self) -> JSON:
        return function(
            self.name,
            "Execute a shell command and return its output (stdout and stderr combined).",
            {
                "command": {"type": "string", "description": "Shell command to execute"},
                "timeout": {
                    "type": "integer",
                    "description": f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})",
                },
                "max_output_size": {
                    "type": "integer",
                    "description": f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})",
                },
            },
            ["command"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        p = call.params
        timeout = min(max(1, _int(p, "timeout", 10)), EXEC_MAX_TIMEOUT)
        max_output = min(max(1, _int(p, "max_output_size", EXEC_MAX_OUTPUT)), EXEC_MAX_OUTPUT)
        io = call.io()
        res = io.run(["sh", "-c", p["command"]], max_output, timeout, sink)
        tail = f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
        if sink is not None:
            sink(tail)
            return {}
        return {"plain_text_response": res.output + tail}


class WriteFile(Tool):
    name = "write_file"
    display_name = "Write file"
    uses_cwd = True
    permission_write = True

    def definition(self) -> JSON:
        return function(
            self.name,
            "Write content to a file, creating it (and its parent directories) if it does not exist. "
            "May use with edit_file for more complex edits.",
            {
                "path": {"type": "string", "description": "Path of the file to write"},
                "content": {"type": "string", "description": "Content to write"},
            },
            ["path", "content"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        path: str = call.params["path"]
        content = call.params["content"].encode("utf-8")
        if not call.io().write(path, content):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(content)}


class EditFile(Tool):
    name = "edit_file"
    display_name = "Edit file"
    uses_cwd = True
    permission_write = True

    def definition(self) -> JSON:
        item = {
            "type": "object",
            "properties": {
                "old_text": {
                    "type": "string",
                    "description": "Exact text to find; must be unique in the file and must not overlap "
                    "with other edits",
                },
                "new_text": {"type": "string", "description": "Text to replace old_text with"},
            },
            "required": ["old_text", "new_text"],
        }
        return function(
            self.name,
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is "
            "matched against the original content, not incrementally. Merge nearby changes into one edit instead "
            "of overlapping edits. Use write_file to replace the whole file.",
            {
                "path": {"type": "string", "description": "Path to the file to edit"},
                "edits": {
                    "type": "array",
                    "description": "One or more exact text replacements to apply",
                    "items": item,
                },
            },
            ["path", "edits"],
        )

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        path: str = call.params["path"]
        raw: list[Any] = call.params["edits"]
        if not raw:
            raise ParamError("edits", "must be a non-empty array")
        edits = [(e["old_text"], e["new_text"]) for e in raw]
        for i, (old, _) in enumerate(edits):
            if not old:
                raise ParamError(f"edits[{i}].old_text", "must not be empty")
        io = call.io()
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        try:
            new = apply_edits(data.decode("utf-8", "replace"), edits, path)
        except EditError as exc:
            return {"error": str(exc)}
        if not io.write(path, new.encode("utf-8")):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


class GetInfo(Tool):
    name = "get_info"
    display_name = "Get Runtime Info"
    uses_cwd = True

    def definition(self) -> JSON:
        return function(self.name, "Returns runtime info: the OS name/version and the current working directory", {})

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        io = call.io()
        res = io.run(["uname", "-a"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = io.cwd
        if not cwd:
            if not io.isolated:
                cwd = os.getcwd()
            else:
                pwd = io.run(["pwd"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT)
                cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}


def builtin_tools() -> list[Tool]:
    """In llama-server's order; only minimal I/O and shell tools belong here (the rest is MCP's)."""
    return [ReadFile(), FileGlobSearch(), GrepSearch(), ExecShellCommand(), WriteFile(), EditFile(), GetInfo()]
