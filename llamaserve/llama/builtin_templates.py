"""llama.cpp's built-in chat templates (``llama3``, ``gemma``, ``mistral-v7``, ...).

llama.cpp hard-codes these in C++ (``src/llama-chat.cpp``) and renders them with
``llama_chat_apply_template``: plain role/content pairs in, a prompt out. We call that
function rather than re-writing the formats, so the prompt is byte for byte what
``llama-server --no-jinja --chat-template NAME`` builds.

The functions here know only strings; turning OpenAI messages into role/content pairs is
``chat/builtin_template.py``'s job.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

import llama_cpp.llama_cpp as C


class BuiltinTemplateError(ValueError):
    """llama.cpp refused to render (an unknown name, or a result it could not copy out)."""


@cache
def builtin_template_names() -> tuple[str, ...]:
    """Every name llama.cpp accepts as a built-in template, in its own (sorted) order."""
    # The first call with no room only reports the count; the second fills the array with
    # pointers to llama.cpp's static strings, which stay valid for the process's lifetime.
    count = C.llama_chat_builtin_templates(None, 0)
    if count <= 0:
        return ()
    names = (ctypes.c_char_p * count)()
    C.llama_chat_builtin_templates(names, count)
    return tuple(name.decode() for name in names if name)


def render_builtin(name: str, turns: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
    """The prompt llama.cpp's built-in template ``name`` makes of ``(role, content)`` turns.

    Text after a NUL in a role or content is lost, as in llama-server: llama.cpp reads them as
    C strings.
    """
    encoded = [(role.encode(), content.encode()) for role, content in turns]
    chat = (C.llama_chat_message * max(len(encoded), 1))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role = role
        chat[i].content = content
    # llama-server's first guess: the text plus a quarter for the markers. The call returns the
    # size it needs, so a guess too small costs one more call, never a truncated prompt.
    size = sum(len(r) + len(c) for r, c in encoded)
    size = max(size + size // 4, 256)
    template = name.encode()
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        needed = C.llama_chat_apply_template(template, chat, len(encoded), add_generation_prompt, buf, size)
        if needed < 0:
            raise BuiltinTemplateError(f"llama.cpp has no built-in chat template named {name!r}")
        if needed <= size:
            return buf.raw[:needed].decode("utf-8", errors="replace")
        size = needed
    raise BuiltinTemplateError(f"llama.cpp's {name!r} template gave a prompt of changing size")
