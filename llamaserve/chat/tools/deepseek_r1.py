"""DeepSeek R1 (and its Llama / Qwen distills):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The ``<think>`` reasoning in front is the reasoning splitter's job. See ``_deepseek``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import _deepseek as ds
from ._base import Ctx, Gen, blocks_in_content
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls


class DeepSeekR1Format(ToolFormat):
    name = "deepseek_r1"
    triggers = (regex_escape(ds.CALLS_BEGIN[0]), regex_escape(ds.CALL_BEGIN[0]))

    def run(self, ctx: Ctx) -> Gen:
        yield from blocks_in_content(ctx, ds.OPENERS, lambda opener: ds.block(ctx, opener))

    def call_rule(self, name: str, args: str) -> str:
        return (
            f"{lit(ds.CALL_BEGIN[0] + 'function' + ds.SEP[0] + name + chr(10) + '```json' + chr(10))} "
            f"{args} {SP} {lit('```' + ds.CALL_END[0])}"
        )

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        calls_ = [g.add(f"call-{i}", self.call_rule(n, a)) for i, (n, a) in enumerate(rules)]
        calls = repeat_calls(g.add("call", alt(calls_)), parallel, SP)
        begin, end = lit(ds.CALLS_BEGIN[0]), lit(ds.CALLS_END[0])
        if lazy:
            return f"({begin} {SP})? {calls} ({SP} {end})? {SP}"
        return f"{SP} {begin} {SP} {calls} {SP} {end} {SP}"
