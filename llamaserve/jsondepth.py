"""How deep lists and dicts nest, measured without recursion (a leaf module: imports nothing of ours)."""

from __future__ import annotations

from typing import Any


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether lists and dicts in `value` nest deeper than `limit` levels (walked with a stack)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
