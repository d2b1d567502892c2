"""GBNF grammars parsed by llama.cpp against a vocabulary: the grammar sampler, and a check."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

from llamaserve.engine.sampling import GrammarError


def grammar_sampler(
    vocab: object, grammar: str, triggers: tuple[str, ...] = (), trigger_tokens: tuple[int, ...] = ()
) -> object:
    """A grammar sampler, or GrammarError. Lazy when trigger patterns or tokens are given.

    llama.cpp compiles each pattern with std::regex and does not catch what that throws:
    a pattern it rejects ends the process. Only patterns we built, or that passed
    `grammar.patterns.trigger_pattern_problem`, may come here."""
    if triggers or trigger_tokens:
        patterns = [t.encode() for t in triggers]
        arr = (ctypes.c_char_p * len(patterns))(*patterns)
        tokens = (C.llama_token * len(trigger_tokens))(*trigger_tokens)
        handle = C.llama_sampler_init_grammar_lazy_patterns(
            vocab, grammar.encode(), b"root", arr, len(patterns), tokens, len(trigger_tokens)
        )
    else:
        handle = C.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not handle:
        raise GrammarError("failed to parse grammar")
    return handle


def check_grammar(vocab: object, grammar: str, triggers: tuple[str, ...] = ()) -> None:
    """Parse a grammar with llama.cpp once, so a bad one is a 400 before it reaches a slot."""
    C.llama_sampler_free(grammar_sampler(vocab, grammar, triggers))
