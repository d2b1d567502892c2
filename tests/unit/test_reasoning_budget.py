"""The reasoning budget in the scheduler, with the fake runner: after N tokens inside the
reasoning block the closing tokens replace what the model samples, and the answer follows."""

from __future__ import annotations

from llamaserve.engine.reasoning_budget import ReasoningBudget, ReasoningBudgetSpec
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta

from .fake_runner import FakeRunner
from .test_scheduler import Collector, run_until_idle

CLOSE = (900, 901)  # stand-ins for "\n</think>\n\n"


def _run(spec: ReasoningBudgetSpec, script: list[int], pieces: dict[int, bytes]) -> str:
    runner = FakeRunner(n_seq_max=1)
    runner.scripts[(1, 2, 3)] = script
    runner.pieces.update({900: b"\n</think>", 901: b"\n\n", **pieces})
    s = Scheduler(runner, 1)
    c = Collector()
    s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=[1, 2, 3], n_predict=10, reasoning_budget=spec), c)
    run_until_idle(s)
    assert isinstance(c.events[-1], Finished)
    return "".join(e.text for e in c.events if isinstance(e, TextDelta))


def test_a_block_opened_by_the_prompt_closes_after_the_budget() -> None:
    words = {t: f"w{t} ".encode() for t in range(10, 20)}
    text = _run(ReasoningBudgetSpec(3, CLOSE, opened_by_prompt=True), list(range(10, 20)), words)
    # Three reasoning tokens, then the forced close, then the model's tokens again.
    assert text.startswith("w10 w11 w12 \n</think>\n\n"), text
    assert text.count("w") == 10 - 2  # two of the ten generated tokens were the forced ones


def test_a_block_the_model_opens_is_counted_from_its_start_tag() -> None:
    pieces = {5: b"intro ", 6: b"<think>", **{t: f"r{t} ".encode() for t in range(10, 20)}}
    text = _run(ReasoningBudgetSpec(2, CLOSE), [5, 6, 10, 11, 12, 13, 14, 15], pieces)
    assert text.startswith("intro <think>r10 r11 \n</think>\n\n"), text


def test_a_block_the_model_closes_itself_is_left_alone() -> None:
    state = ReasoningBudget(ReasoningBudgetSpec(5, CLOSE, opened_by_prompt=True))
    for piece in ("a", "b", "</think>", "c", "d", "e", "f", "g"):
        state.observe(piece)
        assert state.next_forced() is None
    assert state.done


def test_budget_zero_closes_at_once() -> None:
    state = ReasoningBudget(ReasoningBudgetSpec(0, CLOSE, opened_by_prompt=True))
    assert [state.next_forced(), state.next_forced(), state.next_forced()] == [900, 901, None]


def test_an_unlimited_controlled_block_ends_only_when_asked() -> None:
    """reasoning_control: budget -1 never closes by itself; force_end closes an open block once,
    and does nothing before the block opens or after it closed (llama.cpp's force rule)."""
    state = ReasoningBudget(ReasoningBudgetSpec(-1, CLOSE, control=True))
    assert state.force_end() is False  # not inside a block yet
    state.observe("<think>")
    for _ in range(500):
        state.observe("x")
        assert state.next_forced() is None
    assert state.force_end() is True
    assert [state.next_forced(), state.next_forced(), state.next_forced()] == [900, 901, None]
    assert state.force_end() is False  # already closed


def test_the_engine_ends_the_reasoning_of_the_answer_it_is_asked_for() -> None:
    """EngineClient.end_reasoning on the scheduler thread: the slot whose request carries the
    answer's id gets the closing tokens next, an unarmed or unknown id is told why."""
    import asyncio

    from llamaserve.engine.client import EngineClient

    runner = FakeRunner(n_seq_max=2)
    runner.scripts[(1, 2, 3)] = list(range(10, 40))
    runner.pieces.update({900: b"\n</think>", 901: b"\n\n", **{t: f"r{t} ".encode() for t in range(10, 40)}})
    s = Scheduler(runner, 2)
    armed = ReasoningBudgetSpec(-1, CLOSE, opened_by_prompt=True, control=True)
    req = GenerationRequest(prompt_tokens=[1, 2, 3], n_predict=30, reasoning_budget=armed, completion_id="chatcmpl-a")
    plain = GenerationRequest(prompt_tokens=[1, 2, 3], n_predict=30, completion_id="chatcmpl-b")
    c, other = Collector(), Collector()
    s.submit(s.next_task_id(), req, c)
    s.submit(s.next_task_id(), plain, other)
    s._drain_inbox(block=False)
    for _ in range(6):
        s._step()
    client = EngineClient(s)

    async def main() -> list[tuple[bool, str]]:
        out = []
        for completion_id in ("chatcmpl-a", "chatcmpl-b", "chatcmpl-x"):
            asked = asyncio.ensure_future(client.end_reasoning(completion_id))
            await asyncio.sleep(0)  # the call is in the scheduler's inbox
            s._drain_inbox(block=False)  # the scheduler runs it between two steps
            out.append(await asked)
        return out

    answers = asyncio.run(main())
    run_until_idle(s)
    assert answers == [
        (True, ""),
        (False, "reasoning control not enabled for this completion"),
        (False, "no active completion for this id"),
    ]
    text = "".join(e.text for e in c.events if isinstance(e, TextDelta))
    assert "\n</think>\n\n" in text
