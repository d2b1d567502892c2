"""llama-server's glob patterns for the file tools, as a regular expression.

`*` and `?` stay within one path part, `**` crosses parts (`**/` also matches no folder,
where llama-server's matcher wants at least one), `[...]` is a character class (`!` or
`^` negates it). A pattern without `/` matches the basename at any depth; one with `/` matches
the whole relative path, anchored with `**/` unless it already starts with `**` or `/`.
A pattern with few stars becomes a regular expression (fast over long listings); one with many
goes to a table-driven matcher, linear in pattern times path, because a backtracking regular
expression (or llama-server's recursive matcher) takes exponential time on `*a*a*a*...b`.
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


_MAX_REGEX_STARS = 4


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    """The regular expression, or None where backtracking could explode."""
    pattern = re.sub(r"\*{3,}", "**", pattern)
    if pattern.count("*") - 2 * pattern.count("**") + pattern.count("**") > _MAX_REGEX_STARS:
        return None
    try:
        return re.compile(_translate(pattern), re.DOTALL)
    except re.error:
        return re.compile(re.escape(pattern))


def glob_match(pattern: str, text: str) -> bool:
    compiled = _compiled(pattern)
    if compiled is None:
        return _table_match(_tokens(pattern), text)
    return compiled.fullmatch(text) is not None


Token = tuple[str, str]  # (kind, text): lit, one, star, any, dirs, class


@lru_cache(maxsize=256)
def _tokens(pattern: str) -> tuple[Token, ...]:
    out: list[Token] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append(("dirs", ""))
            i += 3
        elif pattern.startswith("**", i):
            out.append(("any", ""))
            i += 2
        elif pattern[i] == "*":
            if not out or out[-1][0] != "star":
                out.append(("star", ""))
            i += 1
        elif pattern[i] == "?":
            out.append(("one", ""))
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + (2 if pattern[i + 1 : i + 2] in "]-" else 1))) > 0:
            out.append(("class", _translate(pattern[i : end + 1])))
            i = end + 1
        else:
            out.append(("lit", pattern[i]))
            i += 1
    return tuple(out)


def _table_match(tokens: tuple[Token, ...], text: str) -> bool:
    """matches[j]: tokens[i:] match text[j:], filled from the last token back."""
    n = len(text)
    after = [j == n for j in range(n + 1)]  # the empty pattern matches only the empty rest
    for kind, arg in reversed(tokens):
        here = [False] * (n + 1)
        slash_then = False  # "dirs": some later '/' ends a run of folders after which the rest matches
        for j in range(n, -1, -1):
            if kind == "lit":
                here[j] = j < n and text[j] == arg and after[j + 1]
            elif kind == "one":
                here[j] = j < n and text[j] != "/" and after[j + 1]
            elif kind == "class":
                here[j] = j < n and re.fullmatch(arg, text[j]) is not None and after[j + 1]
            elif kind == "star":
                here[j] = after[j] or (j < n and text[j] != "/" and here[j + 1])
            elif kind == "any":
                here[j] = after[j] or (j < n and here[j + 1])
            else:  # dirs
                if j < n and text[j] == "/" and after[j + 1]:
                    slash_then = True
                here[j] = after[j] or slash_then
        after = here
    return after[0]


def path_glob_match(pattern: str, rel_path: str) -> bool:
    """Whether a '/'-separated relative path matches an include/exclude pattern."""
    if "/" not in pattern:
        return glob_match(pattern, rel_path.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
