"""Template variables llama.cpp sets besides the conversation, and its one leniency in ``+``.

llama-server hands every Jinja chat template an "extra context" (``common_chat_extra_context``):
today's date as ``date_string`` ("26 Jul 2024", which Llama 3.x templates print as "Today Date")
and as ``datetime`` ("Jul 26 2024", firefunction-v2's "Today is ..."). Without them the Llama
templates fall back to the date baked into the template, and the model is told the wrong day.
Both are defaults: ``chat_template_kwargs`` may replace them, as in llama.cpp.

firefunction-v2 also reads ``functions``, the JSON text of the offered tools (Fireworks' API
fills it; older llama.cpp passed ``tools`` dumped with indent 2), so the model is shown the
tools it may call. It is set only when tools are offered; without them it stays undefined and
firefunction's ``+ functions`` adds nothing (see :func:`concat_plus`), as in llama.cpp.

Local time, like llama.cpp's ``std::localtime`` and the ``strftime_now`` global.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2


def extra_context(now: datetime, *, tools: Sequence[Any] | None) -> dict[str, Any]:
    """The variables llama.cpp adds to every render; request kwargs go over them."""
    context: dict[str, Any] = {
        "date_string": now.strftime("%d %b %Y"),
        "datetime": now.strftime("%b %d %Y"),
    }
    if tools:
        context["functions"] = json.dumps(list(tools), ensure_ascii=False, indent=2)
    return context


def _is_null(value: object) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def concat_plus(left: object, right: object) -> tuple[bool, object]:
    """llama.cpp's ``+`` rule for a string and a null: (True, the string) when it applies.

    llama.cpp's template engine treats None or an undefined variable beside a string as "" in
    ``+`` (``workaround_concat_null_with_str``), so ``suffix + "\\n" + functions`` renders where
    jinja2 would raise. Templates are tested against llama.cpp's engine, so a render that works
    there should not be a 400 here. Anything else (a number and None, two nulls) still fails.
    """
    if isinstance(left, str) and _is_null(right):
        return True, left
    if isinstance(right, str) and _is_null(left):
        return True, right
    return False, None
