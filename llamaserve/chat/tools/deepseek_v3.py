"""DeepSeek V3.1 (hybrid thinking):

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

See ``_deepseek`` (the R1 shape is accepted too).
"""

from __future__ import annotations

from . import _deepseek as ds
from ._grammar import lit
from .deepseek_r1 import DeepSeekR1Format


class DeepSeekV3Format(DeepSeekR1Format):
    name = "deepseek_v3"

    def call_rule(self, name: str, args: str) -> str:
        return f"{lit(ds.CALL_BEGIN[0] + name + ds.SEP[0])} {args} {lit(ds.CALL_END[0])}"
