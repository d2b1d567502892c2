"""Hypothesis strategies for bad (and some good) request bodies, from our request models' fields.

Bodies are bytes: JSON objects whose keys come from the fields our protocol
models declare (plus unknown ones) with values of any JSON type, and raw
texts that are not what a route expects: invalid UTF-8, duplicate keys,
nesting thousands of levels deep, huge strings and arrays. Generation
budgets in an otherwise valid body are capped so the run stays short.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from hypothesis import strategies as st
from pydantic import BaseModel

from llamaserve.families.anthropic import protocol as anthropic
from llamaserve.families.batches import protocol as batches
from llamaserve.families.chat import protocol as chat
from llamaserve.families.completions import protocol as completions
from llamaserve.families.embeddings import protocol as embeddings
from llamaserve.families.native import protocol as native
from llamaserve.families.responses import protocol as responses
from llamaserve.protocol import common

_BUDGET_KEYS = ("n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens")


def declared_fields() -> list[str]:
    """Every field name our request models declare."""
    names: set[str] = set()
    for module in (anthropic, batches, common, chat, completions, embeddings, native, responses):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseModel) and cls.__module__ == module.__name__:
                names.update(cls.model_fields)
    return sorted(names)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=24)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _capped(body: dict[str, Any]) -> bytes:
    for key in _BUDGET_KEYS:
        value = body.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value > 8:
            body[key] = 4  # a valid body must not generate for long
    return json.dumps(body).encode()


objects = st.dictionaries(st.sampled_from(declared_fields()) | st.text(max_size=10), json_values, max_size=6).map(
    _capped
)
raw_texts = st.one_of(
    st.binary(max_size=64),  # invalid UTF-8 and other garbage
    st.sampled_from([b"", b"null", b"[]", b'"text"', b"{", b'{"prompt": "a", "prompt": 5, "n_predict": 1}']),
    st.integers(min_value=129, max_value=5000).map(lambda d: b'{"messages": ' + b"[" * d + b"]" * d + b"}"),
    st.integers(min_value=129, max_value=5000).map(lambda d: b'{"input": ' + b'{"a":' * d + b"1" + b"}" * d + b"}"),
    st.integers(min_value=10_000, max_value=300_000).map(lambda n: b'{"prompt": "' + b"x" * n + b'", "n_predict": 1}'),
    st.integers(min_value=1_000, max_value=50_000).map(
        lambda n: b'{"input": [' + b",".join([b'"a"'] * n) + b'], "max_tokens": 1}'
    ),
    st.text(max_size=40).map(lambda s: json.dumps({"messages": [{"role": s, "content": s}], "max_tokens": 2}).encode()),
)
bodies = st.one_of(objects, raw_texts)
