"""edit_file's replacement rules, as llama-server applies them.

Each `old_text` is looked up in the original content (edits do not see each other's results).
When one is not found exactly, both sides are compared after a per-line normalisation
(trailing blanks dropped, typographic quotes, dashes and spaces made ASCII), and the lines
the edits do not touch are kept byte for byte. An `old_text` found more than once (counted
on the normalised text, so a whitespace-only twin counts) or two edits that overlap are refused.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

_QUOTES = {"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'"}
_QUOTES |= {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"'}
_DASHES = {chr(c): "-" for c in range(0x2010, 0x2016)} | {"\u2212": "-"}
_SPACES = {"\u00a0": " ", "\u202f": " ", "\u205f": " ", "\u3000": " "} | {chr(c): " " for c in range(0x2002, 0x200B)}
_TABLE = str.maketrans(_QUOTES | _DASHES | _SPACES)


class EditError(Exception):
    pass


def normalize(content: str) -> str:
    """Line by line, so positions of lines stay where they were."""
    return "\n".join(line.rstrip(" \t\r").translate(_TABLE) for line in content.split("\n"))


@dataclass
class _Match:
    index: int  # which edit
    start: int  # offset in the base content
    length: int
    new_text: str


def _count(content: str, needle: str) -> int:
    count = pos = 0
    while needle and (pos := content.find(needle, pos)) != -1:
        count += 1
        pos += len(needle)
    return count


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The new content; EditError with llama-server's message when an edit cannot apply."""
    fuzzy = False
    norm_original = normalize(original)
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if normalize(old) not in norm_original:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            )
        fuzzy = True
    base = norm_original if fuzzy else original
    matches: list[_Match] = []
    for i, (old, new) in enumerate(edits):
        needle = normalize(old) if fuzzy else old
        occurrences = _count(norm_original, normalize(old))
        if occurrences > 1:
            raise EditError(f"found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be unique")
        matches.append(_Match(i, base.find(needle), len(needle), new))
    matches.sort(key=lambda m: m.start)
    for a, b in itertools.pairwise(matches):
        if a.start + a.length > b.start:
            raise EditError(
                f"edits[{a.index}] and edits[{b.index}] overlap in {path}; "
                "merge them into one edit or target disjoint regions"
            )
    result = _keep_untouched_lines(original, base, matches) if fuzzy else _replace(base, matches, 0)
    if result == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return result


def _replace(content: str, matches: list[_Match], offset: int) -> str:
    for m in reversed(matches):
        at = m.start - offset
        content = content[:at] + m.new_text + content[at + m.length :]
    return content


def _spans(content: str) -> list[tuple[int, int]]:
    spans, offset = [], 0
    for line in content.splitlines(keepends=True):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    return spans


def _line_range(spans: list[tuple[int, int]], start: int, length: int) -> tuple[int, int]:
    first = next((i for i, (a, b) in enumerate(spans) if a <= start < b), len(spans) - 1)
    last = first
    while last < len(spans) - 1 and spans[last][1] < start + length:
        last += 1
    return first, last + 1


def _keep_untouched_lines(original: str, base: str, matches: list[_Match]) -> str:
    """Replacements made in the normalised text, with every line they do not touch taken from
    the original, so a fuzzy match does not rewrite the rest of the file's whitespace."""
    original_lines = original.splitlines(keepends=True)
    spans = _spans(base)
    groups: list[tuple[int, int, list[_Match]]] = []
    for m in matches:
        first, end = _line_range(spans, m.start, m.length)
        if groups and first < groups[-1][1]:
            g_first, g_end, reps = groups[-1]
            groups[-1] = (g_first, max(g_end, end), [*reps, m])
        else:
            groups.append((first, end, [m]))
    out: list[str] = []
    line = 0
    for first, end, reps in groups:
        out += original_lines[line:first]
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], reps, lo))
        line = end
    out += original_lines[line:]
    return "".join(out)
