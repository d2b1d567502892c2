"""Decode rows and prompt chunks go to llama.cpp apart when together they would fill an attention tile.

`split_decode_rows` decides; `LlamaRunner` decodes each group and samples it before the next
one overwrites the logits. A split step must answer exactly what one decode would have.
"""

from __future__ import annotations

import pytest

from llamaserve.engine.runner import PlanRow
from llamaserve.engine.sampling import SamplingParams
from llamaserve.llama.context import CPU_FA_TILE_ROWS, Context, ContextSettings
from llamaserve.llama.model import Model
from llamaserve.llama.runner import LlamaRunner, split_decode_rows
from tests.llama_logs import silenced_llama_logs


def rows(*lengths: int) -> list[PlanRow]:
    return [PlanRow(seq_id=i, tokens=[1] * n, start_pos=10) for i, n in enumerate(lengths)]


@pytest.mark.parametrize(
    ("lengths", "split"),
    [
        ((1,) * 16 + (48,), (list(range(16)), [16])),  # 64 rows: the decode rows go first, alone
        ((1, 40, 1, 30), ([0, 2], [1, 3])),  # two prompt chunks stay together
        ((1,) * 16 + (47,), None),  # 63 rows: row by row anyway
        ((1, 63), None),  # one decode row shares its tile with one prompt only
        ((1,) * 70, None),  # decode rows only
        ((200,), None),
    ],
)
def test_split_decode_rows(lengths: tuple[int, ...], split: tuple[list[int], list[int]] | None) -> None:
    assert split_decode_rows(rows(*lengths), CPU_FA_TILE_ROWS) == split


def test_no_tile_means_one_batch() -> None:
    assert split_decode_rows(rows(*(1,) * 16, 48), 0) is None


def runner_on(model: Model, tile_rows: int) -> LlamaRunner:
    settings = ContextSettings(
        n_ctx=1024, n_batch=256, n_ubatch=256, n_seq_max=4, n_threads=2, n_threads_batch=2, kv_unified=True
    )
    with silenced_llama_logs():
        context = Context(model, settings)
    return LlamaRunner(model, context, attention_tile_rows=tile_rows)


def test_a_split_step_samples_what_one_decode_does(model: Model) -> None:
    openings = ["The capital of France is", "One, two, three, four,", "def fibonacci(n):"]
    document = model.tokenize(" ".join(f"Item {i} is on shelf {i % 7}." for i in range(12)), add_special=False)
    greedy = SamplingParams(temperature=0.0)
    answers = []
    for tile_rows in (CPU_FA_TILE_ROWS, 0):
        runner = runner_on(model, tile_rows)
        try:
            prompts = [model.tokenize(text) for text in openings]
            for seq, prompt in enumerate(prompts):  # three conversations, prefilled up to their last token
                assert runner.context.decode([(t, i, seq, False) for i, t in enumerate(prompt[:-1])]) == 0
            plan = [
                PlanRow(seq, [prompt[-1]], len(prompt) - 1, [runner.new_sampler(greedy)])
                for seq, prompt in enumerate(prompts)
            ]
            # A new prompt joins the step: 3 decode rows + the document make more than a tile.
            plan.append(PlanRow(3, document, 0, [runner.new_sampler(greedy)]))
            assert sum(len(r.tokens) for r in plan) >= CPU_FA_TILE_ROWS
            result = runner.step(plan)
            assert result.error is None
            answers.append([[s.token for s in samples] for samples in result.samples])
        finally:
            runner.context.close()
    split, together = answers
    assert split == together
    assert all(len(tokens) == 1 for tokens in split)  # every row was sampled, the decode rows too
