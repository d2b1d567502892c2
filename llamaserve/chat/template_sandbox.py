"""The Jinja sandbox that chat templates run in, and the one error type that leaves it.

`template.py` compiles every template in `SANDBOX` and turns whatever a render raises into a
`TemplateError` (`render_error`). The sandbox differs from jinja's stock immutable one in three
ways (`_TemplateSandbox`): an unsafe attribute raises at once, lists may be appended to and
popped from, and a string `+` None/undefined is the string, as in llama.cpp's engine; and it
offers the globals and filters real templates call (`raise_exception`, `strftime_now`, HF's
`tojson`, llama.cpp's `from_json`, the `{% generation %}` tag).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Final, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.sandbox
from jinja2.exceptions import SecurityError

from llamaserve.chat.template_context import concat_plus


class TemplateError(Exception):
    """Rendering or compiling a chat template failed; the message is fit to show a client.

    ``raised_by_template`` is True when the template itself refused the conversation through
    ``raise_exception(...)`` ("System role not supported", "roles must alternate"): the message
    is then the template author's own words, passed through unchanged, because that is what
    tells the user how to fix the request.
    """

    def __init__(self, message: str, *, raised_by_template: bool = False) -> None:
        super().__init__(message)
        self.message: str = message
        self.raised_by_template: bool = raised_by_template


# ---------------------------------------------------------------------------------------------
# Globals and filters that real templates call
# ---------------------------------------------------------------------------------------------


def _raise_exception(message: object = "") -> NoReturn:
    # HF transformers exposes ``raise_exception`` to templates; templates use it to reject
    # conversations they cannot format. We raise our own type straight through jinja (jinja does
    # not wrap exceptions raised by called functions) so render() can tell a deliberate refusal
    # from a template bug.
    raise TemplateError(str(message), raised_by_template=True)


def _strftime_now(fmt: str) -> str:
    # Local time, like llama.cpp and HF transformers; templates use it for "Today's date".
    return datetime.now().strftime(fmt)


def _json_default(value: object) -> object:
    # ``tool.function.parameters | tojson`` on a tool that left out ``parameters`` hands us a
    # jinja Undefined. Serialising it as null keeps the prompt well-formed instead of failing the
    # request over an optional field.
    if isinstance(value, jinja2.Undefined):
        return None
    # ``tools | map(attribute='function') | tojson`` (llama.cpp's DeepSeek R1 template) hands us
    # a generator: jinja's map/select filters are lazy in Python but lists in llama.cpp's engine.
    if isinstance(value, Iterator):
        return list(value)
    # Anything else unserialisable is a real error.
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | list[str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in ``tojson`` HTML-escapes ``<``, ``>``, ``&`` and ``'`` (it is meant for
    # embedding JSON in web pages) and accepts only ``indent``. Model templates are written for
    # HF transformers' replacement, which is plain ``json.dumps`` with ``ensure_ascii=False`` by
    # default and the ``indent`` / ``separators`` / ``sort_keys`` keywords; tool schemas rendered
    # any other way would not match what the model was trained on.
    seps = tuple(separators) if separators is not None else None
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=seps,  # type: ignore[arg-type]  # json.dumps wants exactly a 2-tuple
        sort_keys=sort_keys,
        default=_json_default,
    )


def _from_json(value: str) -> Any:
    # DeepSeek V3.2/V4 templates do ``args | from_json`` when tool-call arguments arrive as a
    # string; llama.cpp's template engine provides that filter, jinja2 does not.
    return json.loads(value)


def _finalize(value: object) -> object:
    # ``{{ message.content }}`` on a tool-call-only assistant message (content null) would print
    # the Python string "None" into the prompt. No template means that, so None prints as "".
    return "" if value is None else value


class _GenerationTagExtension(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` and render the body unchanged.

    HF transformers added this tag to mark assistant tokens for training masks; some current
    templates (LFM2.5, poolside Laguna) contain it, and plain jinja2 would refuse to compile
    them. For inference the marking means nothing, so the body renders as if the tag were absent.
    """

    tags = {"generation"}  # noqa: RUF012  (jinja declares it as a plain set attribute)

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the ``generation`` name token
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# List methods a template may call although the environment is "immutable". Kimi-K2 templates
# keep a queue of tool-call ids with ``ns.ids.append(x)`` / ``ns.ids.pop(0)``, which the strict
# immutable sandbox refuses, so those conversations would fail. Allowing them is safe here
# because nothing a template can reach is shared: render() hands it deep copies of the messages,
# tools and kwargs, the globals are functions, and any other list was created by the template
# during this render. Dict mutation stays blocked (no template in the test corpus needs it).
_ALLOWED_LIST_MUTATORS: Final[frozenset[str]] = frozenset({"append", "extend", "insert", "pop"})


class _TemplateSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, relaxed only for the list methods named above, and strict about
    unsafe attribute access: it raises at once instead of yielding an Undefined."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # The stock sandbox returns an Undefined that only fails when used further, so
        # ``{{ lipsum.__globals__ }}`` quietly renders "". No chat template has a legitimate
        # reason to touch ``__globals__``/``__class__``/..., so a template that tries is treated
        # as broken or hostile and the request fails with a clear message.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    # ``+`` goes through call_binop so a string plus None/undefined renders as llama.cpp's
    # engine renders it (see template_context.concat_plus) instead of failing the request.
    intercepted_binops = frozenset({"+"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            applies, joined = concat_plus(left, right)
            if applies:
                return joined
        return super().call_binop(context, operator, left, right)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in _ALLOWED_LIST_MUTATORS:
            # Skip the immutability check but keep every other sandbox rule.
            return jinja2.sandbox.SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)


def _make_environment() -> jinja2.Environment:
    # trim_blocks/lstrip_blocks match HF transformers' settings: templates are formatted
    # assuming them, and a stray newline changes the prompt the model sees.
    env = _TemplateSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTagExtension],
        finalize=_finalize,
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    env.filters["from_json"] = _from_json
    return env


# One environment serves every template: it holds no per-template state, and jinja's compiled
# templates are safe to render from several threads at once.
SANDBOX: Final[jinja2.Environment] = _make_environment()


def _template_line(exc: BaseException) -> int | None:
    # jinja rewrites tracebacks so frames inside a template carry the template's own line
    # numbers under the file name "<template>"; the innermost such frame is where it failed.
    line: int | None = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == "<template>":
            line = frame.lineno
    return line


def render_error(exc: Exception) -> TemplateError:
    """Whatever a template's compile or render raised, as the TemplateError a client is shown."""
    if isinstance(exc, TemplateError):
        return exc
    where = _template_line(exc)
    at = f" at line {where}" if where is not None else ""
    if isinstance(exc, SecurityError):
        return TemplateError(f"chat template tried an unsafe operation{at}: {exc}")
    # UndefinedError, TypeError, KeyError, ZeroDivisionError, ...: a template written for other
    # inputs, or a broken one. The type name helps whoever debugs it; the server sends a 400.
    return TemplateError(f"chat template failed to render{at}: {type(exc).__name__}: {exc}")
