"""--spm-infill: the FIM prompt puts the suffix before the prefix (Suffix/Prefix/Middle)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from llamaserve.config import ServerConfig
from llamaserve.families.completions.protocol import InfillRequest
from llamaserve.families.completions.serving import infill_request
from llamaserve.serving.lora import LoraScales

PRE, SUF, MID = 1, 2, 3


class _Vocab:
    """Each character is one token (its code point + 100); the FIM tokens are 1, 2, 3."""

    n_vocab = 1000

    def fim_tokens(self) -> dict[str, int]:
        return {"pre": PRE, "suf": SUF, "mid": MID, "rep": -1, "sep": -1}

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) + 100 for c in text]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        names = {PRE: "<PRE>", SUF: "<SUF>", MID: "<MID>"}
        return "".join(names[t] if t in names else chr(t - 100) for t in tokens)


def _prompt(spm: bool) -> str:
    rt = SimpleNamespace(
        config=replace(ServerConfig(), spm_infill=spm),
        model=_Vocab(),
        n_ctx_slot=4096,
        engine=SimpleNamespace(n_slots=1),
        lora=LoraScales(),
        require_generation=lambda: None,
    )
    req = InfillRequest(input_prefix="ab", input_suffix="cd", prompt="e")
    _, text = asyncio.run(infill_request(rt, req))  # type: ignore[arg-type]
    return text


def test_prefix_suffix_middle_by_default() -> None:
    assert _prompt(False) == "<PRE>ab<SUF>cd<MID>e"


def test_spm_infill_puts_the_suffix_first() -> None:
    assert _prompt(True) == "<SUF>cd<PRE>ab<MID>e"
