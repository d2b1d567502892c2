"""GBNF grammars parsed by llama.cpp against a vocabulary: the grammar sampler, and a check."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

from llamaserve.engine.sampling import GrammarError


def grammar_sampler(vocab: object, grammar: str, triggers: tuple[str, ...] = ()) -> object:
    """A grammar sampler, or GrammarError. Lazy when trigger patterns are given."""
    if triggers:
        patterns = [t.encode() for t in triggers]
        arr = (ctypes.c_char_p * len(patterns))(*patterns)
        handle = C.llama_sampler_init_grammar_lazy_patterns(
            vocab, grammar.encode(), b"root", arr, len(patterns), None, 0
        )
    else:
        handle = C.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not handle:
        raise GrammarError("failed to parse grammar")
    return handle


def check_grammar(vocab: object, grammar: str, triggers: tuple[str, ...] = ()) -> None:
    """Parse a grammar with llama.cpp once, so a bad one is a 400 before it reaches a slot."""
    C.llama_sampler_free(grammar_sampler(vocab, grammar, triggers))
