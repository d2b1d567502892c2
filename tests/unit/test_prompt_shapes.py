"""llama-server's prompt and embedding-input shapes, read without a model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from llamaserve.errors import APIError
from llamaserve.families.embeddings.serving import _inputs
from llamaserve.serving.params import prompt_tokens, split_prompts


class Vocab:
    """One token per character; BOS is 1."""

    n_vocab = 1000
    bos = 1

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return ([1] if add_special else []) + [ord(c) for c in text]

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab


def test_split_prompts_follows_llama_servers_rule() -> None:
    assert split_prompts("a") == ["a"]
    assert split_prompts([1, "a", 2]) == [[1, "a", 2]]  # holds a token id: one mixed prompt
    assert split_prompts(["a", {"prompt_string": "b"}, [1]]) == ["a", {"prompt_string": "b"}, [1]]
    with pytest.raises(APIError, match="must not be empty"):
        split_prompts([])


def test_prompt_objects_and_mixes() -> None:
    v: Any = Vocab()
    assert prompt_tokens(v, {"prompt_string": "ab"}) == [1, 97, 98]
    assert prompt_tokens(v, [5, "a"]) == [5, 97]  # BOS only before a leading string
    with pytest.raises(APIError, match="multimodal"):
        prompt_tokens(v, {"prompt_string": "a", "multimodal_data": ["AAAA"]})
    with pytest.raises(APIError):
        prompt_tokens(v, {"other": 1})


def test_embedding_inputs_take_mixed_and_content_forms() -> None:
    rt: Any = SimpleNamespace(model=Vocab(), media=None)

    def inputs(raw: Any) -> list[list[int]]:
        return asyncio.run(_inputs(rt, raw))

    parts = {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert inputs(parts) == inputs("ab")  # the parts are the string, joined
    assert len(inputs(["x", [5, 6], {"prompt_string": "y"}, parts])) == 4
    assert inputs([5, "a"]) == [[5, 97]]
    for bad in ([], {"content": "a"}, {"content": [{"type": "unknown"}]}, {"content": [{"type": "image_url"}]}):
        with pytest.raises(APIError):
            inputs(bad)
