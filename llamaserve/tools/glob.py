"""llama-server's glob patterns for the file tools, as a regular expression.

`*` and `?` stay within one path part, `**` crosses parts (`**/` also matches no folder,
where llama-server's matcher wants at least one), `[...]` is a character class (`!` or
`^` negates it). A pattern without `/` matches the basename at any depth; one with `/` matches
the whole relative path, anchored with `**/` unless it already starts with `**` or `/`.
Compiled once per pattern: a regular expression cannot backtrack without bound here, unlike
a naive recursive matcher on `*a*a*a*...`.
"""

from __future__ import annotations

import re
from functools import lru_cache


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")  # zero or more folders: "**/a" also matches a top-level "a"
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = i + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end >= len(pattern):
                out.append(re.escape("["))
            else:
                body = pattern[i + 1 : end]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                escaped = "".join("\\" + ch if ch in "\\]^[" else ch for ch in body)
                out.append(f"[{'^' if negate else ''}{escaped}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(_translate(pattern), re.DOTALL)
    except re.error:
        return re.compile(re.escape(pattern))


def glob_match(pattern: str, text: str) -> bool:
    return _compiled(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel_path: str) -> bool:
    """Whether a '/'-separated relative path matches an include/exclude pattern."""
    if "/" not in pattern:
        return glob_match(pattern, rel_path.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
